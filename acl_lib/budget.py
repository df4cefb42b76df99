"""Where a seed's compute goes: each run's wall time, its training jobs and their budgets, grouped by the study's
steps (``acl_lib.steps``), as shares of the seed.

    rows = run_rows(cfg.seed_dir())           # one row per complete run of a seed directory
    parts = part_rows([rows_seed0, rows_seed1, ...])   # per step: mean wall time over the seeds and its share
    print(budget_markdown(parts, rl_budgets(rows)))

A run's time is its ``COMPLETE.json`` ``duration_s`` (notebooks run two at a time, so run-seconds overlap: the
shares are of the seed's run-seconds, not of its wall clock). Its training jobs are the ``train_summary.json``
files under it: ``job`` (sft, grpo, lora_grpo, mmopd, ...), optimizer ``steps``, ``wall_s``, and the rollouts of RL
jobs (``steps`` x completions per step: ``grpo.batch_size``, ``mmopd.batch_size``) or the rows an SFT job saw
(``steps`` x ``sft.batch_size``), read from the summary where it records them and else from the nearest
``config.yaml`` above it (the run's resolved config). A run's evaluation is its nested run ``<run>/eval``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from statistics import mean

import yaml

from acl_lib import steps

RL_JOBS = {"grpo": "grpo", "lora_grpo": "grpo", "mmopd": "mmopd"}  # job -> the config section of its batch size
SFT_JOBS = {"sft", "lora_sft", "sdft", "midtrain", "pretrain"}


def _json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _section_above(path: Path, top: Path, section: str) -> dict:
    """Config section ``section`` of the nearest ``config.yaml`` from ``path``'s folder up to ``top`` (the run
    directory): the run's own recipe where its ``# extra:`` header line carries one (an MLE expert's), else the
    resolved config's; {} if none."""
    for d in (path.parent, *path.parent.parents):
        f = d / "config.yaml"
        if f.is_file():
            text = f.read_text()
            extra = next((json.loads(line[len("# extra: "):]) for line in text.splitlines()
                          if line.startswith("# extra: ")), {})
            return extra.get(section) or (yaml.safe_load(text) or {}).get(section) or {}
        if d == top:
            break
    return {}


def job_row(summary_path: Path, run_dir: Path) -> dict:
    """One training job: ``job``, ``steps``, ``wall_s``, ``rollouts`` (RL jobs) or ``rows_seen`` (SFT jobs)."""
    s = _json(summary_path)
    job, n = s.get("job") or "train", int(s.get("steps") or 0)
    row = {"job": job, "path": str(summary_path.parent.relative_to(run_dir)), "steps": n,
           "wall_s": float(s.get("wall_s") or 0.0), "rollouts": None, "rows_seen": None}
    if job in RL_JOBS:
        per_step = s.get("rollouts_per_step")
        if per_step is None:
            per_step = _section_above(summary_path, run_dir, RL_JOBS[job]).get("batch_size")
        row["rollouts"] = n * int(per_step) if per_step else None
    elif job in SFT_JOBS or "sft" in job:
        per_step = s.get("rows_per_step")
        if per_step is None:
            per_step = _section_above(summary_path, run_dir, "sft").get("batch_size")
        row["rows_seen"] = n * int(per_step) if per_step else None
    return row


def _duration(run_dir: Path) -> float:
    return float(_json(run_dir / "COMPLETE.json").get("duration_s") or 0.0)


def run_rows(seed_dir: str | Path) -> list[dict]:
    """Every complete run of ``seed_dir``: ``run``, ``step`` (the study's step that makes it), ``wall_s`` (its own
    time and its nested runs', its evaluation ``<run>/eval`` among them), ``train_s`` (its jobs' training seconds),
    ``rl_s``, ``eval_s``, ``rollouts`` (its RL jobs'), ``rows_seen``, ``jobs`` and ``same_as`` (a run that is a copy
    of another checkpoint, ``same_as.json``: its jobs cost nothing here, their budgets are counted)."""
    rows = []
    for run_dir in sorted(p for p in Path(seed_dir).iterdir() if (p / "COMPLETE.json").is_file()):
        jobs = [job_row(p, run_dir) for p in sorted(run_dir.rglob("train_summary.json"))]
        copy = _json(run_dir / "same_as.json").get("run")
        nested = [p for p in run_dir.iterdir() if p.is_dir() and (p / "COMPLETE.json").is_file()]
        step = steps.step_of(run_dir.name)
        rollouts = [j["rollouts"] for j in jobs if j["rollouts"] is not None]
        seen = [j["rows_seen"] for j in jobs if j["rows_seen"] is not None]
        spent = [] if copy else jobs
        rows.append({
            "run": run_dir.name, "step": f"{step.notebook} {step.title}" if step else "other",
            "wall_s": _duration(run_dir) + sum(_duration(p) for p in nested),
            "train_s": sum(j["wall_s"] for j in spent), "rl_s": sum(j["wall_s"] for j in spent if j["job"] in RL_JOBS),
            "eval_s": sum(_duration(p) for p in nested if p.name.startswith("eval")),
            "rollouts": sum(rollouts) if rollouts else None, "rows_seen": sum(seen) if seen else None, "jobs": jobs,
            "same_as": copy,
        })
    return rows


def part_rows(seeds: Sequence[Iterable[dict]]) -> list[dict]:
    """Per step, over the seeds' ``run_rows``: mean ``wall_s``, ``train_s``, ``rl_s``, ``eval_s`` a seed and the
    step's ``share`` of a seed's run-seconds, in the steps' table order; the last row is the seed's total."""
    seeds = [list(r) for r in seeds]
    if not seeds or not any(seeds):
        raise ValueError("no complete runs to tabulate")
    order = [f"{s.notebook} {s.title}" for s in steps.TABLE] + ["other"]
    keys = ("wall_s", "train_s", "rl_s", "eval_s")
    out = []
    for part in order:
        per_seed = [[r for r in rows if r["step"] == part] for rows in seeds]
        if not any(per_seed):
            continue
        out.append({"part": part, "runs": sorted({r["run"] for rs in per_seed for r in rs}),
                    **{k: mean(sum(r[k] for r in rs) for rs in per_seed) for k in keys}})
    total = {k: sum(p[k] for p in out) for k in keys}
    for p in out:
        p["share"] = p["wall_s"] / total["wall_s"] if total["wall_s"] else 0.0
    out.append({"part": "total", "runs": [], **total, "share": 1.0})
    return out


def rl_budgets(rows: Iterable[dict]) -> dict[str, int]:
    """Rollouts (steps x completions per step) of each run with RL jobs: the stages', the oracles', MMOPD's and the
    MLE experts' (item 3 of the proportions: an expert's against its oracle's, MMOPD's against a stage's)."""
    return {r["run"]: r["rollouts"] for r in rows if r["rollouts"]}


def budget_markdown(parts: Sequence[dict], budgets: dict[str, int] | None = None, n_seeds: int = 1) -> str:
    """The budget table (per step: run-minutes a seed, its share, training / RL / evaluation minutes), then the RL
    budgets (rollouts) of the runs that have them."""
    lines = [f"| step | minutes a seed{' (mean of ' + str(n_seeds) + ')' if n_seeds > 1 else ''} | share | "
             "training | of which RL | evaluation |", "|---|---:|---:|---:|---:|---:|"]
    for p in parts:
        name = f"**{p['part']}**" if p["part"] == "total" else p["part"]
        lines.append(f"| {name} | {p['wall_s'] / 60:.1f} | {100 * p['share']:.0f}% | {p['train_s'] / 60:.1f} | "
                     f"{p['rl_s'] / 60:.1f} | {p['eval_s'] / 60:.1f} |")
    if budgets:
        lines += ["", "| run | RL rollouts (steps x completions a step) |", "|---|---:|"]
        lines += [f"| {run} | {n:,} |" for run, n in budgets.items()]
    return "\n".join(lines)
