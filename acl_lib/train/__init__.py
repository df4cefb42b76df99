"""Training: base pretraining, rejection-sampled SFT, GRPO, the stage recipe and the launcher.

    pretrain.py         train_pretrain(cfg, model_dir, corpus, run)        causal-LM pretraining (HF Trainer)
    sft.py              collect_demos(env, policy, tasks) / train_sft(cfg, model_dir, rows, run)   TRL SFTTrainer
    grpo.py             train_grpo(cfg, model_dir, domain, run)            TRL GRPOTrainer
    trl_env.py          our Environment/Episode <-> TRL (reward function, rollout_func, environment_factory)
    stage.py            run_stage(cfg, domain, init_model_dir, run)        the per-stage recipe (demos: sft.teacher)
    launcher.py         launch(cfg, job, run, **job_args)                  in-process / deepspeed / multi-node
    entry.py            python -m acl_lib.train.entry                      worker entry point of launched jobs
    common.py           trainer arguments, jsonl logging, checkpoints, final save
    deepspeed_configs/  zero2_cpu.json, zero3_bf16.json

Names are imported lazily: ``import acl_lib.train`` loads neither torch nor transformers.
"""

from __future__ import annotations

_EXPORTS = {
    "train_pretrain": "acl_lib.train.pretrain",
    "collect_demos": "acl_lib.train.sft",
    "train_sft": "acl_lib.train.sft",
    "train_grpo": "acl_lib.train.grpo",
    "run_stage": "acl_lib.train.stage",
    "launch": "acl_lib.train.launcher",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'acl_lib.train' has no attribute {name!r}")
