"""What MLE costs: LoRA parameters per expert and in total against the backbone, memory, and the generation
latency of the routed model (one batch of mixed experts) against the backbone alone and one expert merged
(``measure``; ``<spec>_measure/measurements.json``)."""

from __future__ import annotations

import hashlib
import json
import resource
import time
from typing import TYPE_CHECKING

from acl_lib import pipeline
from acl_lib.consolidate.mle.experts import load_routed_model
from acl_lib.consolidate.mle.routers import Router, benchmark_tasks, make_router
from acl_lib.consolidate.mle.specs import (
    BASE_ADAPTER,
    MEASURE_JSON,
    MLESpec,
    adapter_dirs,
    mle_run,
    start_run,
)
from acl_lib.envs import IN_DOMAIN
from acl_lib.eval.policies import eval_device
from acl_lib.runs import Run, run_once
from acl_lib.seeding import threads_per_rank
from acl_lib.steps import require_complete

if TYPE_CHECKING:
    from acl_lib.config import Config


def _nbytes(params) -> int:
    return int(sum(p.numel() * p.element_size() for p in params))


def _timed_generate(model, tok, prompts, new_tokens: int, repeats: int, **kw) -> dict:
    import torch

    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(next(model.parameters()).device)
    times = []
    out = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id, **kw)
        times.append(time.perf_counter() - t0)
    n = len(prompts) * new_tokens
    best = min(times)
    return {"seconds": [round(t, 4) for t in times], "best_s": round(best, 4), "tokens": n,
            "tokens_per_s": round(n / best, 2), "sequences": out[:, enc["input_ids"].shape[1]:].tolist()}


def measure(cfg: Config, spec: MLESpec, router: Router | None = None) -> dict:
    """Parameters (LoRA rank, extra parameters per expert and in total, share of the backbone), memory
    (parameter bytes; peak RSS) and generation latency / throughput of the routed model (mixed experts, one
    batch), the backbone alone and one expert merged (``merge_and_unload``), on the same batch in this run."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    m = cfg.mle
    device = eval_device()
    backbone = pipeline.model_dir(start_run(cfg, spec.start))
    adapters = adapter_dirs(cfg, spec)
    router = router or make_router(cfg, spec.router)
    model, tok = load_routed_model(backbone, adapters, cfg.model.dtype, device)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    base_params = sum(p.numel() for n, p in model.named_parameters() if "lora_" not in n)
    per = {}
    for d in adapters:
        n = sum(p.numel() for name, p in model.named_parameters() if "lora_" in name and f".{d}." in name)
        per[d] = {"rank": int(model.peft_config[d].r), "parameters": int(n), "share_of_backbone": n / base_params}
    extra = sum(v["parameters"] for v in per.values())
    # the batch: the first contexts of the in-domain benchmarks, cycled
    tasks = benchmark_tasks(cfg)
    opening = [tasks[IN_DOMAIN[d]][0] for d in cfg.pipeline.curriculum if tasks.get(IN_DOMAIN[d])]
    batch = [opening[i % len(opening)] for i in range(m.latency_batch)]
    prompts = [tok.apply_chat_template(t.initial_messages(), tools=t.tools or None, add_generation_prompt=True,
                                       tokenize=False) for t in batch]
    experts = [router.route_task(t) for t in batch]
    names = [d if d in adapters else BASE_ADAPTER for d in experts]
    set_threads = torch.set_num_threads
    set_threads(threads_per_rank(cfg.torch_threads))
    routed = _timed_generate(model, tok, prompts, m.latency_new_tokens, m.latency_repeats, adapter_names=names)

    def fresh():
        return AutoModelForCausalLM.from_pretrained(str(backbone), dtype=getattr(torch, cfg.model.dtype)).to(device)

    plain = fresh().eval()
    alone = _timed_generate(plain, tok, prompts, m.latency_new_tokens, m.latency_repeats)
    one = experts[0] if experts[0] in adapters else next(iter(adapters))
    merged = PeftModel.from_pretrained(fresh(), str(adapters[one])).merge_and_unload().eval()
    merged_t = _timed_generate(merged, tok, prompts, m.latency_new_tokens, m.latency_repeats)
    # the routed batch of one expert only must equal that expert merged (same greedy tokens, up to rounding)
    same_one = _timed_generate(model, tok, prompts, m.latency_new_tokens, 1, adapter_names=[one] * len(prompts))
    for r in (routed, alone, merged_t, same_one):
        r["sequences_hash"] = hashlib.sha256(json.dumps(r.pop("sequences")).encode()).hexdigest()[:12]
    return {
        "backbone": str(backbone), "backbone_parameters": int(base_params),
        "experts": per, "extra_parameters_total": int(extra), "extra_share_total": extra / base_params,
        "memory": {"backbone_bytes": _nbytes(plain.parameters()),
                   "adapters_bytes": _nbytes(p for n, p in model.named_parameters() if "lora_" in n),
                   "routed_model_bytes": _nbytes(model.parameters()), "merged_bytes": _nbytes(merged.parameters()),
                   "four_full_models_bytes": 4 * _nbytes(plain.parameters()),
                   "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)},
        "latency": {"batch": len(prompts), "new_tokens": m.latency_new_tokens, "experts_in_batch": experts,
                    "merged_expert": one, "routed": routed, "backbone": alone, "merged": merged_t,
                    "routed_one_expert": same_one,
                    # one expert through adapter_names vs the same expert merged: the same greedy tokens (merging
                    # rounds the weights once, so a near-tie may differ at low precision)
                    "one_expert_same_tokens_as_merged": same_one["sequences_hash"] == merged_t["sequences_hash"],
                    "routed_over_backbone": routed["best_s"] / alone["best_s"],
                    "routed_over_merged": routed["best_s"] / merged_t["best_s"]},
    }


def measure_run(cfg: Config, spec: MLESpec):
    m = cfg.mle
    extra = {"spec": spec.name, "latency": [m.latency_batch, m.latency_new_tokens, m.latency_repeats]}
    return Run(cfg, f"{spec.name}_measure", sections=("worlds",), inputs=[mle_run(cfg, spec)], extra=extra)


def run_measurements(cfg: Config, spec: MLESpec) -> dict:
    run = measure_run(cfg, spec)
    require_complete(run.inputs, "MLE measurements (run_mle first)")
    run_once(run, lambda r: r.write_json(MEASURE_JSON, measure(cfg, spec)))
    return run.read_json(MEASURE_JSON)
