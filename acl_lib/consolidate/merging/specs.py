"""Merging's run specs: ``MergeSpec``, the study's set of merges, the checkpoints a merge may take and the run
each merge is keyed on."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from acl_lib import pipeline
from acl_lib.runs import Run
from acl_lib.steps import require_complete

if TYPE_CHECKING:
    from acl_lib.config import Config

METHODS = ("task_arithmetic", "ties", "dare")
MERGE_SECTIONS = ("model",)  # a merge depends on its spec and its input checkpoints, and on the model's dtype


@dataclass(frozen=True)
class MergeSpec:
    """One merge: the run name, the checkpoints merged (run names of this seed directory, theta_k), their
    coefficients lambda_k, the method and, for TIES and DARE, the fraction of each task vector kept (``density``)
    and DARE's seed."""

    name: str
    sources: tuple[str, ...]
    weights: tuple[float, ...]
    method: str = "task_arithmetic"
    density: float = 1.0
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "sources", tuple(self.sources))
        object.__setattr__(self, "weights", tuple(float(w) for w in self.weights))
        if self.method not in METHODS:
            raise ValueError(f"merge {self.name}: unknown method {self.method!r}; methods are {list(METHODS)}")
        if not self.sources:
            raise ValueError(f"merge {self.name}: no checkpoints to merge")
        if len(self.weights) != len(self.sources):
            raise ValueError(f"merge {self.name}: {len(self.weights)} coefficients for {len(self.sources)} checkpoints")
        if not all(math.isfinite(w) for w in self.weights):
            raise ValueError(f"merge {self.name}: coefficients must be finite, got {self.weights}")
        if not 0.0 < self.density <= 1.0:
            raise ValueError(f"merge {self.name}: density must be in (0, 1], got {self.density}")

    def to_dict(self) -> dict:
        return asdict(self)


def uniform_weights(k: int) -> tuple[float, ...]:
    """The study's uniform merge: lambda_k = 1/K, the average of the K checkpoints."""
    return (1.0 / k,) * k


def checkpoint_runs(cfg: Config) -> dict:
    """``{run name: Run}`` of the checkpoints a merge may take as theta_k: the sequential stages and the oracles."""
    runs = {}
    for i in range(1, len(cfg.pipeline.curriculum) + 1):
        r = pipeline.sequential_run(cfg, i)
        runs[r.name] = r
    for d in cfg.pipeline.curriculum:
        r = pipeline.oracle_run(cfg, d)
        runs[r.name] = r
    return runs


def complete_inputs(cfg: Config, names: Sequence[str]) -> list:
    """The base run and the runs ``names``, each complete, or a RuntimeError naming what is missing."""
    known = checkpoint_runs(cfg)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"cannot merge {unknown}: not a checkpoint of this pipeline (known: {list(known)})")
    runs = [pipeline.base_run(cfg)] + [known[n] for n in names]
    require_complete(runs, "merging")
    return runs


def merge_run(cfg: Config, spec: MergeSpec):
    """The run of ``spec`` (``<seed_dir>/<spec.name>``), keyed on the spec and its input checkpoints."""
    known = checkpoint_runs(cfg)
    inputs = [pipeline.base_run(cfg)] + [known[n] for n in spec.sources if n in known]
    return Run(cfg, spec.name, sections=MERGE_SECTIONS, inputs=inputs, extra={"merge": spec.to_dict()})


def merge_specs(cfg: Config, chosen: Mapping[str, Sequence[float]] | None = None, ties_density: float = 0.5,
                dare_density: float = 0.5, oracles: bool = True, seed: int = 0) -> list[MergeSpec]:
    """The merges notebook 10 runs: ``merge_uniform`` (the study's), ``merge_grid`` and ``merge_balanced`` (from
    ``chosen``, the validation search's choice), ``merge_ties`` (lambda_k = 1: TIES takes the mean of the task
    vectors that agree in sign), ``merge_dare`` (lambda_k = 1/K: in expectation the uniform merge) and, with
    ``oracles``, ``merge_oracles`` (the uniform merge of the four oracles)."""
    seqs = [n for n in checkpoint_runs(cfg) if not n.startswith("oracle_")]
    k = len(seqs)
    specs = [MergeSpec("merge_uniform", seqs, uniform_weights(k))]
    for key in ("grid", "balanced"):
        if chosen and key in chosen:
            specs.append(MergeSpec(f"merge_{key}", seqs, tuple(chosen[key])))
    specs.append(MergeSpec("merge_ties", seqs, (1.0,) * k, method="ties", density=ties_density))
    specs.append(MergeSpec("merge_dare", seqs, uniform_weights(k), method="dare", density=dare_density, seed=seed))
    if oracles:
        names = [f"oracle_{d}" for d in cfg.pipeline.curriculum]
        specs.append(MergeSpec("merge_oracles", names, uniform_weights(len(names))))
    return specs
