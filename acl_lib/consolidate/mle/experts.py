"""MLE's experts: from the frozen backbone (``sdft_base/model``: SDFT's union SFT'd from the base;
``start="base"``: the base itself, the ablation), one PEFT LoRA adapter per domain (``mle.rank``, ``mle.alpha``,
``mle.dropout``, ``mle.target_modules``), trained as the study's LoRA-RL experts: GRPO in the domain's world
(TRL's ``GRPOTrainer`` through ``peft_config``, the stages' multi-turn rollouts, ``trl_env``) with the domain's
stage settings (``cfg.for_stage(d)``). With ``mle.cold_start`` (off by default), the domains whose stage has a
cold start (``pipeline.cold_start[d]``) first get a LoRA-SFT cold start on the scripted expert's
rejection-sampled demos (TRL's ``SFTTrainer`` with ``peft_config``), which the GRPO phase continues.
The budgets are ``mle``'s (``num_demos``, ``sft_max_steps``, ``grpo_max_steps``, learning rates,
``stage_overrides``), far below a stage's. After training, every backbone tensor in memory is compared with the
backbone's file bit for bit (``torch.equal``) and the files' SHA-256 before and after are recorded
(``expert.json``); ``backbone_check`` repeats the comparison after all four experts with every adapter attached
(``load_routed_model``). Each adapter is saved in PEFT format (``<run>/adapter``: ``adapter_config.json`` +
``adapter_model.safetensors``).

``train_lora_sft`` and ``train_lora_grpo`` are the launcher's jobs ``lora_sft`` / ``lora_grpo``
(``acl_lib.train.launcher.JOBS``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from acl_lib import pipeline
from acl_lib.atomic import atomic_dir, write_json
from acl_lib.consolidate.mle.specs import (
    ADAPTER_DIR,
    EXPERT_JSON,
    MLESpec,
    adapter_dirs,
    expert_cfg,
    expert_cold_start,
    expert_run,
    lora_config,
    lora_kwargs,
    start_run,
)
from acl_lib.envs import STAGE_ENV, scripted_expert
from acl_lib.model.checkpoint_files import resolve_model_dir, safetensors_index
from acl_lib.runs import run_once
from acl_lib.steps import require_complete
from acl_lib.train import common, sft, trl_env
from acl_lib.train.grpo import build_trainer
from acl_lib.train.launcher import launch
from acl_lib.train.stage import demo_tasks

if TYPE_CHECKING:
    from acl_lib.config import Config

TRAIN_SUMMARY = common.TRAIN_SUMMARY  # each job's summary (train_summary.json)
SFT_SUBDIR = "checkpoints/sft"  # the cold start's job directory inside an expert's run
GRPO_SUBDIR = "checkpoints/grpo"  # the GRPO job's


def file_digests(model_dir) -> dict[str, str]:
    """SHA-256 of every weight file of a checkpoint."""
    d = Path(resolve_model_dir(model_dir))
    out = {}
    for p in sorted(d.glob("*.safetensors")):
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        out[p.name] = h.hexdigest()
    return out


def backbone_tensors_equal(peft_model, model_dir) -> dict:
    """Compare every backbone tensor of ``peft_model`` (LoRA layers' ``base_layer`` included) with the checkpoint
    ``model_dir`` bit for bit. Returns ``{"equal": bool, "tensors": n, "differing": [...]}``."""
    import torch
    from safetensors import safe_open

    index = safetensors_index(resolve_model_dir(model_dir))
    state = {}
    base = peft_model.get_base_model() if hasattr(peft_model, "get_base_model") else peft_model
    for name, t in base.state_dict().items():
        if "lora_" in name:
            continue
        state[name.replace(".base_layer.", ".")] = t
    differing, n = [], 0
    handles = {}
    for name, file in index.items():
        if file not in handles:
            handles[file] = safe_open(str(file), "pt")
        ref = handles[file].get_tensor(name)
        mine = state.get(name)
        n += 1
        if mine is None or mine.shape != ref.shape or not torch.equal(mine.detach().cpu().to(ref.dtype), ref):
            differing.append(name)
    return {"equal": not differing, "tensors": n, "differing": differing[:10]}


def _in_memory_check(trainer, backbone_dir) -> dict:
    """``backbone_tensors_equal`` on the trained model as the job holds it (one process without ZeRO: every
    backbone tensor whole in memory); under DeepSpeed the parameters are shards, so the check is left to the
    saved adapter's (``train_expert``)."""
    if trainer.is_deepspeed_enabled or trainer.args.world_size > 1:
        return {"backbone_unchanged_in_memory": None}
    check = backbone_tensors_equal(trainer.model, backbone_dir)
    if not check["equal"]:
        raise RuntimeError(f"the backbone changed while the adapter trained: {check['differing']}")
    return {"backbone_unchanged_in_memory": True}


def train_lora_sft(cfg: Config, backbone_dir, dataset, out_dir, rank: int | None = None) -> dict:
    """The launcher's job ``lora_sft``: the LoRA-SFT cold start of an expert (TRL ``SFTTrainer`` with
    ``peft_config``) on chat rows (a jsonl path) into ``<out_dir>/model`` (the adapter, PEFT format). ``cfg`` is the
    expert's recipe (``expert_cfg``). Resumes from ``<out_dir>/checkpoints`` after a crash; returns the summary."""
    from datasets import Dataset
    from trl import SFTTrainer

    common.set_threads(cfg)
    rows = sft.read_rows(dataset)
    if not rows:
        raise ValueError("no LoRA-SFT rows: rejection sampling kept nothing")
    model, tok = common.load_model_and_tokenizer(backbone_dir, cfg)
    log = common.make_jsonl_logger(Path(out_dir) / common.TRAIN_LOG, extra={"job": "lora_sft"})
    cls = sft._prefix_shared_trainer() if cfg.sft.share_prefix else SFTTrainer
    trainer = cls(model=model, args=sft.sft_args(cfg, out_dir), train_dataset=Dataset.from_list(rows),
                  processing_class=tok, callbacks=[log], peft_config=lora_config(cfg, rank))
    common.show_progress(trainer, "mle sft")
    t0 = time.perf_counter()
    trainer.train(resume_from_checkpoint=common.last_checkpoint(out_dir))
    wall = time.perf_counter() - t0
    common.save_final_model(trainer, tok, out_dir)  # a PEFT model saves its adapter only
    summary = common.summarize(common.read_log(Path(out_dir) / common.TRAIN_LOG), wall, job="lora_sft",
                               rows_per_step=cfg.sft.batch_size,
                               rows=len(rows), **_in_memory_check(trainer, backbone_dir),
                               **common.distributed_info(trainer))
    return common.write_summary(trainer, out_dir, summary)


def train_lora_grpo(cfg: Config, backbone_dir, domain: str, out_dir, init_adapter=None,
                    rank: int | None = None) -> dict:
    """The launcher's job ``lora_grpo``: GRPO on a LoRA adapter of the frozen backbone with the stages' rollouts
    (``grpo.build_trainer``'s recipe), continuing ``init_adapter`` (the cold start's) or a fresh adapter through
    TRL's ``peft_config``; the adapter goes to ``<out_dir>/model``. Resumes from ``<out_dir>/checkpoints``."""
    common.set_threads(cfg)
    env = trl_env.make_env(domain, cfg)
    tasks = env.tasks("train", cfg.worlds.n_train, seed=cfg.seed)
    peft_kw, model, tok = {}, None, None
    if init_adapter is not None:
        from peft import PeftModel

        backbone, tok = common.load_model_and_tokenizer(backbone_dir, cfg)
        model = PeftModel.from_pretrained(backbone, str(init_adapter), is_trainable=True)
    else:
        peft_kw["peft_config"] = lora_config(cfg, rank)
    multi = trl_env.is_multi_turn(tasks)
    log = common.make_jsonl_logger(Path(out_dir) / common.TRAIN_LOG, extra={"job": "lora_grpo", "domain": domain})
    # the stages' GRPO recipe and rollouts (grpo.build_trainer), on the adapter
    trainer = build_trainer(cfg, backbone_dir, env, tasks, out_dir, callbacks=[log], model=model, tokenizer=tok,
                            **peft_kw)
    tok = trainer.processing_class
    common.show_progress(trainer, "mle grpo")
    t0 = time.perf_counter()
    trainer.train(resume_from_checkpoint=common.last_checkpoint(out_dir))
    wall = time.perf_counter() - t0
    common.save_final_model(trainer, tok, out_dir)
    summary = common.summarize(common.read_log(Path(out_dir) / common.TRAIN_LOG), wall, job="lora_grpo",
                               rollouts_per_step=cfg.grpo.batch_size, num_generations=cfg.grpo.num_generations,
                               domain=domain, tasks=len(tasks), multi_turn=multi,
                               **_in_memory_check(trainer, backbone_dir), **common.distributed_info(trainer))
    return common.write_summary(trainer, out_dir, summary)


def train_expert(cfg: Config, domain: str, backbone_dir, out_dir, rank: int | None = None) -> dict:
    """One expert into ``<out_dir>/adapter`` (module docstring); returns ``expert.json``'s content.

    The cold start and the GRPO phase are launcher jobs (``lora_sft``, ``lora_grpo``: in process, on several
    processes under DeepSpeed, or on several nodes, as ``cfg.launcher`` says, like the stages'). A restart after a
    crash skips a finished phase (its ``model/`` exists) and resumes an unfinished one from its last checkpoint.
    """
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    ecfg = expert_cfg(cfg, domain)
    before = file_digests(backbone_dir)
    info: dict = {"domain": domain, "backbone": str(backbone_dir), "lora": lora_kwargs(cfg, rank),
                  "cold_start": expert_cold_start(ecfg, domain)}
    init = None
    if info["cold_start"] and ecfg.sft.max_steps > 0:
        sft_dir = out_dir / SFT_SUBDIR
        if not (sft_dir / "model").exists():
            env = trl_env.make_env(domain, ecfg)
            rows, stats = sft.collect_demos(env, scripted_expert(STAGE_ENV.get(domain, domain)),
                                            demo_tasks(env, ecfg), max_turns=ecfg.grpo.max_turns,
                                            num_demos=ecfg.sft.num_demos)
            write_json(sft_dir / "demos.json", stats)
            launch(ecfg, "lora_sft", sft_dir, backbone_dir=str(backbone_dir),
                   dataset=str(sft.write_rows(rows, sft_dir / "demos.jsonl")), rank=rank)
        info["demos"] = json.loads((sft_dir / "demos.json").read_text())
        init = sft_dir / "model"
        info["sft_steps"] = ecfg.sft.max_steps
    if ecfg.grpo.max_steps > 0:
        grpo_dir = out_dir / GRPO_SUBDIR
        if not (grpo_dir / "model").exists():
            launch(ecfg, "lora_grpo", grpo_dir, backbone_dir=str(backbone_dir), domain=domain,
                   init_adapter=str(init) if init is not None else None, rank=rank)
        final = grpo_dir / "model"
        info["grpo_steps"] = ecfg.grpo.max_steps
    elif init is not None:
        final = init
    else:  # no training at all: an untrained (zero-delta) adapter
        from peft import get_peft_model

        final = out_dir / "checkpoints" / "untrained"
        model, _ = common.load_model_and_tokenizer(backbone_dir, ecfg)
        with atomic_dir(final) as tmp:
            get_peft_model(model, lora_config(cfg, rank)).save_pretrained(str(tmp))
    with atomic_dir(out_dir / ADAPTER_DIR) as tmp:  # the adapter alone, in PEFT format
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            shutil.copy2(final / name, tmp / name)
    # the jobs compared the backbone in their own memory after training (one process); here the saved adapter is
    # attached to the backbone's files and every base tensor compared again
    jobs = [json.loads((d / TRAIN_SUMMARY).read_text()) for d in (out_dir / SFT_SUBDIR, out_dir / GRPO_SUBDIR)
            if (d / TRAIN_SUMMARY).is_file()]
    info["jobs_backbone_unchanged_in_memory"] = [j.get("backbone_unchanged_in_memory") for j in jobs]
    model, _ = load_routed_model(backbone_dir, {domain: out_dir / ADAPTER_DIR})
    check = backbone_tensors_equal(model, backbone_dir)
    after = file_digests(backbone_dir)
    info.update(backbone_unchanged_in_memory=check["equal"], backbone_tensors=check["tensors"],
                backbone_differing=check["differing"], backbone_files_before=before, backbone_files_after=after,
                backbone_files_unchanged=before == after, trainable_parameters=lora_parameters(model),
                wall_s=round(time.perf_counter() - t0, 2))
    if not (check["equal"] and before == after):
        raise RuntimeError(f"expert {domain}: the backbone changed ({check['differing']}, files {before != after})")
    return info


def lora_parameters(model) -> int:
    return int(sum(p.numel() for n, p in model.named_parameters() if "lora_" in n))


def run_expert(cfg: Config, spec: MLESpec, domain: str):
    run = expert_run(cfg, spec, domain)
    require_complete(run.inputs, f"MLE expert {run.name}")
    backbone = pipeline.model_dir(run.inputs[0])

    def fn(r) -> None:
        r.checkpoint_dir()
        info = train_expert(cfg, domain, backbone, r.path, spec.rank)
        info["start_run"] = run.inputs[0].name
        r.write_json(EXPERT_JSON, info)
        r.logger.info("mle expert %s: %d LoRA parameters, backbone unchanged %s, %.1f s", domain,
                      info["trainable_parameters"], info["backbone_unchanged_in_memory"], info["wall_s"])

    return run_once(run, fn)


def run_experts(cfg: Config, spec: MLESpec) -> dict:
    """Every domain's expert of ``spec`` (each skipped when complete). Returns ``{domain: run}``."""
    return {d: run_expert(cfg, spec, d) for d in cfg.pipeline.curriculum}


def backbone_check(cfg: Config, spec: MLESpec) -> dict:
    """After all experts: the backbone file digests every expert recorded, and the in-memory backbone of one
    model with every adapter attached, compared with the checkpoint bit for bit."""
    backbone = pipeline.model_dir(start_run(cfg, spec.start))
    now = file_digests(backbone)
    recorded = {d: expert_run(cfg, spec, d).read_json(EXPERT_JSON) for d in cfg.pipeline.curriculum}
    model, _ = load_routed_model(backbone, adapter_dirs(cfg, spec), cfg.model.dtype)
    mem = backbone_tensors_equal(model, backbone)
    same_files = all(r["backbone_files_before"] == now and r["backbone_files_after"] == now for r in recorded.values())
    return {"files_unchanged": same_files, "in_memory_equal": mem["equal"], "tensors": mem["tensors"],
            "digests": now,
            "experts_in_memory_equal": {d: r["backbone_unchanged_in_memory"] for d, r in recorded.items()}}


def load_routed_model(backbone_dir, adapters: Mapping[str, str | Path], dtype: str = "float32", device=None):
    """The backbone with every adapter attached by name (``PeftModel.from_pretrained`` + ``load_adapter``);
    ``(model, tokenizer)``."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(backbone_dir))
    base = AutoModelForCausalLM.from_pretrained(str(backbone_dir), dtype=getattr(torch, dtype))
    if device is not None:
        base = base.to(device)
    names = list(adapters)
    model = PeftModel.from_pretrained(base, str(adapters[names[0]]), adapter_name=names[0])
    for n in names[1:]:
        model.load_adapter(str(adapters[n]), adapter_name=n)
    model.eval()
    return model, tok
