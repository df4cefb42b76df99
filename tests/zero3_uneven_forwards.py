"""Worker for test_trl_zero3.py: two DeepSpeed ZeRO-3 ranks (CPU accelerator, gloo) make uneven numbers of forward
passes inside TRL's ``unwrap_model_for_generation`` steps, as a multi-turn rollout does when one rank's episodes
end first, then train one step together. Run with ``python -m torch.distributed.run --nproc_per_node 2``.

``--without-fix`` leaves ``trl_env.zero3_forwards_stay_local`` out, to see the hang it prevents.
"""

from __future__ import annotations

import contextlib
import sys

import deepspeed
import torch
import torch.distributed as dist
from transformers import Qwen3Config, Qwen3ForCausalLM
from trl.models.utils import add_hooks, remove_hooks

from acl_lib.train.trl_env import zero3_forwards_stay_local


def main() -> None:
    fix = "--without-fix" not in sys.argv
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, num_key_value_heads=1, head_dim=16))
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
              "optimizer": {"type": "SGD", "params": {"lr": 1e-3}}, "zero_allow_untested_optimizer": True}
    engine, *_ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    for step in range(2):  # two rollouts and two training steps: the hooks and the trace come back each time
        # what unwrap_model_for_generation(gather_deepspeed3_params=True) does, with the rank's own forward count
        with deepspeed.zero.GatheredParameters(engine.parameters()):
            remove_hooks(engine)
            with zero3_forwards_stay_local(engine) if fix else contextlib.nullcontext():
                with torch.no_grad():
                    for _ in range(1 + 3 * rank):  # rank 0: one turn; rank 1: four
                        engine.module(ids)
            add_hooks(engine)
        loss = engine(ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        print(f"rank {rank} step {step} loss {loss.item():.4f}", flush=True)
    dist.barrier()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
