"""MLE, modular LoRA experts (notebook 11): a frozen backbone, one RL-trained LoRA expert per domain, routed by
the agent's execution context.

    start = default_start(cfg)                        # "sdft_base" (notebook 09), else "base" where 09 kept no data
    experts = run_experts(cfg, MLESpec("mle", start=start))   # mle_expert_<d>/adapter (PEFT), expert.json
    router = run_router(cfg)                          # mle_router/router.pt + router.json (accuracies, confusion)
    run_mle(cfg, MLESpec("mle", start=start))         # context router -> mle/eval/metrics.json (whole suite)
    run_mle(cfg, MLESpec("mle_learned", start=start, router="learned"))
    run_measurements(cfg, spec)                       # mle_measure/measurements.json (parameters, latency, memory)
    run_stress(cfg, spec)                             # mle_stress/stress.json (ambiguous, switch, two skills)

**Experts** (``run_expert``): from the frozen backbone (``sdft_base/model``: SDFT's union SFT'd from the base;
``start="base"``: the base itself, the ablation), one PEFT LoRA adapter per domain (``mle.rank``, ``mle.alpha``,
``mle.dropout``, ``mle.target_modules``), trained with the domain's stage recipe (``cfg.for_stage(d)``): where
``pipeline.cold_start[d]`` says so, a LoRA-SFT cold start on the scripted expert's rejection-sampled demos
(TRL's ``SFTTrainer`` with ``peft_config``), then GRPO in the domain's world (TRL's ``GRPOTrainer``, the stages'
multi-turn rollouts, ``trl_env``) continuing that adapter (or, without a cold start, through ``peft_config``).
The budgets are ``mle``'s (``num_demos``, ``sft_max_steps``, ``grpo_max_steps``, learning rates,
``stage_overrides``), far below a stage's. After training, every backbone tensor in memory is compared with the
backbone's file bit for bit (``torch.equal``) and the files' SHA-256 before and after are recorded
(``expert.json``); ``backbone_check`` repeats the comparison after all four experts with every adapter attached.
Each adapter is saved in PEFT format (``<run>/adapter``: ``adapter_config.json`` + ``adapter_model.safetensors``).

**Routers**: one interface (``route(context) -> domain``) over a ``Context`` (system prompt, tool schemas, the
first user turn: what the agent is shown; never a task's id, benchmark, answer or meta):

* ``ContextRouter``: a rule. Tool schemas offered: a ``search`` tool and nothing else that acts -> search; any
  other tool set (a desk's) -> ecom. No tools: a system prompt of a desk or of a search engine -> that; an output
  contract of the form ``Answer: $...`` (the math prompts' last-line format) -> math; else ``mle.fallback`` (if).
* ``LearnedRouter``: multinomial logistic regression (torch) on hashed bag-of-words and bigram counts
  (``mle.router_features`` buckets, log(1 + count), L2-normalised) of the same context text, trained on
  ``mle.router_train`` training-split contexts per stage world and scored on ``mle.router_heldout`` others of
  the same split (ids and texts disjoint from the training ones, asserted).

**Serving** (``MLEPolicy``): one backbone, every adapter attached by name (``PeftModel.load_adapter``); the router
decides once per episode, from its first context; a batch whose episodes need different experts is one
``generate`` per step with PEFT's per-row ``adapter_names`` (``RoutedTurnGenerator``: the evaluator's
``TurnGenerator`` with per-episode KV caches, the shared first prefix encoded per expert). ``reroute=True``
decides again at every turn (the mid-episode change) and drops the episode's cache when the expert changes.
``VLLMMLEPolicy``: the paper profile's path, vLLM multi-LoRA (``enable_lora``, one ``LoRARequest`` per
request); its arguments are built by ``vllm_lora_engine_args`` / ``lora_requests`` (tested without vLLM).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import resource
import time
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

logger = logging.getLogger("acl.consolidate.mle")

ROUTER_SEED = 7919  # + cfg.seed: the training-split contexts the learned router trains and is held out on
ADAPTER_DIR = "adapter"
EXPERT_JSON = "expert.json"
ROUTER_RUN = "mle_router"
ROUTER_FILE = "router.pt"
ROUTER_JSON = "router.json"
MLE_JSON = "mle.json"
MEASURE_JSON = "measurements.json"
STRESS_JSON = "stress.json"
EXPERT_SECTIONS = ("model", "worlds")  # + the expert's resolved recipe, the LoRA settings (extra)
ROUTERS = ("context", "learned")
STARTS = ("sdft_base", "base")
BASE_ADAPTER = "__base__"  # PEFT's adapter name for "no adapter" in ``adapter_names``
LABEL_FIELDS = ("id", "benchmark", "answer", "meta", "domain")  # what a router must never read


# --- specs -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MLESpec:
    """One MLE system: its run name, the backbone its experts start from, the router and the LoRA rank
    (None: ``mle.rank``). The experts of a spec are ``expert_name(spec, d)``."""

    name: str = "mle"
    start: str = "sdft_base"
    router: str = "context"
    rank: int | None = None

    def __post_init__(self):
        if self.start not in STARTS:
            raise ValueError(f"MLE {self.name}: start must be one of {list(STARTS)}, got {self.start!r}")
        if self.router not in ROUTERS:
            raise ValueError(f"MLE {self.name}: router must be one of {list(ROUTERS)}, got {self.router!r}")

    def expert_prefix(self, cfg) -> str:
        """``mle`` for the default experts; ``mle_r<k>`` for another rank; ``mle_frombase`` (+ rank) from the base."""
        p = "mle"
        if self.start == "base":
            p += "_frombase"
        if self.rank is not None and self.rank != cfg.mle.rank:
            p += f"_r{self.rank}"
        return p


def expert_name(cfg, spec: MLESpec, domain: str) -> str:
    return f"{spec.expert_prefix(cfg)}_expert_{domain}"


def ablation_specs(cfg, ranks: bool = True, from_base: bool = True, start: str = "sdft_base") -> list[MLESpec]:
    """The ablations notebook 11 runs behind its flags, each with the context router: every rank of
    ``mle.ablation_ranks`` other than ``mle.rank`` (``mle_r<k>``) and experts trained from the base
    (``mle_frombase``)."""
    specs = []
    if ranks:
        specs += [MLESpec(f"mle_r{r}", start=start, rank=r) for r in cfg.mle.ablation_ranks if r != cfg.mle.rank]
    if from_base and start != "base":
        specs.append(MLESpec("mle_frombase", start="base"))
    return specs


def lora_kwargs(cfg, rank: int | None = None) -> dict:
    """``peft.LoraConfig`` keyword arguments of an expert."""
    m = cfg.mle
    r = int(rank or m.rank)
    return {"r": r, "lora_alpha": float(m.alpha), "lora_dropout": float(m.dropout),
            "target_modules": list(m.target_modules), "bias": "none", "task_type": "CAUSAL_LM"}


def lora_config(cfg, rank: int | None = None):
    from peft import LoraConfig

    return LoraConfig(**lora_kwargs(cfg, rank))


def expert_cfg(cfg, domain: str):
    """The domain's stage recipe (``cfg.for_stage``) with ``mle``'s budgets and ``mle.stage_overrides[domain]``."""
    from acl_lib.config import Config, ConfigError, _set_dotted, parse_override

    tree = cfg.for_stage(domain).to_dict()
    m = cfg.mle
    tree["sft"]["num_demos"] = min(tree["sft"]["num_demos"], m.num_demos)
    tree["sft"]["max_steps"] = m.sft_max_steps
    tree["sft"]["learning_rate"] = m.sft_learning_rate
    tree["grpo"]["max_steps"] = m.grpo_max_steps
    tree["grpo"]["learning_rate"] = m.grpo_learning_rate
    for item in m.stage_overrides.get(domain, []):
        key, value = parse_override(item)
        _set_dotted(tree, key, value, f"mle.stage_overrides.{domain}")
    try:
        return Config.model_validate(tree)
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"invalid MLE expert recipe for {domain}: {exc}") from None


# --- runs --------------------------------------------------------------------------------------------------


def start_run(cfg, start: str):
    """The backbone's run: ``sdft_base`` (``acl_lib.consolidate.sdft``) or the base."""
    from acl_lib import pipeline

    if start == "base":
        return pipeline.base_run(cfg)
    from acl_lib.consolidate.sdft import SDFTSpec, sdft_run

    return sdft_run(cfg, SDFTSpec("sdft_base", start="base"))


def default_start(cfg, fallback: bool = True) -> str:
    """``sdft_base`` when that run is complete; else (``fallback``) ``base`` with a warning (notebook 09 trains no
    ``sdft_base`` where its filter kept nothing: the untrained oracles of the smoke profile), else an error."""
    if start_run(cfg, "sdft_base").is_complete():
        return "sdft_base"
    if not fallback:
        raise RuntimeError("MLE needs the complete run sdft_base (notebook 09)")
    logger.warning("sdft_base is not complete (notebook 09 kept no data or has not run): the MLE experts start "
                   "from the base")
    return "base"


def expert_run(cfg, spec: MLESpec, domain: str):
    from acl_lib.runs import Run

    ecfg = expert_cfg(cfg, domain)
    extra = {"domain": domain, "lora": lora_kwargs(cfg, spec.rank), "start": spec.start,
             "cold_start": bool(cfg.pipeline.cold_start.get(domain)),
             "sft": ecfg.sft.model_dump(), "grpo": ecfg.grpo.model_dump(), "seed": cfg.seed}
    return Run(cfg, expert_name(cfg, spec, domain), sections=EXPERT_SECTIONS, inputs=[start_run(cfg, spec.start)],
               extra=extra)


def router_run(cfg):
    from acl_lib.runs import Run

    m = cfg.mle
    extra = {k: getattr(m, k) for k in ("router_train", "router_heldout", "router_features", "router_steps",
                                        "router_l2")}
    extra["seed"] = cfg.seed
    return Run(cfg, ROUTER_RUN, sections=("worlds",), inputs=[], extra=extra)


def mle_run(cfg, spec: MLESpec):
    from acl_lib.runs import Run

    inputs = [start_run(cfg, spec.start)] + [expert_run(cfg, spec, d) for d in cfg.pipeline.curriculum]
    if spec.router == "learned":
        inputs.append(router_run(cfg))
    extra = {"router": spec.router, "fallback": cfg.mle.fallback}
    return Run(cfg, spec.name, sections=("model",), inputs=inputs, extra=extra)


def _require(runs, what: str) -> None:
    missing = [r for r in runs if not r.is_complete()]
    if missing:
        lines = "; ".join(f"{r.name} ({r.status()}, {r.path})" for r in missing)
        raise RuntimeError(f"{what} needs complete runs: missing {lines}")


# --- training ----------------------------------------------------------------------------------------------


def file_digests(model_dir) -> dict[str, str]:
    """SHA-256 of every weight file of a checkpoint."""
    from acl_lib.diagnostics.weights import resolve_model_dir

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

    from acl_lib.diagnostics.weights import resolve_model_dir, safetensors_index

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


def train_lora_sft(cfg, backbone_dir, dataset, out_dir, rank: int | None = None) -> dict:
    """The launcher's job ``lora_sft``: the LoRA-SFT cold start of an expert (TRL ``SFTTrainer`` with
    ``peft_config``) on chat rows (a jsonl path) into ``<out_dir>/model`` (the adapter, PEFT format). ``cfg`` is the
    expert's recipe (``expert_cfg``). Resumes from ``<out_dir>/checkpoints`` after a crash; returns the summary."""
    from datasets import Dataset
    from trl import SFTTrainer

    from acl_lib.train import common, sft

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
                               rows=len(rows), **_in_memory_check(trainer, backbone_dir),
                               **common.distributed_info(trainer))
    return common.write_summary(trainer, out_dir, summary)


def train_lora_grpo(cfg, backbone_dir, domain: str, out_dir, init_adapter=None, rank: int | None = None) -> dict:
    """The launcher's job ``lora_grpo``: GRPO on a LoRA adapter of the frozen backbone with the stages' rollouts
    (``grpo.build_trainer``'s recipe), continuing ``init_adapter`` (the cold start's) or a fresh adapter through
    TRL's ``peft_config``; the adapter goes to ``<out_dir>/model``. Resumes from ``<out_dir>/checkpoints``."""
    from acl_lib.train import common, trl_env
    from acl_lib.train.grpo import build_trainer

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
                               domain=domain, tasks=len(tasks), multi_turn=multi,
                               **_in_memory_check(trainer, backbone_dir), **common.distributed_info(trainer))
    return common.write_summary(trainer, out_dir, summary)


TRAIN_SUMMARY = "train_summary.json"  # = acl_lib.train.common.TRAIN_SUMMARY
SFT_SUBDIR = "checkpoints/sft"  # the cold start's job directory inside an expert's run
GRPO_SUBDIR = "checkpoints/grpo"  # the GRPO job's


def train_expert(cfg, domain: str, backbone_dir, out_dir, rank: int | None = None) -> dict:
    """One expert into ``<out_dir>/adapter`` (module docstring); returns ``expert.json``'s content.

    The cold start and the GRPO phase are launcher jobs (``lora_sft``, ``lora_grpo``: in process, on several
    processes under DeepSpeed, or on several nodes, as ``cfg.launcher`` says, like the stages'). A restart after a
    crash skips a finished phase (its ``model/`` exists) and resumes an unfinished one from its last checkpoint.
    """
    import shutil

    from acl_lib.atomic import atomic_dir, write_json
    from acl_lib.envs import STAGE_ENV, scripted_expert
    from acl_lib.train import sft, trl_env
    from acl_lib.train.launcher import launch
    from acl_lib.train.stage import demo_tasks

    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    ecfg = expert_cfg(cfg, domain)
    before = file_digests(backbone_dir)
    info: dict = {"domain": domain, "backbone": str(backbone_dir), "lora": lora_kwargs(cfg, rank),
                  "cold_start": bool(ecfg.pipeline.cold_start.get(domain))}
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

        from acl_lib.train import common

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


def run_expert(cfg, spec: MLESpec, domain: str):
    from acl_lib import pipeline
    from acl_lib.runs import run_once

    run = expert_run(cfg, spec, domain)
    _require(run.inputs, f"MLE expert {run.name}")
    backbone = pipeline.model_dir(run.inputs[0])

    def fn(r) -> None:
        r.checkpoint_dir()
        info = train_expert(cfg, domain, backbone, r.path, spec.rank)
        info["start_run"] = run.inputs[0].name
        r.write_json(EXPERT_JSON, info)
        r.logger.info("mle expert %s: %d LoRA parameters, backbone unchanged %s, %.1f s", domain,
                      info["trainable_parameters"], info["backbone_unchanged_in_memory"], info["wall_s"])

    return run_once(run, fn)


def run_experts(cfg, spec: MLESpec) -> dict:
    """Every domain's expert of ``spec`` (each skipped when complete). Returns ``{domain: run}``."""
    return {d: run_expert(cfg, spec, d) for d in cfg.pipeline.curriculum}


def adapter_dirs(cfg, spec: MLESpec) -> dict[str, Path]:
    return {d: expert_run(cfg, spec, d).path / ADAPTER_DIR for d in cfg.pipeline.curriculum}


def backbone_check(cfg, spec: MLESpec) -> dict:
    """After all experts: the backbone file digests every expert recorded, and the in-memory backbone of one
    model with every adapter attached, compared with the checkpoint bit for bit."""
    from acl_lib import pipeline

    backbone = pipeline.model_dir(start_run(cfg, spec.start))
    now = file_digests(backbone)
    recorded = {d: expert_run(cfg, spec, d).read_json(EXPERT_JSON) for d in cfg.pipeline.curriculum}
    model, _ = load_routed_model(backbone, adapter_dirs(cfg, spec), cfg.model.dtype)
    mem = backbone_tensors_equal(model, backbone)
    same_files = all(r["backbone_files_before"] == now and r["backbone_files_after"] == now for r in recorded.values())
    return {"files_unchanged": same_files, "in_memory_equal": mem["equal"], "tensors": mem["tensors"],
            "digests": now, "experts_in_memory_equal": {d: r["backbone_unchanged_in_memory"] for d, r in recorded.items()}}


# --- contexts and routers ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    """What the agent is shown when an episode starts (or now): system prompt, tool schemas, first user turn."""

    system: str = ""
    tools: tuple = ()
    user: str = ""

    @classmethod
    def of(cls, task, messages: Sequence[Mapping] | None = None) -> "Context":
        """From the tools a policy renders (``task.tools``) and the conversation (default: the task's opening).
        Reads nothing else of the task."""
        messages = messages if messages is not None else task.initial_messages()
        system = next((m.get("content") or "" for m in messages if m.get("role") == "system"), "")
        user = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
        tools = tuple(json.dumps(t, sort_keys=True) for t in (task.tools or []))
        return cls(system, tools, user)

    def tool_names(self) -> list[str]:
        return [json.loads(t).get("function", {}).get("name", "") for t in self.tools]

    def text(self) -> str:
        """The text the learned router reads: tool names and descriptions, system prompt, first user turn."""
        parts = []
        for t in self.tools:
            f = json.loads(t).get("function", {})
            parts.append(f"tool {f.get('name', '')} {f.get('description', '')}")
        return "\n".join(parts + [self.system, self.user])


class Router:
    """``route(context) -> domain`` (one of ``cfg.pipeline.curriculum``); ``route_task`` routes an episode's
    opening from the rendered context only."""

    name = "router"

    def route(self, context: Context) -> str:
        raise NotImplementedError

    def route_task(self, task, messages=None) -> str:
        return self.route(Context.of(task, messages))


class RecordingRouter(Router):
    """``router``, keeping every decision it makes (``decisions``: ``(Context, expert)``). The evaluation of an
    MLE system records them in ``routes.json`` so that another router can be checked against the very contexts it
    would see (``routes_agree``)."""

    def __init__(self, router: Router):
        self.router = router
        self.name = router.name
        self.decisions: list[tuple[Context, str]] = []

    def route(self, context: Context) -> str:
        d = self.router.route(context)
        self.decisions.append((context, d))
        return d


def decisions_json(decisions: Sequence[tuple[Context, str]]) -> dict:
    """``{"strings": [...], "rows": [[system, tools, user, expert], ...]}``: each distinct system prompt, tool list
    and user turn stored once (the rows index ``strings``; ``tools`` is the JSON list of the tool schemas)."""
    strings: dict[str, int] = {}

    def ix(text: str) -> int:
        return strings.setdefault(text, len(strings))

    rows = [[ix(c.system), ix(json.dumps(list(c.tools))), ix(c.user), d] for c, d in decisions]
    return {"strings": list(strings), "rows": rows}


def decisions_from_json(obj: Mapping) -> list[tuple[Context, str]]:
    s = obj["strings"]
    return [(Context(s[a], tuple(json.loads(s[b])), s[c]), d) for a, b, c, d in obj["rows"]]


def routes_agree(router: Router, decisions: Sequence[tuple[Context, str]]) -> bool:
    """Whether ``router`` makes every one of ``decisions`` (and there is at least one)."""
    return bool(decisions) and all(router.route(c) == d for c, d in decisions)


_SEARCH_WORDS = re.compile(r"search engine|search tool|knowledge corpus|`search`", re.I)
_DESK_WORDS = re.compile(r"customer|support agent|service agent|agent policy|desk policy|\border\b|refund", re.I)
_ANSWER_CONTRACT = re.compile(r"Answer:\s*\$", re.I)
_SEARCH_TOOLS = {"search", "retrieve", "lookup_passages"}


class ContextRouter(Router):
    """The rule of the module docstring: tool schemas first, then the system prompt, then the output contract."""

    name = "context"

    def __init__(self, fallback: str = "if"):
        self.fallback = fallback

    def route(self, context: Context) -> str:
        names = set(context.tool_names())
        if names:
            return "search" if names <= _SEARCH_TOOLS else "ecom"
        if context.system and _DESK_WORDS.search(context.system):
            return "ecom"
        if context.system and _SEARCH_WORDS.search(context.system):
            return "search"
        if _ANSWER_CONTRACT.search(context.system + "\n" + context.user):
            return "math"
        return self.fallback


_WORD = re.compile(r"[a-z0-9_$]+")


def features(text: str, n: int):
    """Hashed bag of words and bigrams (crc32 buckets), log(1 + count), L2-normalised: a float tensor (n,)."""
    import torch

    words = _WORD.findall(text.lower())
    grams = words + [a + " " + b for a, b in zip(words, words[1:])]
    v = torch.zeros(n)
    for g, c in Counter(grams).items():
        v[zlib.crc32(g.encode()) % n] += math.log1p(c)
    norm = v.norm()
    return v / norm if norm > 0 else v


class LearnedRouter(Router):
    """Multinomial logistic regression on ``features`` of ``Context.text()`` (torch, full-batch Adam with an L2
    penalty)."""

    name = "learned"

    def __init__(self, domains: Sequence[str], n_features: int, weight=None, bias=None):
        import torch

        self.domains = list(domains)
        self.n_features = int(n_features)
        self.weight = weight if weight is not None else torch.zeros(len(self.domains), self.n_features)
        self.bias = bias if bias is not None else torch.zeros(len(self.domains))

    def _x(self, contexts: Sequence[Context]):
        import torch

        return torch.stack([features(c.text(), self.n_features) for c in contexts]) if contexts else \
            torch.zeros(0, self.n_features)

    def fit(self, contexts: Sequence[Context], labels: Sequence[str], steps: int = 300, l2: float = 1e-3,
            lr: float = 0.5, seed: int = 0) -> list[float]:
        import torch

        x = self._x(contexts)
        y = torch.tensor([self.domains.index(lbl) for lbl in labels])
        g = torch.Generator().manual_seed(seed)
        w = (0.01 * torch.randn(len(self.domains), self.n_features, generator=g)).requires_grad_()
        b = torch.zeros(len(self.domains), requires_grad=True)
        opt = torch.optim.Adam([w, b], lr=lr)
        losses = []
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(x @ w.T + b, y) + l2 * (w * w).sum()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        self.weight, self.bias = w.detach(), b.detach()
        return losses

    def predict(self, contexts: Sequence[Context]) -> list[str]:
        if not contexts:
            return []
        logits = self._x(contexts) @ self.weight.T + self.bias
        return [self.domains[i] for i in logits.argmax(-1).tolist()]

    def route(self, context: Context) -> str:
        return self.predict([context])[0]

    def save(self, path) -> Path:
        import torch

        torch.save({"domains": self.domains, "n_features": self.n_features, "weight": self.weight,
                    "bias": self.bias}, str(path))
        return Path(path)

    @classmethod
    def load(cls, path) -> "LearnedRouter":
        import torch

        d = torch.load(str(path))
        return cls(d["domains"], d["n_features"], d["weight"], d["bias"])


def router_contexts(cfg, n_train: int, n_heldout: int, envs: dict | None = None):
    """Training-split contexts of every stage world: ``(train, heldout)``, each a list of ``(task id, Context,
    domain)``; held-out ids and context texts are disjoint from the training ones (duplicates dropped)."""
    from acl_lib.envs import STAGE_ENV
    from acl_lib.eval.harness import world

    envs = {} if envs is None else envs
    train, held = [], []
    for d in cfg.pipeline.curriculum:
        name = STAGE_ENV.get(d, d)
        if name not in envs:
            envs[name] = world(cfg, name)
        tasks = envs[name].tasks("train", n_train + n_heldout, seed=ROUTER_SEED + cfg.seed)
        train += [(t.id, Context.of(t), d) for t in tasks[:n_train]]
        held += [(t.id, Context.of(t), d) for t in tasks[n_train:]]
    seen_ids = {i for i, _, _ in train}
    seen_text = {c.text() for _, c, _ in train}
    held = [h for h in held if h[0] not in seen_ids and h[1].text() not in seen_text]
    return train, held


def accuracy(router: Router, items) -> float:
    if not items:
        return float("nan")
    return sum(router.route(c) == d for _, c, d in items) / len(items)


def benchmark_tasks(cfg, envs: dict | None = None) -> dict[str, list]:
    """Every benchmark's evaluation tasks, as ``evaluate`` draws them."""
    from acl_lib.envs import BENCHMARKS
    from acl_lib.eval.harness import benchmark_size, world

    envs = {} if envs is None else envs
    out = {}
    for b in BENCHMARKS.values():
        if b.env not in envs:
            envs[b.env] = world(cfg, b.env)
        out[b.key] = envs[b.env].tasks(b.split, benchmark_size(cfg, b), seed=cfg.worlds.seed)
    return out


def confusion(router: Router, tasks_by_benchmark: Mapping[str, list], domains: Sequence[str]) -> dict:
    """``{benchmark: {expert: episodes}}``: which expert each benchmark's episodes get from their first context."""
    out = {}
    for key, tasks in tasks_by_benchmark.items():
        c = Counter(router.route_task(t) for t in tasks)
        out[key] = {d: c.get(d, 0) for d in domains}
    return out


def confusion_frame(conf: Mapping[str, Mapping[str, int]]):
    """The confusion table as a DataFrame: one row per benchmark (suite, the domain it measures), one column per
    expert, plus the share routed to the benchmark's own domain."""
    import pandas as pd

    from acl_lib.envs import BENCHMARKS

    rows = []
    for key, counts in conf.items():
        b = BENCHMARKS[key]
        n = sum(counts.values())
        rows.append({"benchmark": key, "suite": b.suite, "measures": b.domain, **counts,
                     "to its domain %": 100.0 * counts.get(b.domain, 0) / n if n else None})
    return pd.DataFrame(rows).set_index("benchmark")


def run_router(cfg):
    """Train the learned router (skipped when complete); ``router.json`` has its training and held-out accuracy
    and both routers' confusion on every benchmark."""
    from acl_lib.runs import run_once

    m = cfg.mle

    def fn(r) -> None:
        envs: dict = {}
        train, held = router_contexts(cfg, m.router_train, m.router_heldout, envs)
        assert not {i for i, _, _ in train} & {i for i, _, _ in held}
        router = LearnedRouter(cfg.pipeline.curriculum, m.router_features)
        losses = router.fit([c for _, c, _ in train], [d for _, _, d in train], m.router_steps, m.router_l2,
                            seed=cfg.seed)
        router.save(r.path / ROUTER_FILE)
        ctx = ContextRouter(m.fallback)
        tasks = benchmark_tasks(cfg, envs)
        info = {"train": len(train), "heldout": len(held),
                "train_ids": [i for i, _, _ in train], "heldout_ids": [i for i, _, _ in held],
                "learned": {"train_accuracy": accuracy(router, train), "heldout_accuracy": accuracy(router, held),
                            "first_loss": losses[0], "last_loss": losses[-1],
                            "confusion": confusion(router, tasks, cfg.pipeline.curriculum)},
                "context": {"train_accuracy": accuracy(ctx, train), "heldout_accuracy": accuracy(ctx, held),
                            "confusion": confusion(ctx, tasks, cfg.pipeline.curriculum)}}
        r.write_json(ROUTER_JSON, info)
        r.logger.info("mle router: learned train %.3f held-out %.3f; context held-out %.3f",
                      info["learned"]["train_accuracy"], info["learned"]["heldout_accuracy"],
                      info["context"]["heldout_accuracy"])

    return run_once(router_run(cfg), fn)


def make_router(cfg, kind: str) -> Router:
    if kind == "context":
        return ContextRouter(cfg.mle.fallback)
    run = router_run(cfg)
    _require([run], "the learned router")
    return LearnedRouter.load(run.path / ROUTER_FILE)


def router_accuracy_frame(info: Mapping):
    import pandas as pd

    return pd.DataFrame([{"router": k, "train accuracy": info[k]["train_accuracy"],
                          "held-out accuracy": info[k]["heldout_accuracy"]} for k in ("context", "learned")]
                        ).set_index("router")


# --- serving (HF) ------------------------------------------------------------------------------------------


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


def _turn_generator_class():
    from acl_lib.eval.turns import TurnGenerator

    class RoutedTurnGenerator(TurnGenerator):
        """``TurnGenerator`` whose rows each run their episode's expert (``adapter_of(key)``) in one call:
        PEFT's ``adapter_names``; the shared first prefix is encoded once per expert."""

        def __init__(self, *args, adapter_of=None, **kw):
            super().__init__(*args, **kw)
            self.adapter_of = adapter_of

        def row_kwargs(self, keys):
            return {"adapter_names": [self.adapter_of(k) for k in keys]} if self.adapter_of else {}

        def _share_first_prefix(self, rows, min_shared: int = 32) -> None:
            groups: dict[str, list] = {}
            for key, ids in rows:
                groups.setdefault(self.adapter_of(key) if self.adapter_of else "", []).append((key, ids))
            for group in groups.values():
                super()._share_first_prefix(group, min_shared)

    return RoutedTurnGenerator


class MLEPolicy:
    """The evaluator's batched model policy (``HFPolicy``'s turn semantics) over one backbone with every expert
    attached; the router picks each episode's expert from its first context (``reroute``: from every turn's)."""

    def __init__(self, backbone_dir, adapters: Mapping[str, str | Path], router: Router, max_new_tokens: int,
                 temperature: float = 0.0, top_p: float = 1.0, batch_size: int = 16, dtype: str = "float32",
                 reuse_kv: bool = True, device: str | None = None, reroute: bool = False, model=None, tok=None):
        from acl_lib.eval.harness import eval_device, stop_token_ids

        self.name = "mle"
        self.device = eval_device(device)
        if model is None:
            model, tok = load_routed_model(backbone_dir, adapters, dtype, self.device)
        self.model, self.tok = model, tok
        self.tok.padding_side = "left"
        self.router = router
        self.reroute = reroute
        self.experts = set(adapters)
        self.stop_ids = stop_token_ids(self.tok)
        self.max_new_tokens = max_new_tokens
        self.temperature, self.top_p, self.batch_size = temperature, top_p, batch_size
        self.max_context = int(getattr(self.model.config, "max_position_embeddings", 1 << 30))
        self.generated_tokens = 0
        self.generate_seconds = 0.0
        self.routes: dict = {}  # episode key -> expert
        self.route_log: list[tuple[str, str]] = []  # (expert, how) per decision
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.stop_ids[0]
        self.gen = _turn_generator_class()(self.model, pad, self.stop_ids, batch_size, reuse=reuse_kv,
                                           adapter_of=self.adapter_of)

    @staticmethod
    def _key(task, messages):
        # the episode's own message list: stable across its turns, also when the desk (and the task shown)
        # changes mid-episode (``SwitchEpisode``); never read by the router
        return id(messages)

    def adapter_of(self, key) -> str:
        d = self.routes[key]
        return d if d in self.experts else BASE_ADAPTER

    def decide(self, task, messages) -> str:
        key = self._key(task, messages)
        if key not in self.routes or self.reroute:
            d = self.router.route(Context.of(task, messages))
            if key in self.routes and self.routes[key] != d:
                self.gen.forget(key)  # its cache holds another expert's keys and values
                self.route_log.append((d, "rerouted"))
            elif key not in self.routes:
                self.route_log.append((d, "first"))
            self.routes[key] = d
        return self.routes[key]

    def forget(self, task, messages) -> None:
        key = self._key(task, messages)
        self.gen.forget(key)
        self.routes.pop(key, None)

    def render(self, task, messages) -> str:
        return self.tok.apply_chat_template(messages, tools=task.tools or None, add_generation_prompt=True,
                                            tokenize=False)

    def __call__(self, batch):
        from acl_lib.eval.harness import cut_at_stop

        for t, m in batch:
            self.decide(t, m)
        ids = [self.tok(self.render(t, m), add_special_tokens=False)["input_ids"] for t, m in batch]
        out: list[str | None] = [None] * len(batch)
        limit = self.max_context - self.max_new_tokens
        fits = [i for i in range(len(batch)) if len(ids[i]) <= limit]
        sampling = {"do_sample": self.temperature > 0, "top_k": None}
        if self.temperature > 0:
            sampling.update(temperature=self.temperature, top_p=self.top_p)
        t0 = time.perf_counter()
        news = self.gen.generate([(self._key(*batch[i]), ids[i]) for i in fits], self.max_new_tokens, **sampling)
        self.generate_seconds += time.perf_counter() - t0
        for i, toks in zip(fits, news):
            toks = cut_at_stop(toks, self.stop_ids)
            self.generated_tokens += len(toks)
            out[i] = self.tok.decode(toks, skip_special_tokens=True)
        return out

    def close(self) -> None:
        from acl_lib.eval.harness import release_accelerator_memory

        self.gen = self.model = None
        release_accelerator_memory()


# --- serving (vLLM multi-LoRA, paper profile) --------------------------------------------------------------


def vllm_lora_engine_args(backbone_dir, dtype: str, max_model_len: int, n_adapters: int, max_rank: int,
                          seed: int = 0, gpu_memory_utilization: float = 0.9) -> dict:
    """``vllm.LLM`` keyword arguments of the multi-LoRA engine: the evaluator's (``vllm_engine_args``) with LoRA
    enabled for ``n_adapters`` adapters of rank up to ``max_rank`` resident at once."""
    from acl_lib.eval.harness import vllm_engine_args

    args = vllm_engine_args(str(backbone_dir), dtype, max_model_len, seed, gpu_memory_utilization)
    args.update(enable_lora=True, max_loras=int(n_adapters), max_lora_rank=int(max_rank))
    return args


@dataclass(frozen=True)
class _LoRARequestArgs:
    lora_name: str
    lora_int_id: int
    lora_path: str


def lora_request_class():
    """``vllm.lora.request.LoRARequest`` where vLLM is installed, else a stand-in with the same fields."""
    try:
        from vllm.lora.request import LoRARequest

        return LoRARequest
    except ImportError:
        return _LoRARequestArgs


def lora_requests(experts: Sequence[str], adapters: Mapping[str, str | Path], order: Sequence[str],
                  cls=None) -> list:
    """One ``LoRARequest`` per request: ``experts[i]`` -> (its name, a stable id from 1 in ``order``, its
    adapter's path); an expert without an adapter (the backbone) -> None."""
    cls = cls or lora_request_class()
    ids = {d: i + 1 for i, d in enumerate(order)}
    return [cls(lora_name=d, lora_int_id=ids[d], lora_path=str(adapters[d])) if d in adapters else None
            for d in experts]


class VLLMMLEPolicy:
    """The paper profile's MLE serving: one vLLM engine over the backbone with multi-LoRA; each request carries
    its episode's ``LoRARequest`` (the router decides once per episode). ``llm`` / ``sampling_params``: an
    engine and a ``SamplingParams`` factory instead of vLLM's (tests)."""

    def __init__(self, backbone_dir, adapters: Mapping[str, str | Path], router: Router, max_new_tokens: int,
                 temperature: float = 0.0, top_p: float = 1.0, dtype: str = "bfloat16", max_model_len: int = 32768,
                 max_rank: int = 8, seed: int = 0, llm=None, sampling_params=None, reroute: bool = False):
        from transformers import AutoTokenizer

        from acl_lib.eval.harness import stop_token_ids

        self.adapters = {d: str(p) for d, p in adapters.items()}
        self.order = list(adapters)
        self.engine_args = vllm_lora_engine_args(backbone_dir, dtype, max_model_len, len(adapters), max_rank, seed)
        if llm is None or sampling_params is None:
            try:
                import vllm
            except ImportError as exc:
                raise RuntimeError("MLE on eval.backend=vllm needs vLLM (the 'gpu' extra)") from exc
            llm = llm if llm is not None else vllm.LLM(**self.engine_args)
            sampling_params = sampling_params or vllm.SamplingParams
        self.name = "mle"
        self.tok = AutoTokenizer.from_pretrained(str(backbone_dir))
        self.stop_ids = stop_token_ids(self.tok)
        self.llm, self.sampling_params = llm, sampling_params
        self.router, self.reroute = router, reroute
        self.temperature, self.top_p = temperature, top_p
        self.max_new_tokens = max_new_tokens
        self.max_context = int(max_model_len)
        self.generated_tokens = 0
        self.generate_seconds = 0.0
        self.routes: dict = {}

    _key = staticmethod(MLEPolicy._key)

    def decide(self, task, messages) -> str:
        key = self._key(task, messages)
        if key not in self.routes or self.reroute:
            self.routes[key] = self.router.route(Context.of(task, messages))
        return self.routes[key]

    def forget(self, task, messages) -> None:
        self.routes.pop(self._key(task, messages), None)

    def render(self, task, messages) -> str:
        return self.tok.apply_chat_template(messages, tools=task.tools or None, add_generation_prompt=True,
                                            tokenize=False)

    def requests(self, batch) -> tuple[list, list, list[int]]:
        """``(prompts, lora_requests, fits)`` of a batch: token-id prompts that fit the context and their
        adapters (what ``llm.generate`` receives)."""
        experts = [self.decide(t, m) for t, m in batch]
        ids = [self.tok(self.render(t, m), add_special_tokens=False)["input_ids"] for t, m in batch]
        limit = self.max_context - self.max_new_tokens
        fits = [i for i in range(len(batch)) if len(ids[i]) <= limit]
        prompts = [{"prompt_token_ids": ids[i]} for i in fits]
        return prompts, lora_requests([experts[i] for i in fits], self.adapters, self.order), fits

    def __call__(self, batch):
        from acl_lib.eval.harness import cut_at_stop, vllm_sampling_args

        prompts, loras, fits = self.requests(batch)
        out: list[str | None] = [None] * len(batch)
        if not fits:
            return out
        t0 = time.perf_counter()
        params = self.sampling_params(**vllm_sampling_args(self.stop_ids, self.max_new_tokens, self.temperature,
                                                           self.top_p))
        outs = self.llm.generate(prompts, params, lora_request=loras, use_tqdm=False)
        self.generate_seconds += time.perf_counter() - t0
        for i, o in zip(fits, outs):
            toks = cut_at_stop(list(o.outputs[0].token_ids), self.stop_ids)
            self.generated_tokens += len(toks)
            out[i] = self.tok.decode(toks, skip_special_tokens=True)
        return out

    def close(self) -> None:
        from acl_lib.eval.harness import release_accelerator_memory

        self.llm = None
        release_accelerator_memory()


def make_mle_policy(cfg, spec: MLESpec, router: Router | None = None, reroute: bool = False):
    """The MLE policy of ``spec`` with the evaluator's settings (``eval.backend`` picks HF or vLLM)."""
    from acl_lib import pipeline

    backbone = pipeline.model_dir(start_run(cfg, spec.start))
    adapters = adapter_dirs(cfg, spec)
    router = router or make_router(cfg, spec.router)
    e = cfg.eval
    if e.backend == "vllm":
        return VLLMMLEPolicy(backbone, adapters, router, e.max_new_tokens, e.temperature, e.top_p,
                             dtype=cfg.model.dtype, max_model_len=cfg.model.max_position_embeddings,
                             max_rank=spec.rank or cfg.mle.rank, seed=cfg.seed, reroute=reroute)
    return MLEPolicy(backbone, adapters, router, e.max_new_tokens, e.temperature, e.top_p, e.batch_size,
                     dtype=cfg.model.dtype, reroute=reroute)


def run_mle(cfg, spec: MLESpec, evaluate: bool = True):
    """The MLE system of ``spec``: its experts (trained where missing; ``run_router`` for the learned router),
    the backbone check (``mle.json``), then the whole suite scored through the evaluator with ``MLEPolicy``
    (``<run>/eval/metrics.json``, as every checkpoint). Returns the run."""
    from acl_lib import pipeline
    from acl_lib.runs import run_once

    run_experts(cfg, spec)
    if spec.router == "learned":
        run_router(cfg)
    run = mle_run(cfg, spec)
    _require(run.inputs, f"MLE {spec.name}")

    def fn(r) -> None:
        check = backbone_check(cfg, spec)
        r.write_json(MLE_JSON, {"name": spec.name, "start": spec.start, "router": spec.router,
                                "rank": spec.rank or cfg.mle.rank, "backbone": str(pipeline.model_dir(run.inputs[0])),
                                "adapters": {d: str(p) for d, p in adapter_dirs(cfg, spec).items()},
                                "backbone_check": check})
        if not (check["files_unchanged"] and check["in_memory_equal"]):
            raise RuntimeError(f"MLE {spec.name}: the backbone changed: {check}")

    run_once(run, fn)
    if evaluate:
        ev = pipeline.eval_run(cfg, run)
        twin = eval_twin(cfg, spec)

        def score(r) -> None:
            from acl_lib.eval.harness import evaluate as evaluate_suite
            from acl_lib.seeding import seed_and_threads

            seed_and_threads(cfg.seed, cfg.torch_threads)
            router = RecordingRouter(make_router(cfg, spec.router))
            policy = make_mle_policy(cfg, spec, router=router)
            try:
                evaluate_suite(cfg, spec.name, r.path, suites="all", policy=policy)
            finally:
                policy.close()
            routes = Counter(d for _, d in router.decisions)
            r.write_json(ROUTES_JSON, {"episodes_per_expert": dict(routes), "decisions": decisions_json(router.decisions)})

        if twin is not None and not ev.is_complete():
            run.logger.info("MLE %s routes every episode of the complete evaluation %s as it did: copied", spec.name,
                            twin.name)
            run_once(ev, pipeline.copy_eval_fn(twin, model=spec.name, files=(ROUTES_JSON,)))
        else:
            run_once(ev, score)
    return run


ROUTES_JSON = "routes.json"


def eval_twin(cfg, spec: MLESpec):
    """A complete MLE evaluation of this seed directory that ``spec``'s would repeat, or None: the same experts
    (start and rank) on the same backbone, whose recorded routing decisions (``routes.json``) ``spec``'s router
    makes on every episode. The policies then generate the same tokens for every episode, so the scores are the
    same; ``mle`` and ``mle_learned`` are twins whenever the learned router agrees with the context router."""
    from acl_lib import pipeline

    router = None
    for path in sorted(cfg.seed_dir().glob(f"*/{MLE_JSON}")):
        if path.parent.name == spec.name:
            continue
        try:
            done = json.loads(path.read_text())
            other = MLESpec(path.parent.name, start=done["start"], router=done["router"],
                            rank=None if done.get("rank") == cfg.mle.rank else done.get("rank"))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if other.expert_prefix(cfg) != spec.expert_prefix(cfg):
            continue
        trained = mle_run(cfg, other)
        ev = pipeline.eval_run(cfg, trained)
        if not trained.is_complete() or not ev.is_complete() or not (ev.path / ROUTES_JSON).is_file():
            continue
        recorded = json.loads((ev.path / ROUTES_JSON).read_text()).get("decisions")
        if not recorded:
            continue  # an evaluation from before decisions were recorded
        if router is None:
            if spec.router == "learned" and not router_run(cfg).is_complete():
                return None
            router = make_router(cfg, spec.router)
        if routes_agree(router, decisions_from_json(recorded)):
            return ev
    return None


# --- measurements ------------------------------------------------------------------------------------------


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


def measure(cfg, spec: MLESpec, router: Router | None = None) -> dict:
    """Parameters (LoRA rank, extra parameters per expert and in total, share of the backbone), memory
    (parameter bytes; peak RSS) and generation latency / throughput of the routed model (mixed experts, one
    batch), the backbone alone and one expert merged (``merge_and_unload``), on the same batch in this run."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from acl_lib import pipeline
    from acl_lib.envs import IN_DOMAIN
    from acl_lib.eval.harness import eval_device

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
    set_threads = getattr(torch, "set_num_threads")
    from acl_lib.seeding import threads_per_rank

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


def measure_run(cfg, spec: MLESpec):
    from acl_lib.runs import Run

    m = cfg.mle
    extra = {"spec": spec.name, "latency": [m.latency_batch, m.latency_new_tokens, m.latency_repeats]}
    return Run(cfg, f"{spec.name}_measure", sections=("worlds",), inputs=[mle_run(cfg, spec)], extra=extra)


def run_measurements(cfg, spec: MLESpec) -> dict:
    from acl_lib.runs import run_once

    run = measure_run(cfg, spec)
    _require(run.inputs, "MLE measurements (run_mle first)")
    run_once(run, lambda r: r.write_json(MEASURE_JSON, measure(cfg, spec)))
    return run.read_json(MEASURE_JSON)


def measurements_frame(meas: Mapping):
    import pandas as pd

    lat = meas["latency"]
    rows = []
    for k, label in (("routed", "routed (mixed experts)"), ("backbone", "backbone alone"),
                     ("merged", f"one expert merged ({lat['merged_expert']})")):
        rows.append({"model": label, "best s": lat[k]["best_s"], "tokens/s": lat[k]["tokens_per_s"]})
    return pd.DataFrame(rows).set_index("model")


# --- stress cases ------------------------------------------------------------------------------------------


class ViewEpisode:
    """An episode shown to the policy with another task view (``shown``: tools removed, a blank system prompt),
    scored by the inner episode on the real task."""

    def __init__(self, inner, shown):
        self.inner, self.task = inner, shown
        if not shown.system_prompt and inner.messages and inner.messages[0].get("role") == "system":
            del inner.messages[0]  # the conversation the policy sees opens without the system prompt

    messages = property(lambda self: self.inner.messages)
    done = property(lambda self: self.inner.done)
    failure = property(lambda self: self.inner.failure)
    turns = property(lambda self: self.inner.turns)

    def step(self, text):
        return self.inner.step(text)

    def end(self, reason=None):
        self.inner.end(reason)

    def reward(self):
        return self.inner.reward()


class SwitchEpisode:
    """After ``k`` assistant turns in episode ``a`` (or when it ends), the conversation continues in another
    desk: the system prompt and tool schemas become ``b``'s, ``b``'s user opening follows the turns so far, and
    ``b`` scores the episode. ``messages`` stays one list object (the policy keys episodes on it)."""

    def __init__(self, a, b, k: int):
        self.a, self.b, self.k = a, b, k
        self.messages = list(a.messages)
        self.switched = False
        self.history: list[dict] = []

    @property
    def cur(self):
        return self.b if self.switched else self.a

    task = property(lambda self: self.cur.task)
    done = property(lambda self: self.switched and self.b.done)
    turns = property(lambda self: self.a.turns + self.b.turns)

    @property
    def failure(self):
        return self.b.failure

    def _sync(self):
        if self.switched:
            sys_b = [m for m in self.b.messages if m.get("role") == "system"]
            rest_b = [m for m in self.b.messages if m.get("role") != "system"]
            self.messages[:] = sys_b + self.history + rest_b
        else:
            self.messages[:] = self.a.messages

    def step(self, text):
        obs = self.cur.step(text)
        if not self.switched and (self.a.done or self.a.turns >= self.k):
            self.switched = True
            self.history = [m for m in self.a.messages if m.get("role") != "system"]
        self._sync()
        return obs

    def end(self, reason=None):
        if not self.switched:
            self.switched = True
            self.history = [m for m in self.a.messages if m.get("role") != "system"]
        self.b.end(reason)
        self._sync()

    def reward(self):
        return self.b.reward()


_NUMBER = re.compile(r"-?\d+")


class TwoSkillEpisode:
    """A retail desk episode whose customer also asks for a sum: it passes when the desk task passes and one
    assistant turn states the sum's value."""

    def __init__(self, inner, value: int):
        self.inner, self.value = inner, value
        self.task = inner.task

    messages = property(lambda self: self.inner.messages)
    done = property(lambda self: self.inner.done)
    turns = property(lambda self: self.inner.turns)

    @property
    def failure(self):
        return self.inner.failure or ("the sum is missing" if not self.stated() else None)

    def stated(self) -> bool:
        return any(str(self.value) in _NUMBER.findall(m.get("content") or "")
                   for m in self.inner.messages if m.get("role") == "assistant")

    def step(self, text):
        return self.inner.step(text)

    def end(self, reason=None):
        self.inner.end(reason)

    def reward(self):
        return self.inner.reward() * float(self.stated())


def stress_episodes(cfg) -> dict[str, tuple[str, list]]:
    """The stress benchmarks, built from the worlds' test tasks (``mle.stress_tasks`` episodes each):
    ``ambiguous_<d>_no_tools`` / ``ambiguous_<d>_no_system`` (each stage world with its tool schemas removed, or
    its system prompt blanked), ``switch_search_to_ecom`` / ``switch_ecom_to_search`` (the desk changes after
    ``mle.switch_turn`` turns; ``reroute`` is the policy's, recorded), ``two_skills`` (a retail task whose
    customer also asks for a sum). Returns ``{case: (benchmark whose turn budget it runs with, episodes)}``."""
    import random

    from acl_lib.envs import BENCHMARKS, IN_DOMAIN
    from acl_lib.eval.harness import world

    m = cfg.mle
    n = m.stress_tasks
    envs: dict = {}

    def env_of(key):
        b = BENCHMARKS[key]
        if b.env not in envs:
            envs[b.env] = world(cfg, b.env)
        return envs[b.env], b

    def tasks(key, k=n, offset=0):
        env, b = env_of(key)
        return env.tasks(b.split, k + offset, seed=cfg.worlds.seed + 1)[offset:]

    out: dict[str, list] = {}
    for d in cfg.pipeline.curriculum:
        key = IN_DOMAIN[d]
        env, b = env_of(key)
        lim = cfg.eval.limits_for(key)[0]
        out[f"ambiguous_{d}_no_tools"] = (key, [ViewEpisode(env.start(t, max_turns=lim), replace(t, tools=[]))
                                                 for t in tasks(key)])
        out[f"ambiguous_{d}_no_system"] = (key, [ViewEpisode(env.start(t, max_turns=lim),
                                                             replace(t, system_prompt="")) for t in tasks(key)])
    for a, b in (("nq", "retail"), ("retail", "nq")):
        ea, _ = env_of(a)
        eb, _ = env_of(b)
        la, lb = cfg.eval.limits_for(a)[0], cfg.eval.limits_for(b)[0]
        name = f"switch_{BENCHMARKS[a].domain}_to_{BENCHMARKS[b].domain}"
        out[name] = (b, [SwitchEpisode(ea.start(ta, max_turns=la), eb.start(tb, max_turns=lb), m.switch_turn)
                         for ta, tb in zip(tasks(a), tasks(b, offset=n))])
    er, _ = env_of("retail")
    rng = random.Random(f"mle-two-skills:{cfg.seed}")
    two = []
    for t in tasks("retail"):
        x, y, z = rng.randint(10, 99), rng.randint(10, 99), rng.randint(2, 9)
        ask = f" Also, I need a quick sum for my budget: what is {x} + {y} * {z}? Please tell me the number."
        t2 = replace(t, user_prompt=t.user_prompt + ask)
        two.append(TwoSkillEpisode(er.start(t2, max_turns=cfg.eval.limits_for("retail")[0]), x + y * z))
    out["two_skills"] = ("retail", two)
    return out


def stress_scores(cfg, policy, reroute: bool = False) -> dict:
    """Pass rate (%) of ``policy`` on every stress benchmark, and (for a routed policy) the experts it chose."""
    from acl_lib.eval.harness import PASS_EPS, run_episodes

    cases = stress_episodes(cfg)
    out = {}
    for name, (key, eps) in cases.items():
        max_new = cfg.eval.limits_for(key)[1]
        if hasattr(policy, "max_new_tokens"):
            policy.max_new_tokens = max_new
        before = len(getattr(policy, "route_log", []))
        run_episodes(policy, eps, batch_size=max(cfg.eval.batch_size, 1) * 4)
        passed = [ep.reward() >= 1.0 - PASS_EPS for ep in eps]
        row = {"score": 100.0 * sum(passed) / max(1, len(passed)), "n": len(eps), "reroute": reroute,
               "failures": dict(Counter((ep.failure or "").split(":")[0][:80] for ep in eps if ep.failure))}
        log = getattr(policy, "route_log", None)
        if log is not None:
            row["routes"] = [f"{d} ({how})" for d, how in log[before:]]
        out[name] = row
    return out


def stress_run(cfg, spec: MLESpec, oracles: bool, reroute: bool):
    from acl_lib import pipeline
    from acl_lib.runs import Run

    inputs = [mle_run(cfg, spec)]
    if spec.router != "learned":
        inputs.append(router_run(cfg))
    if oracles:
        inputs += [pipeline.oracle_run(cfg, d) for d in cfg.pipeline.curriculum]
    extra = {"spec": spec.name, "n": cfg.mle.stress_tasks, "k": cfg.mle.switch_turn, "reroute": reroute}
    return Run(cfg, f"{spec.name}_stress", sections=("worlds", "eval"), inputs=inputs, extra=extra)


def run_stress(cfg, spec: MLESpec, oracles: bool = True, reroute: bool = False) -> dict:
    """Both routers (context, learned; the switch cases with and without re-routing) and, with ``oracles``, each
    ``oracle_<d>`` on the stress benchmarks; ``<spec>_stress/stress.json``."""
    from acl_lib import pipeline
    from acl_lib.eval.harness import make_policy
    from acl_lib.runs import run_once
    from acl_lib.seeding import seed_and_threads

    run_router(cfg)
    run = stress_run(cfg, spec, oracles, reroute)
    _require(run.inputs, "the MLE stress cases")

    def fn(r) -> None:
        res: dict = {}
        for kind in ROUTERS:
            for rr in ((False, True) if kind == "context" else (reroute,)):
                seed_and_threads(cfg.seed, cfg.torch_threads)
                policy = make_mle_policy(cfg, spec, make_router(cfg, kind), reroute=rr)
                try:
                    res[f"mle_{kind}" + ("_reroute" if rr else "")] = stress_scores(cfg, policy, rr)
                finally:
                    policy.close()
        if oracles:
            for d in cfg.pipeline.curriculum:
                seed_and_threads(cfg.seed, cfg.torch_threads)
                policy = make_policy(str(pipeline.model_dir(pipeline.oracle_run(cfg, d))), cfg)
                try:
                    res[f"oracle_{d}"] = stress_scores(cfg, policy)
                finally:
                    policy.close()
        r.write_json(STRESS_JSON, res)

    run_once(run, fn)
    return run.read_json(STRESS_JSON)


def stress_frame(res: Mapping):
    import pandas as pd

    return pd.DataFrame({who: {case: v["score"] for case, v in rows.items()} for who, rows in res.items()})


def stress_routes_frame(res: Mapping):
    """Which expert each router gave each stress case's episodes (first decision, and any re-routing)."""
    import pandas as pd

    rows = {}
    for who, cases in res.items():
        if not who.startswith("mle_"):
            continue
        rows[who] = {case: ", ".join(f"{k} x{v}" for k, v in Counter(v.get("routes", [])).most_common())
                     for case, v in cases.items()}
    return pd.DataFrame(rows)


# --- reading -----------------------------------------------------------------------------------------------


def reading(scores: Mapping[str, Mapping[str, float]], study: Mapping[str, Mapping], router_info: Mapping | None,
            measurements: Mapping | None, stress: Mapping | None, names: Sequence[str] = ("mle", "mle_learned"),
            curriculum: Sequence[str] = ("math", "search", "ecom", "if")) -> str:
    """Markdown computed from this run's numbers: each MLE system against each domain's oracle and
    ``seq_final`` in-domain, the study's gap (``main_table.mle`` vs the oracles), the routers' accuracy, the
    cost and the stress cases."""
    from acl_lib.envs import IN_DOMAIN

    lines = []
    for n in names:
        if n not in scores:
            lines.append(f"- `{n}`: not evaluated.")
            continue
        parts = []
        for d in curriculum:
            b = IN_DOMAIN[d]
            o = scores.get(f"oracle_{d}", {}).get(b)
            s = scores[n].get(b)
            if s is None:
                continue
            txt = f"{b} {s:.1f}"
            if o is not None:
                txt += f" (oracle {o:.1f}, {s - o:+.1f})"
            if "seq_final" in scores and b in scores["seq_final"]:
                txt += f" (seq_final {scores['seq_final'][b]:.1f})"
            parts.append(txt)
        lines.append(f"- `{n}` in domain: " + "; ".join(parts) + ".")
    theirs = study.get("mle") or {}
    gaps = []
    for d in curriculum:
        b = IN_DOMAIN[d]
        o = (study.get(f"oracle_{d}") or {}).get(b)
        if b in theirs and o is not None:
            gaps.append(f"{b} {theirs[b]:.1f} vs {o:.1f} ({theirs[b] - o:+.1f})")
    if gaps:
        lines.append("- The study's MLE against its oracles: " + "; ".join(gaps) + ".")
    if router_info:
        for k in ("context", "learned"):
            i = router_info[k]
            conf = i["confusion"]
            from acl_lib.envs import BENCHMARKS

            tot = sum(sum(v.values()) for v in conf.values())
            right = sum(v.get(BENCHMARKS[b].domain, 0) for b, v in conf.items())
            lines.append(f"- {k} router: held-out accuracy {100 * i['heldout_accuracy']:.1f}% (training "
                         f"{100 * i['train_accuracy']:.1f}%); {right} of {tot} benchmark episodes "
                         f"({100 * right / max(tot, 1):.1f}%) go to the expert of the domain the benchmark measures.")
    if measurements:
        lat = measurements["latency"]
        lines.append(f"- Cost: {measurements['extra_parameters_total']:,} LoRA parameters for "
                     f"{len(measurements['experts'])} experts ({100 * measurements['extra_share_total']:.2f}% of the "
                     f"backbone); one routed batch takes {lat['routed_over_backbone']:.2f}x the backbone's time and "
                     f"{lat['routed_over_merged']:.2f}x one merged expert's.")
    if stress:
        for who, s in stress.items():
            lines.append(f"- `{who}` stress cases: " + ", ".join(f"{k} {v['score']:.0f}" for k, v in s.items()) + ".")
        sw = {w: [v["score"] for k, v in s.items() if k.startswith("switch_")] for w, s in stress.items()}
        if "mle_context" in sw and "mle_context_reroute" in sw and sw["mle_context"]:
            a, b = (sum(sw[w]) / len(sw[w]) for w in ("mle_context", "mle_context_reroute"))
            lines.append(f"- Mid-episode change: re-routing at every turn {'helps' if b > a else 'does not help'} the "
                         f"context router here ({a:.0f} -> {b:.0f} on the switch cases).")
    return "\n".join(lines)


# --- notebook views ----------------------------------------------------------------------------------------


def experts_frame(cfg, spec: MLESpec):
    """One row per expert of ``spec``: its run, rank, LoRA parameters, recipe (cold start, demos kept, SFT and
    GRPO steps), wall time and the backbone check."""
    import pandas as pd

    rows = []
    for d in cfg.pipeline.curriculum:
        r = expert_run(cfg, spec, d)
        if not r.is_complete():
            rows.append({"domain": d, "run": r.name, "status": r.status()})
            continue
        i = r.read_json(EXPERT_JSON)
        rows.append({"domain": d, "run": r.name, "backbone": i.get("start_run"), "rank": i["lora"]["r"],
                     "LoRA parameters": i["trainable_parameters"], "cold start": i["cold_start"],
                     "demos kept": (i.get("demos") or {}).get("kept"), "sft steps": i.get("sft_steps", 0),
                     "grpo steps": i.get("grpo_steps", 0), "wall s": i["wall_s"],
                     "backbone bit-identical": i["backbone_unchanged_in_memory"] and i["backbone_files_unchanged"]})
    return pd.DataFrame(rows).set_index("domain")


def scored_consolidations(cfg) -> list[str]:
    """The merges (notebook 10) that have a whole-suite evaluation in this seed's store."""
    return sorted(p.name for p in cfg.seed_dir().glob("merge_*") if (p / "eval" / "metrics.json").is_file())
