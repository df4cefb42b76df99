"""MMOPD's run specs: ``DistillSpec``, the study's distillation and its ablations, and the run each is keyed on."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from acl_lib import pipeline
from acl_lib.consolidate.merging import checkpoint_runs
from acl_lib.runs import Run

if TYPE_CHECKING:
    from acl_lib.config import Config

MMOPD_SECTIONS = ("model", "worlds", "grpo", "mmopd")  # what a distillation run depends on besides its checkpoints


@dataclass(frozen=True)
class DistillSpec:
    """One distillation run: its name, the student run, ``teachers`` (stage domain -> teacher run name), the prompt
    ``mixture`` (stage domain -> weight) and alpha (None = infinity: plain reverse KL)."""

    name: str
    student: str
    teachers: dict = field(default_factory=dict)
    mixture: dict = field(default_factory=dict)
    alpha: float | None = None

    def __post_init__(self):
        missing = [d for d, w in self.mixture.items() if w > 0 and d not in self.teachers]
        if missing:
            raise ValueError(f"{self.name}: prompts of {missing} but no teacher for them (teachers: {self.teachers})")
        if not any(w > 0 for w in self.mixture.values()):
            raise ValueError(f"{self.name}: the prompt mixture {self.mixture} has no positive weight")

    def to_dict(self) -> dict:
        return asdict(self)


def _seq_name(cfg: Config, domain: str) -> str:
    return pipeline.sequential_run(cfg, cfg.pipeline.curriculum.index(domain) + 1).name


def mmopd_spec(cfg: Config, name: str = "mmopd", **changes) -> DistillSpec:
    """The study's MMOPD: student ``seq_final``, the four stage checkpoints as teachers, ``mmopd.mixture``,
    ``mmopd.alpha``; ``changes`` replace fields (``alpha=None`` for the reverse-KL ablation)."""
    cur = cfg.pipeline.curriculum
    spec = {"name": name, "student": _seq_name(cfg, cur[-1]), "teachers": {d: _seq_name(cfg, d) for d in cur},
            "mixture": dict(cfg.mmopd.mixture), "alpha": cfg.mmopd.alpha}
    spec.update(changes)
    return DistillSpec(**spec)


def single_teacher_spec(cfg: Config, name: str = "mmopd_single") -> DistillSpec:
    """The study's single-teacher ablation: teacher ``seq_search``, student ``seq_ecom`` (the stage after search in
    the study's order), search prompts only."""
    return DistillSpec(name=name, student=_seq_name(cfg, "ecom"), teachers={"search": _seq_name(cfg, "search")},
                       mixture={"search": 1.0}, alpha=cfg.mmopd.alpha)


def distill_run(cfg: Config, spec: DistillSpec):
    """The run of ``spec`` (``<seed_dir>/<spec.name>``), keyed on its spec, the sections it reads and its inputs."""
    known = checkpoint_runs(cfg)
    names = [spec.student, *dict.fromkeys(spec.teachers.values())]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"{spec.name}: {unknown} is not a checkpoint of this pipeline (known: {list(known)})")
    return Run(cfg, spec.name, sections=MMOPD_SECTIONS, inputs=[known[n] for n in names],
               extra={"distill": spec.to_dict()})


def run_specs(cfg: Config) -> list[DistillSpec]:
    """The distillation runs notebook 08 makes: ``mmopd``, then the ablations the config turns on
    (``ablations.mmopd_reverse_kl``: ``mmopd_rkl``, reverse KL only; ``ablations.mmopd_single_teacher``:
    ``mmopd_single``)."""
    specs = [mmopd_spec(cfg)]
    if cfg.ablations.mmopd_reverse_kl:
        specs.append(mmopd_spec(cfg, "mmopd_rkl", alpha=None))
    if cfg.ablations.mmopd_single_teacher:
        specs.append(single_teacher_spec(cfg))
    return specs
