"""The validation grid search: candidate coefficients merged and scored on held-out training tasks, the oracles
scored beside them, and the grid-searched and capability-balanced choices (``merge_validation/validation.json``).

**Validation, never test.** The benchmarks the tables report draw their tasks from each world's ``test`` split
(and OOD splits) with ``worlds.seed``. The worlds have no validation split, so coefficients are chosen on tasks of
each domain's *training* split drawn with ``validation_seed(cfg)`` (``VALIDATION_SEED + worlds.seed``), a seed no
training job uses (stages draw their training tasks with the training seed and the seed + 1): held out from the
reported test tasks by construction, from the same distribution as training. ``validation.json`` records the
split, the seed and the task ids scored, so the choice can be checked.
"""

from __future__ import annotations

import itertools
import logging
import math
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from acl_lib import pipeline
from acl_lib.consolidate.merging.merge import merge_checkpoints
from acl_lib.consolidate.merging.specs import checkpoint_runs, complete_inputs
from acl_lib.envs import BENCHMARKS, IN_DOMAIN
from acl_lib.eval import harness, policies  # called through the modules: tests swap harness.world
from acl_lib.eval.sharding import visible_gpus
from acl_lib.model.checkpoint_files import resolve_model_dir
from acl_lib.processes import call_in_child, map_in_children
from acl_lib.progress import maybe_progress
from acl_lib.runs import Run, run_once
from acl_lib.seeding import seed_and_threads

if TYPE_CHECKING:
    from acl_lib.config import Config

log = logging.getLogger("acl.consolidate.merging")

VALIDATION_SPLIT = "train"  # no world has a validation split: held-out draws of the training split (module docstring)
VALIDATION_SEED = 7919  # + worlds.seed; training draws its tasks with the training seed and seed + 1
VALIDATION_SECTIONS = ("model", "worlds", "eval")  # the validation search also scores (worlds, sampling settings)
VALIDATION_RUN = "merge_validation"


def validation_seed(cfg: Config) -> int:
    return VALIDATION_SEED + cfg.worlds.seed


def domain_benchmark(domain: str):
    return BENCHMARKS[IN_DOMAIN[domain]]


def validation_tasks(cfg: Config, domain: str, n: int, envs: dict | None = None) -> list:
    """``n`` validation tasks of ``domain``: its in-domain benchmark's world, split ``VALIDATION_SPLIT``, drawn
    with ``validation_seed(cfg)`` (see the module docstring)."""
    bench = domain_benchmark(domain)
    envs = {} if envs is None else envs
    if bench.env not in envs:
        envs[bench.env] = harness.world(cfg, bench.env)
    return envs[bench.env].tasks(VALIDATION_SPLIT, n, seed=validation_seed(cfg))


def validation_scores(cfg: Config, model: str, domains: Sequence[str], n_tasks: int, record: dict | None = None,
                      envs: dict | None = None) -> dict:
    """Score ``model`` (a checkpoint directory, or ``expert`` / ``null``) on ``n_tasks`` validation tasks of
    each domain's in-domain benchmark, greedy or with the profile's sampling settings, one sample per task.
    Returns ``{domain: percent}``; ``record`` (if given) receives the task ids scored per domain; ``envs``: a
    dict that keeps the worlds built between calls (a search scores many candidates on the same worlds)."""
    if n_tasks < 1:
        raise ValueError(f"validation needs at least one task per domain, got {n_tasks}")
    if cfg.launcher.eval_subprocess and model not in ("expert", "null"):
        # the candidate's engine in a process of its own (up to ~20 per search): its GPU memory goes with it
        scores, ids = call_in_child(_validation_in_child, cfg, str(model), list(domains), n_tasks)
        if record is not None:
            record.update(ids)
        return scores
    if model not in ("expert", "null"):
        seed_and_threads(cfg.seed, cfg.torch_threads)
    policy = policies.make_policy(str(model), cfg)
    envs = {} if envs is None else envs
    scores = {}
    try:
        for d in domains:
            bench = domain_benchmark(d)
            tasks = validation_tasks(cfg, d, n_tasks, envs)
            max_turns, max_new_tokens = cfg.eval.limits_for(bench.key)
            if hasattr(policy, "max_new_tokens"):
                policy.max_new_tokens = max_new_tokens
            summary, _ = harness.evaluate_benchmark(policy, bench, envs[bench.env], len(tasks), 1, max_turns,
                                                    batch_size=max(cfg.eval.batch_size, 1) * 4, tasks=tasks)
            scores[d] = summary["score"]
            if record is not None:
                record[d] = [t.id for t in tasks]
    finally:
        if hasattr(policy, "close"):
            policy.close()
    return scores


def _validation_in_child(cfg: Config, model: str, domains: list[str], n_tasks: int) -> tuple[dict, dict]:
    record: dict = {}
    no_child = cfg.model_copy(update={"launcher": cfg.launcher.model_copy(update={"eval_subprocess": False})})
    return validation_scores(no_child, model, domains, n_tasks, record), record


def candidate_grid(grid: Sequence[float], k: int) -> list[tuple[float, ...]]:
    """Every lambda vector with entries from ``grid`` (K = ``k`` checkpoints), the all-zero one (the base) left
    out: ``len(grid) ** k`` candidates, so keep the grid short (2 values -> 16 candidates for 4 stages)."""
    if not grid:
        raise ValueError("the coefficient grid is empty")
    if not all(math.isfinite(float(g)) for g in grid):
        raise ValueError(f"grid values must be finite, got {list(grid)}")
    values = sorted(dict.fromkeys(float(g) for g in grid))
    return [c for c in itertools.product(values, repeat=k) if any(v != 0 for v in c)]


def relative_scores(scores: Mapping[str, float], oracle: Mapping[str, float]) -> dict[str, float]:
    """Each domain's validation score over its oracle's (1.0 = the oracle's level). A domain whose oracle scores
    0 on validation has nothing to recover and is left out."""
    return {d: scores[d] / oracle[d] for d in scores if oracle.get(d)}


def choose(candidates: list[dict], oracle: Mapping[str, float]) -> dict:
    """From scored candidates (``{"weights", "scores": {domain: %}}``) the grid-searched choice (best mean
    validation score) and the capability-balanced one (best worst-domain score relative to its oracle; the mean
    breaks ties; with no oracle above 0 it falls back to the mean). Ties keep the earlier candidate. Returns
    ``{"grid": candidate, "balanced": candidate}``, each with its ``mean`` and ``worst_relative``."""
    if not candidates:
        raise ValueError("no candidates to choose from")
    for c in candidates:
        c["mean"] = sum(c["scores"].values()) / len(c["scores"])
        rel = relative_scores(c["scores"], oracle)
        c["worst_relative"] = min(rel.values()) if rel else None
    grid = max(candidates, key=lambda c: c["mean"])  # max keeps the first of equals
    balanced = max(candidates, key=lambda c: (c["worst_relative"] if c["worst_relative"] is not None else -1.0,
                                              c["mean"]))
    return {"grid": grid, "balanced": balanced}


def search_weights(base_dir, source_dirs: Sequence, candidates: Sequence[Sequence[float]],
                   scorer: Callable[[str], dict], work_dir, progress: bool = False) -> list[dict]:
    """Merge each candidate lambda into ``work_dir/candidate`` (task arithmetic), score it with
    ``scorer(model_dir) -> {domain: %}`` and remove it. Returns ``[{"weights", "scores"}]`` in candidate order."""
    work = Path(work_dir) / "candidate"
    out = []
    with maybe_progress(progress, len(candidates), "validation", "candidate") as bar:
        for lam in candidates:
            shutil.rmtree(work, ignore_errors=True)
            merge_checkpoints(base_dir, source_dirs, lam, work)
            scores = scorer(str(work))
            shutil.rmtree(work, ignore_errors=True)
            out.append({"weights": [float(w) for w in lam], "scores": scores})
            bar.update(1, mean=round(sum(scores.values()) / max(1, len(scores)), 1))
    return out


def _score_shard(cfg: Config, base_dir: str, source_dirs: list[str], candidates: list, domains: list[str],
                 n_tasks: int, work_dir: str) -> list[dict]:
    """A share of the candidates merged and scored in a process of its own (``score_candidates``)."""
    no_child = cfg.model_copy(update={"launcher": cfg.launcher.model_copy(update={"eval_subprocess": False})})
    envs: dict = {}
    return search_weights(base_dir, source_dirs, candidates,
                          lambda m: validation_scores(no_child, m, domains, n_tasks, envs=envs), work_dir)


def score_candidates(cfg: Config, base_dir, source_dirs: Sequence, candidates: Sequence[Sequence[float]],
                     domains: Sequence[str], n_tasks: int, work_dir, shards: int = 1) -> list[dict]:
    """``search_weights`` with ``validation_scores`` on ``domains``; with ``shards`` > 1 the candidates are split
    over that many processes at once (every n-th candidate each, one GPU each where there are GPUs, each merging
    into a work directory of its own) and their scores put back in candidate order: the same list as one process
    wherever scores do not depend on which process ran them (greedy validation, the per-episode sampling streams)."""
    n = min(shards, len(candidates))
    if n <= 1:
        envs: dict = {}
        return search_weights(base_dir, source_dirs, candidates,
                              lambda m: validation_scores(cfg, m, domains, n_tasks, envs=envs), work_dir, progress=True)
    gpus = visible_gpus()
    sub = cfg if gpus else cfg.model_copy(update={"torch_threads": max(1, cfg.torch_threads // n)})
    calls = [(sub, str(base_dir), [str(s) for s in source_dirs], [list(c) for c in candidates[i::n]], list(domains),
              n_tasks, str(Path(work_dir) / f"shard{i}")) for i in range(n)]
    envs_ = [{"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]} if gpus else {} for i in range(n)]
    log.info("merge validation: %d candidates over %d processes", len(candidates), n)
    parts = map_in_children(_score_shard, calls, envs_)
    return [parts[j % n][j // n] for j in range(len(candidates))]


def validation_run(cfg: Config, sources: Sequence[str], grid: Sequence[float], n_tasks: int):
    known = checkpoint_runs(cfg)
    oracles = [known[f"oracle_{d}"] for d in cfg.pipeline.curriculum]
    inputs = [pipeline.base_run(cfg)] + [known[n] for n in sources if n in known] + oracles
    return Run(cfg, VALIDATION_RUN, sections=VALIDATION_SECTIONS, inputs=inputs,
               extra={"sources": list(sources), "grid": [float(g) for g in grid], "n_tasks": n_tasks,
                      "split": VALIDATION_SPLIT, "validation_seed": validation_seed(cfg)})


def run_validation_search(cfg: Config, sources: Sequence[str], grid: Sequence[float], n_tasks: int) -> dict:
    """Score every candidate of ``candidate_grid(grid, len(sources))`` and each oracle (on its own domain) on the
    validation tasks, choose the grid-searched and the capability-balanced coefficients; a run of its own
    (``merge_validation/validation.json``), skipped when complete. Returns that JSON."""
    domains = list(cfg.pipeline.curriculum)
    oracle_names = [f"oracle_{d}" for d in domains]
    runs = complete_inputs(cfg, list(sources) + oracle_names)
    base_dir = pipeline.model_dir(runs[0])
    source_dirs = [pipeline.model_dir(r) for r in runs[1:1 + len(sources)]]
    oracle_dirs = {d: pipeline.model_dir(r) for d, r in zip(domains, runs[1 + len(sources):])}
    candidates = candidate_grid(grid, len(sources))

    def fn(run) -> None:
        task_ids: dict = {}
        envs: dict = {}
        oracle = {}
        with maybe_progress(True, len(oracle_dirs), "validation: oracles", "oracle") as bar:
            for d, m in oracle_dirs.items():
                oracle[d] = validation_scores(cfg, str(m), [d], n_tasks, task_ids, envs)[d]
                bar.update(1, **{d: round(oracle[d], 1)})
        # A domain whose own oracle scores 0 on validation has nothing a merge could recover (at the mini profile,
        # the retail desk): the candidates are not scored there, which spares its long multi-turn episodes.
        scored_domains = [d for d in domains if oracle[d] > 0] or domains
        scored = score_candidates(cfg, resolve_model_dir(base_dir), source_dirs, candidates, scored_domains,
                                  n_tasks, run.path, shards=cfg.eval.shards)
        chosen = choose(scored, oracle)
        run.write_json("validation.json", {
            "split": VALIDATION_SPLIT, "validation_seed": validation_seed(cfg), "n_tasks": n_tasks,
            "task_ids": task_ids, "sources": list(sources), "grid": [float(g) for g in grid],
            "scored_domains": scored_domains, "oracle_scores": oracle, "candidates": scored,
            "chosen": {k: {"weights": c["weights"], "scores": c["scores"], "mean": c["mean"],
                           "worst_relative": c["worst_relative"]} for k, c in chosen.items()},
        })

    run = run_once(validation_run(cfg, sources, grid, n_tasks), fn)
    return run.read_json("validation.json")
