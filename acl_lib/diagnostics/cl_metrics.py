"""The standard continual-learning metrics over a sequential run's capability matrix.

``R[i][j]`` is the score (percent) on task ``j``'s benchmark after training stage ``i`` (stages and tasks in
curriculum order, ``T`` of each); ``b[j]`` the base's score on it. With ``None`` / NaN for cells a source
does not report (the study's trajectory reports only some), every mean is over the terms it can compute, and
the count of terms is returned beside it.

* average accuracy   ``ACC = mean_j R[T][j]``                               (the final checkpoint, all tasks)
* backward transfer  ``BWT = mean_{j<T} (R[T][j] - R[j][j])``               (negative: forgetting)
* forward transfer   ``FWT = mean_{j>1} (R[j-1][j] - b[j])``                (what earlier stages gave a task
                                                                             before it was trained, vs the base)
* forgetting         ``f_j = max_{k<T} R[k][j] - R[T][j]`` for ``j<T``      (best earlier score minus final;
                                                                             Chaudhry et al. 2018), and its mean

Lopez-Paz & Ranzato (2017) define ACC, BWT and FWT; FWT here is against the base checkpoint, the study's
reference point, rather than a randomly initialised model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from acl_lib.envs import IN_DOMAIN
from acl_lib.pipeline import checkpoint_names
from acl_lib.views import load_scores, paper_results

if TYPE_CHECKING:
    from acl_lib.config import Config


def _ok(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def cl_metrics(R: Sequence[Sequence[float | None]], base: Sequence[float | None] | None = None,
               tasks: Sequence[str] | None = None) -> dict:
    """The metrics above for a ``T x T`` matrix ``R`` (rows: after stage i; columns: task j) and the base row.

    Returns ``{"average_accuracy", "backward_transfer", "forward_transfer", "mean_forgetting",
    "forgetting": {task: f_j}, "n_terms": {metric: terms used}}``; a metric no term can be computed for is None."""
    T = len(R)
    if any(len(row) != T for row in R):
        raise ValueError("the capability matrix must be square (T stages x T tasks), got rows of "
                         f"{[len(r) for r in R]}")
    tasks = list(tasks) if tasks is not None else [str(j) for j in range(T)]
    if len(tasks) != T:
        raise ValueError(f"{len(tasks)} task names for a {T} x {T} matrix")
    base = list(base) if base is not None else [None] * T
    final = R[T - 1] if T else []
    acc = [final[j] for j in range(T) if _ok(final[j])]
    bwt = [final[j] - R[j][j] for j in range(T - 1) if _ok(final[j]) and _ok(R[j][j])]
    fwt = [R[j - 1][j] - base[j] for j in range(1, T) if _ok(R[j - 1][j]) and _ok(base[j])]
    forgetting = {}
    for j in range(T - 1):
        earlier = [R[k][j] for k in range(T - 1) if _ok(R[k][j])]
        if earlier and _ok(final[j]):
            forgetting[tasks[j]] = max(earlier) - final[j]
    return {
        "average_accuracy": _mean(acc), "backward_transfer": _mean(bwt), "forward_transfer": _mean(fwt),
        "mean_forgetting": _mean(list(forgetting.values())), "forgetting": forgetting,
        "n_terms": {"average_accuracy": len(acc), "backward_transfer": len(bwt), "forward_transfer": len(fwt),
                    "forgetting": len(forgetting)},
    }


def capability_matrix(scores: Mapping[str, Mapping[str, float]], stage_runs: Sequence[str],
                      benchmarks: Sequence[str], base: str = "base") -> tuple[list[list], list]:
    """``(R, b)`` from ``{run: {benchmark: score}}`` (``views.load_scores`` or the study's ``sequential``):
    row i = ``stage_runs[i]``, column j = ``benchmarks[j]``; None where a run or a score is absent."""
    R = [[(scores.get(run) or {}).get(b) for b in benchmarks] for run in stage_runs]
    return R, [(scores.get(base) or {}).get(b) for b in benchmarks]


def sequential_cl_metrics(cfg: Config) -> dict:
    """The metrics for this run's sequence (``cfg``'s run store) and for the study's trajectory
    (``paper_results.yaml`` ``sequential``), over the curriculum's in-domain benchmarks, side by side:
    ``{"benchmarks", "stages", "ours": {..., "matrix", "base"}, "study": {...}}``. A stage not run yet leaves
    its row None (the metrics use what is there)."""
    names = checkpoint_names(cfg, oracles=False)
    benchmarks = [IN_DOMAIN[d] for d in cfg.pipeline.curriculum]
    ours = load_scores(cfg.seed_dir(), names)
    out = {"benchmarks": benchmarks, "stages": names[1:], "missing": [n for n in names if n not in ours]}
    R, b = capability_matrix(ours, names[1:], benchmarks)
    out["ours"] = {**cl_metrics(R, b, benchmarks), "matrix": R, "base": b}
    # the study's trajectory is keyed by the study's own run names (its order is math, search, ecom, if)
    study = paper_results()["sequential"]
    paper_names = [f"seq_{d}" for d in cfg.pipeline.curriculum]
    R, b = capability_matrix(study, paper_names, benchmarks)
    out["study"] = {**cl_metrics(R, b, benchmarks), "matrix": R, "base": b}
    return out


def cl_frame(metrics: dict):
    """DataFrame: one row per metric (and per task's forgetting), columns ``ours``, ``study`` and the number of
    terms each used (the study's trajectory reports some cells only)."""
    import pandas as pd

    rows = []
    for key, label in [("average_accuracy", "average accuracy"), ("backward_transfer", "backward transfer"),
                       ("forward_transfer", "forward transfer (vs base)"), ("mean_forgetting", "mean forgetting")]:
        nk = "forgetting" if key == "mean_forgetting" else key
        rows.append({"metric": label, "ours": metrics["ours"][key], "study": metrics["study"][key],
                     "terms (ours)": metrics["ours"]["n_terms"][nk], "terms (study)": metrics["study"]["n_terms"][nk]})
    for b in metrics["benchmarks"][:-1]:
        rows.append({"metric": f"forgetting: {b}", "ours": metrics["ours"]["forgetting"].get(b),
                     "study": metrics["study"]["forgetting"].get(b),
                     "terms (ours)": int(b in metrics["ours"]["forgetting"]),
                     "terms (study)": int(b in metrics["study"]["forgetting"])})
    return pd.DataFrame(rows).set_index("metric")
