"""The checkpoints of one seed directory that the diagnostics read, found through the pipeline's own runs.

    found = stage_checkpoints(cfg)            # base, seq_*, oracle_* (+ extra run names), each present or not
    found.present(), found.missing()          # a user who ran a subset sees what is missing, nothing fails

A checkpoint is *present* when its training run is complete and its model directory exists. A stage that
cold-started also keeps its SFT model (``<run>/checkpoints/sft/model``, ``acl_lib.train.stage``), which the
SFT-versus-RL comparison reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from acl_lib import pipeline
from acl_lib.steps import notebook_of

if TYPE_CHECKING:
    from acl_lib.config import Config

SFT_MODEL = "checkpoints/sft/model"  # acl_lib.train.stage.SFT_DIR + "/model": the cold start's model


@dataclass
class Checkpoint:
    name: str  # run name: base, seq_math, oracle_search, ...
    kind: str  # base | seq | oracle | extra
    domain: str | None  # the stage's domain (None for the base and extra runs)
    start: str | None  # the checkpoint it was trained from (None for the base)
    model: str | None  # model directory (or hub id for a paper base); None when missing
    sft_model: str | None = None  # the cold start's SFT model, where the stage kept one
    status: str = "complete"  # the run's status (complete, missing, running, failed, stale)

    @property
    def present(self) -> bool:
        return self.model is not None


@dataclass
class CheckpointSet:
    items: list[Checkpoint] = field(default_factory=list)

    def __getitem__(self, name: str) -> Checkpoint:
        for c in self.items:
            if c.name == name:
                return c
        raise KeyError(f"no checkpoint {name!r}; known: {[c.name for c in self.items]}")

    def __contains__(self, name: str) -> bool:
        return any(c.name == name for c in self.items)

    def present(self, kinds: tuple[str, ...] | None = None) -> list[Checkpoint]:
        return [c for c in self.items if c.present and (kinds is None or c.kind in kinds)]

    def missing(self) -> list[Checkpoint]:
        return [c for c in self.items if not c.present]

    def missing_frame(self):
        """DataFrame of the checkpoints this seed directory lacks (run name, status, the notebook that makes it)."""
        import pandas as pd

        rows = [{"checkpoint": c.name, "status": c.status, "made by notebook": notebook_of(c.name) or "-"}
                for c in self.missing()]
        return pd.DataFrame(rows, columns=["checkpoint", "status", "made by notebook"]).set_index("checkpoint")


def _model_of(run) -> str | None:
    if not run.is_complete():
        return None
    model = pipeline.model_dir(run)
    if isinstance(model, Path) and not model.is_dir():
        return None
    return str(model)


def stage_checkpoints(cfg: Config, oracles: bool = True, extra: list[str] | tuple[str, ...] = ()) -> CheckpointSet:
    """Base, the sequential stages in curriculum order, the oracles and ``extra`` run names (any complete run of
    this seed directory holding ``model/``, e.g. a consolidation, taken as trained from the base)."""
    out = CheckpointSet()
    base = pipeline.base_run(cfg)
    out.items.append(Checkpoint("base", "base", None, None, _model_of(base), status=base.status()))
    runs = [(pipeline.sequential_run(cfg, i), "seq") for i in range(1, len(cfg.pipeline.curriculum) + 1)]
    if oracles:
        runs += [(pipeline.oracle_run(cfg, d), "oracle") for d in cfg.pipeline.curriculum]
    for run, kind in runs:
        model = _model_of(run)
        sft = run.path / SFT_MODEL
        out.items.append(Checkpoint(run.name, kind, run.extra["domain"], run.inputs[0].name, model,
                                    str(sft) if model is not None and sft.is_dir() else None, status=run.status()))
    for name in extra:
        path = cfg.seed_dir() / name
        model = path / "model"
        done = (path / "COMPLETE.json").exists() and model.is_dir()
        out.items.append(Checkpoint(name, "extra", None, "base", str(model) if done else None,
                                    status="complete" if done else "missing"))
    return out
