"""An MLE system's spec and its runs: ``MLESpec`` (run name, backbone, router, LoRA rank), the experts' recipes
(``expert_cfg``, ``lora_kwargs``) and the run keys of the backbone (``start_run``), the experts (``expert_run``),
the learned router (``router_run``) and the system (``mle_run``), with the file names they hold."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from acl_lib import pipeline
from acl_lib.config import Config, ConfigError, _set_dotted, parse_override
from acl_lib.consolidate.sdft import SDFTSpec, sdft_run
from acl_lib.runs import Run
from acl_lib.steps import made_by

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
ROUTES_JSON = "routes.json"
EXPERT_SECTIONS = ("model", "worlds")  # + the expert's resolved recipe, the LoRA settings (extra)
ROUTERS = ("context", "learned")
STARTS = ("sdft_base", "base")
BASE_ADAPTER = "__base__"  # PEFT's adapter name for "no adapter" in ``adapter_names``
LABEL_FIELDS = ("id", "benchmark", "answer", "meta", "domain")  # what a router must never read


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


def expert_name(cfg: Config, spec: MLESpec, domain: str) -> str:
    return f"{spec.expert_prefix(cfg)}_expert_{domain}"


def ablation_specs(cfg: Config, ranks: bool = True, from_base: bool = True, start: str = "sdft_base") -> list[MLESpec]:
    """The ablations notebook 11 runs behind its flags, each with the context router: every rank of
    ``mle.ablation_ranks`` other than ``mle.rank`` (``mle_r<k>``) and experts trained from the base
    (``mle_frombase``)."""
    specs = []
    if ranks:
        specs += [MLESpec(f"mle_r{r}", start=start, rank=r) for r in cfg.mle.ablation_ranks if r != cfg.mle.rank]
    if from_base and start != "base":
        specs.append(MLESpec("mle_frombase", start="base"))
    return specs


def lora_kwargs(cfg: Config, rank: int | None = None) -> dict:
    """``peft.LoraConfig`` keyword arguments of an expert."""
    m = cfg.mle
    r = int(rank or m.rank)
    return {"r": r, "lora_alpha": float(m.alpha), "lora_dropout": float(m.dropout),
            "target_modules": list(m.target_modules), "bias": "none", "task_type": "CAUSAL_LM"}


def lora_config(cfg: Config, rank: int | None = None):
    from peft import LoraConfig

    return LoraConfig(**lora_kwargs(cfg, rank))


def expert_cfg(cfg: Config, domain: str):
    """The domain's stage recipe (``cfg.for_stage``) with ``mle``'s budgets (``grpo_max_steps`` None: the stage's)
    and ``mle.stage_overrides[domain]``."""
    tree = cfg.for_stage(domain).to_dict()
    m = cfg.mle
    tree["sft"]["num_demos"] = min(tree["sft"]["num_demos"], m.num_demos)
    tree["sft"]["max_steps"] = m.sft_max_steps
    tree["sft"]["learning_rate"] = m.sft_learning_rate
    if m.grpo_max_steps is not None:
        tree["grpo"]["max_steps"] = m.grpo_max_steps
    tree["grpo"]["learning_rate"] = m.grpo_learning_rate
    for item in m.stage_overrides.get(domain, []):
        key, value = parse_override(item)
        _set_dotted(tree, key, value, f"mle.stage_overrides.{domain}")
    try:
        return Config.model_validate(tree)
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"invalid MLE expert recipe for {domain}: {exc}") from None


def start_run(cfg: Config, start: str):
    """The backbone's run: ``sdft_base`` (``acl_lib.consolidate.sdft``) or the base."""
    if start == "base":
        return pipeline.base_run(cfg)
    return sdft_run(cfg, SDFTSpec("sdft_base", start="base"))


def default_start(cfg: Config, fallback: bool = True) -> str:
    """``sdft_base`` when that run is complete; else (``fallback``) ``base`` with a warning (notebook 09 trains no
    ``sdft_base`` where its filter kept nothing: the untrained oracles of the smoke profile), else an error."""
    if start_run(cfg, "sdft_base").is_complete():
        return "sdft_base"
    if not fallback:
        raise RuntimeError(f"MLE needs the complete run sdft_base ({made_by('sdft_base')})")
    logger.warning("sdft_base is not complete (%s kept no data or has not run): the MLE experts start from the base",
                   made_by("sdft_base"))
    return "base"


def expert_cold_start(cfg: Config, domain: str) -> bool:
    """Whether the expert of ``domain`` has a LoRA-SFT cold start before its GRPO: ``mle.cold_start`` and the
    domain's stage has one (``pipeline.cold_start``). The study's experts are LoRA-RL: GRPO only (the default)."""
    return bool(cfg.mle.cold_start and cfg.pipeline.cold_start.get(domain))


def expert_run(cfg: Config, spec: MLESpec, domain: str):
    ecfg = expert_cfg(cfg, domain)
    extra = {"domain": domain, "lora": lora_kwargs(cfg, spec.rank), "start": spec.start,
             "cold_start": expert_cold_start(cfg, domain),
             "sft": ecfg.sft.model_dump(), "grpo": ecfg.grpo.model_dump(), "seed": cfg.seed}
    return Run(cfg, expert_name(cfg, spec, domain), sections=EXPERT_SECTIONS, inputs=[start_run(cfg, spec.start)],
               extra=extra)


def router_run(cfg: Config):
    m = cfg.mle
    extra = {k: getattr(m, k) for k in ("router_train", "router_heldout", "router_features", "router_steps",
                                        "router_l2")}
    extra["seed"] = cfg.seed
    return Run(cfg, ROUTER_RUN, sections=("worlds",), inputs=[], extra=extra)


def mle_run(cfg: Config, spec: MLESpec):
    inputs = [start_run(cfg, spec.start)] + [expert_run(cfg, spec, d) for d in cfg.pipeline.curriculum]
    if spec.router == "learned":
        inputs.append(router_run(cfg))
    extra = {"router": spec.router, "fallback": cfg.mle.fallback}
    return Run(cfg, spec.name, sections=("model",), inputs=inputs, extra=extra)



def adapter_dirs(cfg: Config, spec: MLESpec) -> dict[str, Path]:
    return {d: expert_run(cfg, spec, d).path / ADAPTER_DIR for d in cfg.pipeline.curriculum}
