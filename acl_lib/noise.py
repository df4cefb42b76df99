"""The noise floor of every comparison the findings make: how far apart two numbers must lie before the suite
calls the gap real, and how small a gap its rules could see at all.

**A score** is a pass rate in percent over ``n`` tasks with ``k_i`` samples each (avg@k; ``N = sum k_i``
episodes). The ``k`` samples of one task are not independent trials: they share the task's difficulty. Its
standard error is therefore **clustered by task** (:func:`clustered_se`), from the per-task pass counts an
evaluation's ``records/<benchmark>.jsonl`` holds (:func:`read_task_counts`): with ``Y_i`` passes of task ``i``,
``p = sum Y_i / N``, the cluster-robust variance of ``p`` is ``V = sum_i (Y_i - p k_i)^2 / N^2``; its design effect
``deff = V / (p (1 - p) / N)`` (clipped to [1, N / n]: a task's samples are never less alike than independent
trials, nor more alike than one trial; ``N / n`` when ``p`` is 0 or 1, where nothing measures how alike they are)
gives the effective number of trials ``N_eff = N / deff``, and the score's SE is the Agresti-Coull one at that
size, so a score of 0 or 100 still carries the uncertainty of its sample::

    p~ = (p N_eff + 2) / (N_eff + 4)        SE = 100 * sqrt(p~ (1 - p~) / (N_eff + 4))

At avg@1 (``deff = 1``) this is the binomial SE of ``n`` trials; at avg@k it lies between the binomial SE of
``n k`` trials (:func:`binomial_se`, what the suite used before) and that of ``n``. Without records (a store
written before them, or a ``metrics.json`` alone) the binomial SE of ``n k`` trials is the **fallback**; it is too
small wherever tasks differ in difficulty.

**A difference** of two checkpoints scored on the same tasks is **paired** (:func:`contrast_se`, any weighted sum
``sum_r w_r p_r`` of runs on the same tasks): per task the contribution ``c_i = sum_r w_r (Y_i^r - p_r k_i^r) /
N_r``, the paired variance ``sum_i c_i^2`` (the per-task differences' own spread, so what the two checkpoints share
cancels), plus each score's Agresti-Coull floor where it exceeds that score's raw variance (``w_r^2 max(0,
SE_r^2 - V_r)``: a zero score still carries its floor) and Agresti-Min's half a discordant episode each way
(``(sum |w_r| / 2)^2 / (N + 2)^2``: two checkpoints that agree on every episode still carry the noise of N
episodes). Runs scored on different tasks are taken as independent.

**Over seeds** (``S`` seeds) the estimate is the mean of the seeds' values, and its standard error combines the
per-seed standard error with the spread over seeds (sample std ``s``, ``ddof=1``; none with one seed)::

    SE = sqrt( sum_i SE_i^2 / S^2  +  s^2 / S )

Both terms are kept although the spread already holds some sampling noise: with three seeds ``s`` is itself
poorly known, and the sum errs on the side of calling fewer gaps real. A difference over seeds is the mean of the
per-seed (paired) differences with the same combination. A quantity that is not a pass rate (a cosine, a
displacement ratio, a fraction of token positions) carries the spread over seeds and, where given, its own
per-seed standard error in the same way.

**Beyond noise**: a difference ``d`` is beyond noise when ``|d| > BEYOND * SE_d`` (``BEYOND = 2``); a value is
above a threshold *on its confidence bound* when ``value - BEYOND * SE`` is. **Power**: the smallest true effect a
beyond-noise test detects with probability ``POWER`` (0.8) is ``(BEYOND + z_0.8) * SE`` (:func:`detectable`,
about 2.84 SE), the minimum detectable effect.

This module is the ground layer: it imports nothing from ``acl_lib``.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BEYOND = 2.0  # "beyond noise": more than this many standard errors apart
POWER = 0.8  # the power at which the minimum detectable effect is stated
Z_POWER = 0.8416  # the standard normal's 0.8 quantile
PASS_EPS = 1e-9  # an episode passes at reward >= 1 - PASS_EPS (the evaluation harness's rule)

FORMULA = ("standard error of each score clustered by task (the k samples of a task are one cluster: Agresti-Coull "
           "at the effective number of trials N / deff, deff the design effect of the per-task pass counts in "
           "records/<benchmark>.jsonl; the binomial SE of n x k trials as the fallback where a run has no records), "
           "paired per task for a difference of checkpoints scored on the same tasks, combined with the spread over "
           f"seeds: SE = sqrt(sum SE_i^2 / S^2 + s^2 / S) over S seeds; beyond noise = more than {BEYOND:g} SE; "
           f"power = the smallest effect detected with probability {POWER:g}, ({BEYOND:g} + {Z_POWER:.2f}) SE")


def _number(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def _agresti_coull_var(p: float, trials: float) -> float:
    """Variance (fraction^2) of a pass rate ``p`` in [0, 1] over ``trials`` (possibly effective) trials, Agresti-Coull
    "plus four"."""
    q = (p * trials + 2.0) / (trials + 4.0)
    return q * (1.0 - q) / (trials + 4.0)


def binomial_se(score: float, n_tasks: int, k: int = 1) -> float:
    """Standard error (percentage points) of a pass rate ``score`` (percent) on ``n_tasks`` tasks with ``k``
    samples each, counting the ``n k`` episodes as independent trials (Agresti-Coull). Right at avg@1; at avg@k the
    fallback for a run without records (:func:`clustered_se` is the right one). Raises ``ValueError`` for no tasks
    or a score outside [0, 100]."""
    trials = int(n_tasks) * int(k)
    if trials < 1:
        raise ValueError(f"a score needs at least one task and one sample, got n_tasks={n_tasks}, k={k}")
    if not -1e-9 <= score <= 100 + 1e-9:
        raise ValueError(f"a score is a percentage in [0, 100], got {score}")
    return 100.0 * math.sqrt(_agresti_coull_var(score / 100.0, trials))


# --- per-task pass counts: what a score is clustered by ---------------------------------------------------------


@dataclass(frozen=True, eq=False)
class TaskCounts:
    """One benchmark's evaluation as per-task pass counts: ``ids[i]`` the task, ``passes[i]`` how many of its
    ``samples[i]`` episodes passed (int arrays of one length, ``n_tasks``)."""

    ids: tuple[str, ...]
    passes: np.ndarray
    samples: np.ndarray

    def __post_init__(self):
        if not (len(self.ids) == len(self.passes) == len(self.samples)):
            raise ValueError("ids, passes and samples must have one length")
        bad = np.any(self.samples < 1) or np.any(self.passes < 0) or np.any(self.passes > self.samples)
        if len(self.ids) and bad:
            raise ValueError("each task needs 0 <= passes <= samples and at least one sample")

    @classmethod
    def from_arrays(cls, passes, samples, ids: Sequence[str] | None = None) -> TaskCounts:
        """From per-task ``passes`` and ``samples`` (an int broadcasts: the same k for every task); ``ids``
        default to ``"0", "1", ...``."""
        passes = np.asarray(passes, dtype=np.int64)
        samples = np.broadcast_to(np.asarray(samples, dtype=np.int64), passes.shape).copy()
        ids = tuple(str(i) for i in (ids if ids is not None else range(len(passes))))
        return cls(ids, passes, samples)

    @classmethod
    def from_episodes(cls, episodes: Iterable[tuple[str, bool]]) -> TaskCounts:
        """From ``(task id, passed)`` per episode, tasks in the order first seen."""
        at: dict[str, int] = {}
        passes: list[int] = []
        samples: list[int] = []
        for tid, ok in episodes:
            i = at.setdefault(str(tid), len(at))
            if i == len(passes):
                passes.append(0)
                samples.append(0)
            passes[i] += bool(ok)
            samples[i] += 1
        return cls.from_arrays(passes, samples, list(at))

    @property
    def n_tasks(self) -> int:
        return len(self.ids)

    @property
    def episodes(self) -> int:
        return int(self.samples.sum())

    @property
    def score(self) -> float:
        """The pass rate over every episode, in percent (what ``metrics.json`` reports)."""
        return 100.0 * float(self.passes.sum()) / max(1, self.episodes)


def read_task_counts(path: str | Path) -> TaskCounts | None:
    """The per-task pass counts of one ``records/<benchmark>.jsonl`` (one JSON line per episode with its task
    ``id`` and ``reward``; passed at ``reward >= 1 - PASS_EPS``), or None when the file is missing, empty or
    unreadable."""
    try:
        with open(path) as f:
            eps = [(r["id"], float(r["reward"]) >= 1.0 - PASS_EPS) for r in map(json.loads, filter(str.strip, f))]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return TaskCounts.from_episodes(eps) if eps else None


def _raw(tc: TaskCounts) -> tuple[float, np.ndarray]:
    """``(p, r)``: the pass rate (fraction) and each task's residual ``(Y_i - p k_i) / N``."""
    n_ep = tc.episodes
    p = float(tc.passes.sum()) / n_ep
    return p, (tc.passes - p * tc.samples) / n_ep


def design_effect(tc: TaskCounts) -> float:
    """The design effect of ``tc``'s clustering: its cluster-robust variance over the binomial one, clipped to
    [1, N / n]; ``N / n`` (the mean samples per task) when every episode passed or none did."""
    p, r = _raw(tc)
    top = tc.episodes / tc.n_tasks
    if p * (1.0 - p) <= 0.0:
        return top
    return min(top, max(1.0, float(np.sum(r * r)) / (p * (1.0 - p) / tc.episodes)))


def clustered_se(tc: TaskCounts) -> float:
    """Standard error (percentage points) of ``tc``'s score, clustered by task: Agresti-Coull at the effective
    number of trials ``N / deff`` (module docstring). Equals :func:`binomial_se` of ``n`` tasks at avg@1."""
    if tc.n_tasks < 1:
        raise ValueError("a score needs at least one task")
    p = float(tc.passes.sum()) / tc.episodes
    return 100.0 * math.sqrt(_agresti_coull_var(p, tc.episodes / design_effect(tc)))


def same_tasks(parts: Sequence[TaskCounts]) -> bool:
    """Whether every one of ``parts`` scored the same tasks (the same ids, in any order)."""
    first = set(parts[0].ids)
    return all(len(p.ids) == len(first) and set(p.ids) == first for p in parts[1:])


def contrast_se(parts: Sequence[tuple[float, TaskCounts]]) -> float:
    """Standard error (points) of ``sum_r w_r score_r`` over ``parts`` ``[(w_r, counts_r)]``, paired by task when
    they all scored the same tasks (module docstring), else the runs taken as independent
    (``sqrt(sum w_r^2 SE_r^2)``). ``[(1, a), (-1, b)]`` is the paired SE of ``a - b``."""
    if not parts:
        raise ValueError("a contrast needs at least one score")
    ses = [clustered_se(tc) / 100.0 for _, tc in parts]
    if not same_tasks([tc for _, tc in parts]):
        return 100.0 * math.sqrt(sum((w * s) ** 2 for (w, _), s in zip(parts, ses)))
    order = {tid: i for i, tid in enumerate(parts[0][1].ids)}
    c = np.zeros(len(order))
    floor = 0.0
    for (w, tc), se in zip(parts, ses):
        _, r = _raw(tc)
        idx = np.fromiter((order[t] for t in tc.ids), dtype=np.int64, count=tc.n_tasks)
        np.add.at(c, idx, w * r)
        floor += w * w * max(0.0, se * se - float(np.sum(r * r)))
    # Agresti-Min's half a discordant episode each way: a gap between checkpoints that agree on every episode still
    # carries the noise of its N episodes
    episodes = statistics.fmean(tc.episodes for _, tc in parts)
    floor += (sum(abs(w) for w, _ in parts) / 2.0) ** 2 / (episodes + 2.0) ** 2
    return 100.0 * math.sqrt(float(np.sum(c * c)) + floor)


def samples_per_task(metrics: dict, benchmark: str) -> int:
    """The samples per task (the k of avg@k) ``benchmark`` was scored with, from a ``metrics.json``: its entry of
    ``k_by_benchmark``, else ``k`` (one number for every benchmark in files written before the per-benchmark k,
    or ``{benchmark: k}``), else 1."""
    by = metrics.get("k_by_benchmark")
    if isinstance(by, dict) and by.get(benchmark) is not None:
        return int(by[benchmark])
    k = metrics.get("k")
    if isinstance(k, dict):
        k = k.get(benchmark)
    return int(k) if k is not None else 1


def score_se(metrics: dict, benchmark: str, counts: TaskCounts | None = None) -> float | None:
    """The standard error (points) of ``benchmark``'s score in a ``metrics.json``: clustered by task from
    ``counts`` (:func:`read_task_counts` of the same evaluation's records) when given and they hold the score;
    else the binomial fallback, ``metrics.json``'s own ``se`` entry or computed from ``scores``, ``n_tasks`` and
    :func:`samples_per_task`; None when the score or its task count is unknown."""
    score = (metrics.get("scores") or {}).get(benchmark)
    if counts is not None and matches(counts, score):
        return clustered_se(counts)
    se = (metrics.get("se") or {}).get(benchmark)
    if _number(se):
        return float(se)
    n = (metrics.get("n_tasks") or {}).get(benchmark)
    if not _number(score) or not n:
        return None
    return binomial_se(score, n, samples_per_task(metrics, benchmark))


def matches(counts: TaskCounts | None, score: float | None) -> bool:
    """Whether ``counts`` give ``score`` (percent): records of the evaluation the score came from."""
    return counts is not None and _number(score) and abs(counts.score - float(score)) < 1e-6


def detectable(se: float) -> float:
    """The minimum detectable effect of a beyond-noise test at standard error ``se``: the true gap it detects with
    probability :data:`POWER`, ``(BEYOND + Z_POWER) * se``."""
    return (BEYOND + Z_POWER) * se


@dataclass(frozen=True)
class Estimate:
    """A number measured over one or more seeds with its standard error.

    ``value``: the mean over the seeds; ``se``: its combined standard error (same unit as ``value``);
    ``seeds``: how many seeds it averages; ``spread``: the sample std over them (0.0 with one);
    ``sampling``: the standard error of the mean from the per-seed errors alone (the clustered or paired part for a
    score), None when they are unknown (a ``metrics.json`` without ``n_tasks``)."""

    value: float
    se: float
    seeds: int = 1
    spread: float = 0.0
    sampling: float | None = None

    @classmethod
    def of_values(cls, values: Sequence[float | None], ses: Sequence[float | None] | None = None) -> Estimate | None:
        """The estimate from per-seed ``values`` and, optionally, each one's own standard error ``ses`` (None
        entries and NaNs skipped; None when no value is left). Without ``ses`` only the spread over seeds counts."""
        ses = list(ses) if ses is not None else [None] * len(values)
        if len(ses) != len(values):
            raise ValueError(f"{len(values)} values but {len(ses)} standard errors")
        pairs = [(float(v), e) for v, e in zip(values, ses) if _number(v)]
        if not pairs:
            return None
        xs = [v for v, _ in pairs]
        n = len(xs)
        spread = statistics.stdev(xs) if n > 1 else 0.0
        known = [e for _, e in pairs if _number(e)]
        sampling = math.sqrt(sum(e * e for e in known)) / n if len(known) == n else None
        se = math.sqrt((sampling or 0.0) ** 2 + spread ** 2 / n)
        return cls(statistics.fmean(xs), se, n, spread, sampling)

    @classmethod
    def of_scores(cls, scores: Sequence[float | None], n_tasks: Sequence[int | None] | None = None,
                  k: Sequence[int | None] | None = None) -> Estimate | None:
        """The estimate of a score (percent) from its per-seed values, each seed's number of tasks and samples
        (``k`` defaults to 1 per seed; a seed whose task count is unknown leaves ``sampling`` None), with the
        binomial SE of each seed: the fallback where no records give the clustered one."""
        n_tasks = list(n_tasks) if n_tasks is not None else [None] * len(scores)
        k = list(k) if k is not None else [1] * len(scores)
        ses = [binomial_se(s, n, kk or 1) if _number(s) and n else None for s, n, kk in zip(scores, n_tasks, k)]
        return cls.of_values(scores, ses)

    @classmethod
    def exact(cls, value: float) -> Estimate:
        """A number without error (a threshold, a figure the study reports)."""
        return cls(float(value), 0.0, 0)

    def __sub__(self, other: Estimate | float) -> Estimate:
        """The difference, the two taken as independent (unpaired: for an exact threshold, or numbers measured on
        different tasks; a difference of checkpoints on the same tasks is paired, ``FinalData.contrast``)."""
        other = other if isinstance(other, Estimate) else Estimate.exact(other)
        return combine([self, other], [1.0, -1.0])

    def above(self, other: Estimate | float) -> bool:
        """Whether this is above ``other`` beyond noise (``BEYOND`` combined standard errors), unpaired."""
        d = self - other
        return d.value > BEYOND * d.se

    def below(self, other: Estimate | float) -> bool:
        """Whether this is below ``other`` beyond noise, unpaired."""
        d = self - other
        return -d.value > BEYOND * d.se

    @property
    def low(self) -> float:
        """The lower confidence bound, ``value - BEYOND * se``."""
        return self.value - BEYOND * self.se

    @property
    def high(self) -> float:
        """The upper confidence bound, ``value + BEYOND * se``."""
        return self.value + BEYOND * self.se

    def fmt(self, digits: int = 1) -> str:
        """``"12.3 ± 4.5"``: the value and its combined standard error."""
        return f"{self.value:.{digits}f} ± {self.se:.{digits}f}"

    def as_dict(self) -> dict:
        """JSON-able: value, se, seeds, spread, sampling."""
        return {"value": self.value, "se": self.se, "seeds": self.seeds, "spread": self.spread,
                "sampling": self.sampling}

    __str__ = fmt


def combine(estimates: Sequence[Estimate], weights: Sequence[float]) -> Estimate:
    """``sum_i w_i x_i`` of estimates taken as independent (different benchmarks, a threshold):
    ``SE = sqrt(sum w_i^2 SE_i^2)``; ``seeds`` the fewest of those that have seeds."""
    if not estimates or len(estimates) != len(weights):
        raise ValueError("combine needs as many weights as estimates, at least one")
    samplings = [e.sampling if e.seeds else 0.0 for e in estimates]  # an exact number has no sampling error
    return Estimate(sum(w * e.value for e, w in zip(estimates, weights)),
                    math.sqrt(sum((w * e.se) ** 2 for e, w in zip(estimates, weights))),
                    min((e.seeds for e in estimates if e.seeds), default=0),
                    math.sqrt(sum((w * e.spread) ** 2 for e, w in zip(estimates, weights))),
                    None if any(s is None for s in samplings)
                    else math.sqrt(sum((w * s) ** 2 for s, w in zip(samplings, weights))))


def mean_of(estimates: Sequence[Estimate]) -> Estimate:
    """The mean of several estimates (a suite's mean over benchmarks), their errors taken as independent:
    ``SE = sqrt(sum SE_i^2) / m``."""
    if not estimates:
        raise ValueError("mean_of needs at least one estimate")
    return combine(estimates, [1.0 / len(estimates)] * len(estimates))
