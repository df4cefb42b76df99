"""The sequential curriculum and the single-task oracles, as runs in the run store.

    base -> seq_<d1> -> seq_<d2> -> seq_<d3> -> seq_<d4>      (d = cfg.pipeline.curriculum, any order)
    base -> oracle_<d>                                       (one per domain)

Each run trains one stage with ``acl_lib.train.stage.run_stage`` from its input checkpoint, saves the
model under ``<run>/model`` and scores it on the whole suite into ``<run>/metrics.json``. A run's config
hash covers the sections it depends on and its input run, so changing a stage's recipe re-runs it and
every run after it, and nothing else.
"""

from __future__ import annotations

from pathlib import Path

from acl_lib.config import Config
from acl_lib.runs import Run, run_once

# What a training stage depends on (besides its input run).
STAGE_SECTIONS = ("model", "pretrain", "worlds", "sft", "grpo", "pipeline", "eval")


def base_run(cfg: Config) -> Run:
    from acl_lib.model import BASE_SECTIONS

    return Run(cfg, "base", sections=BASE_SECTIONS)


def seq_run_names(cfg: Config) -> list[str]:
    return [f"seq_{d}" for d in cfg.pipeline.curriculum]


def model_dir(run: Run) -> Path:
    return run.path / "model"


def evaluate_run(cfg: Config, run: Run) -> dict:
    """Score ``<run>/model`` on the whole suite into ``<run>/metrics.json`` (+ records/)."""
    from acl_lib.eval.harness import evaluate

    return evaluate(cfg, str(model_dir(run)), run.path, suites="all")


def _stage_fn(cfg: Config, domain: str, init: Run):
    def fn(run: Run) -> None:
        from acl_lib.train.stage import run_stage

        stage_cfg = cfg.for_stage(domain)
        run_stage(stage_cfg, domain, model_dir(init), run)
        evaluate_run(cfg, run)

    return fn


def sequential_run(cfg: Config, index: int) -> Run:
    """The run of stage ``index`` (1-based) of the curriculum; its input is the previous stage (or base)."""
    curriculum = cfg.pipeline.curriculum
    if not 1 <= index <= len(curriculum):
        raise ValueError(f"stage index {index} out of range 1..{len(curriculum)} for curriculum {curriculum}")
    prev = base_run(cfg) if index == 1 else sequential_run(cfg, index - 1)
    # The run name carries the curriculum position when the order is not the study's, so two orders
    # never share a directory.
    name = f"seq_{curriculum[index - 1]}"
    if curriculum != ["math", "search", "ecom", "if"]:
        name = f"seq{index}_{'-'.join(curriculum[:index])}"
    return Run(cfg, name, sections=STAGE_SECTIONS, inputs=[prev])


def run_sequential_stage(cfg: Config, index: int) -> Run:
    """Train and evaluate stage ``index`` of the curriculum (skipped when already complete)."""
    run = sequential_run(cfg, index)
    prev = run.inputs[0]
    if not prev.is_complete():
        raise RuntimeError(f"stage {index} needs the complete run '{prev.name}' first ({prev.path}); run its notebook")
    return run_once(run, _stage_fn(cfg, cfg.pipeline.curriculum[index - 1], prev))


def oracle_run(cfg: Config, domain: str) -> Run:
    return Run(cfg, f"oracle_{domain}", sections=STAGE_SECTIONS, inputs=[base_run(cfg)])


def _copy_run_fn(source: Run):
    """Fill a run with the outputs of ``source``, a complete run of the very same job."""
    import shutil

    def fn(run: Run) -> None:
        for rel in ("model", "records"):
            if (source.path / rel).is_dir():
                with run.atomic_dir(rel) as tmp:
                    shutil.copytree(source.path / rel, tmp, dirs_exist_ok=True)
        for rel in ("stage.json", "metrics.json", "train_summary.json", "train_log.jsonl"):
            if (source.path / rel).is_file():
                shutil.copy2(source.path / rel, run.path / rel)
        run.write_json("same_as.json", {"run": source.name, "path": str(source.path),
                                        "why": "same stage recipe from the same base with the same seed"})
        run.logger.info("%s is the same job as the complete run %s: copied, not retrained", run.name, source.name)

    return fn


def run_oracle(cfg: Config, domain: str) -> Run:
    """The single-task oracle for ``domain``: the same stage recipe, from the base.

    The oracle of the curriculum's first domain is the same job as ``seq`` stage 1 (same recipe, same base,
    same seed), so when that stage is complete its outputs are copied instead of trained again
    (``same_as.json`` says so); otherwise the oracle trains.
    """
    base = base_run(cfg)
    if not base.is_complete():
        raise RuntimeError(f"oracles need the complete base run first ({base.path}); run notebook 00")
    twin = oracle_twin(cfg, domain)
    fn = _copy_run_fn(twin) if twin is not None else _stage_fn(cfg, domain, base)
    return run_once(oracle_run(cfg, domain), fn)


def oracle_twin(cfg: Config, domain: str) -> Run | None:
    """The complete run that is the same job as ``oracle_<domain>`` (sequential stage 1 when the curriculum
    starts with ``domain``), or None."""
    if cfg.pipeline.curriculum and cfg.pipeline.curriculum[0] == domain:
        first = sequential_run(cfg, 1)  # its input is the base, as the oracle's is
        if first.is_complete():
            return first
    return None


def checkpoint_names(cfg: Config, oracles: bool = True) -> list[str]:
    names = ["base"] + [sequential_run(cfg, i).name for i in range(1, len(cfg.pipeline.curriculum) + 1)]
    if oracles:
        names += [f"oracle_{d}" for d in cfg.pipeline.curriculum]
    return names
