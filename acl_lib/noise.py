"""The noise floor of every comparison the findings make: how far apart two numbers must lie before the suite
calls the gap real.

A score is a pass rate in percent measured on ``n`` tasks with ``k`` samples each (``<run>/eval/metrics.json``:
``scores``, ``n_tasks``, ``k_by_benchmark``; each benchmark may have its own k, read with :func:`samples_per_task`).
Its **binomial standard error**, in percentage points, counts the ``N = n * k`` episodes as Bernoulli trials, with
the Agresti-Coull "plus four" correction so that a score of 0 or 100 still carries the uncertainty of its sample
size::

    p~ = (p * N + 2) / (N + 4)            SE_binomial = 100 * sqrt(p~ * (1 - p~) / (N + 4))

(32 tasks at 50%: 8.3 points; 32 tasks at 0%: 3.8 points.) Over ``S`` seeds the estimate is the mean of the
seeds' values, and its standard error **combines** the binomial part with the spread over seeds (sample std
``s``, ``ddof=1``; none with one seed)::

    SE = sqrt( sum_i SE_binomial,i^2 / S^2  +  s^2 / S )

Both terms are kept although the spread already holds some sampling noise: with three seeds ``s`` is itself
poorly known, and the sum errs on the side of calling fewer gaps real. A quantity that is not a pass rate (a
cosine, a displacement ratio, a fraction of token positions) carries the spread over seeds and, where given, its
own per-seed standard error in the same way.

**Beyond noise**: ``a`` is above ``b`` beyond noise when ``a - b > BEYOND * sqrt(SE_a^2 + SE_b^2)``, with
``BEYOND = 2`` (the two estimates are taken as independent; a difference computed inside one seed is not paired).

This module is the ground layer: it imports nothing from ``acl_lib``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

BEYOND = 2.0  # "beyond noise": more than this many combined standard errors apart

FORMULA = ("binomial SE of each score from its n tasks x k samples (Agresti-Coull: p~ = (pN + 2)/(N + 4), "
           "SE = sqrt(p~(1 - p~)/(N + 4)), N = n k), combined with the spread over seeds: "
           "SE = sqrt(sum SE_i^2 / S^2 + s^2 / S) over S seeds; beyond noise = a gap of more than "
           f"{BEYOND:g} x sqrt(SE_a^2 + SE_b^2)")


def _number(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


def binomial_se(score: float, n_tasks: int, k: int = 1) -> float:
    """Standard error (percentage points) of a pass rate ``score`` (percent) measured on ``n_tasks`` tasks with
    ``k`` samples each (module docstring). Raises ``ValueError`` for no tasks or a score outside [0, 100]."""
    trials = int(n_tasks) * int(k)
    if trials < 1:
        raise ValueError(f"a score needs at least one task and one sample, got n_tasks={n_tasks}, k={k}")
    if not -1e-9 <= score <= 100 + 1e-9:
        raise ValueError(f"a score is a percentage in [0, 100], got {score}")
    p = (score / 100.0 * trials + 2.0) / (trials + 4.0)
    return 100.0 * math.sqrt(p * (1.0 - p) / (trials + 4.0))


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


def score_se(metrics: dict, benchmark: str) -> float | None:
    """The binomial standard error (points) of ``benchmark``'s score in a ``metrics.json``: its ``se`` entry, or
    computed from ``scores``, ``n_tasks`` and :func:`samples_per_task` (files written before ``se``); None when
    the score or its task count is unknown."""
    se = (metrics.get("se") or {}).get(benchmark)
    if _number(se):
        return float(se)
    score, n = (metrics.get("scores") or {}).get(benchmark), (metrics.get("n_tasks") or {}).get(benchmark)
    if not _number(score) or not n:
        return None
    return binomial_se(score, n, samples_per_task(metrics, benchmark))


@dataclass(frozen=True)
class Estimate:
    """A number measured over one or more seeds with its standard error.

    ``value``: the mean over the seeds; ``se``: its combined standard error (same unit as ``value``);
    ``seeds``: how many seeds it averages; ``spread``: the sample std over them (0.0 with one);
    ``sampling``: the standard error of the mean from the per-seed errors alone (the binomial part for a score),
    None when they are unknown (a ``metrics.json`` without ``n_tasks``)."""

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
        (``k`` defaults to 1 per seed; a seed whose task count is unknown leaves ``sampling`` None)."""
        n_tasks = list(n_tasks) if n_tasks is not None else [None] * len(scores)
        k = list(k) if k is not None else [1] * len(scores)
        ses = [binomial_se(s, n, kk or 1) if _number(s) and n else None for s, n, kk in zip(scores, n_tasks, k)]
        return cls.of_values(scores, ses)

    @classmethod
    def exact(cls, value: float) -> Estimate:
        """A number without error (a threshold, a figure the study reports)."""
        return cls(float(value), 0.0, 0)

    def __sub__(self, other: Estimate | float) -> Estimate:
        other = other if isinstance(other, Estimate) else Estimate.exact(other)
        sampling = (None if self.sampling is None or other.sampling is None
                    else math.hypot(self.sampling, other.sampling))
        seeds = min((n for n in (self.seeds, other.seeds) if n), default=0)  # an exact number has no seeds
        return Estimate(self.value - other.value, math.hypot(self.se, other.se), seeds,
                        math.hypot(self.spread, other.spread), sampling)

    def above(self, other: Estimate | float) -> bool:
        """Whether this is above ``other`` beyond noise (``BEYOND`` combined standard errors)."""
        d = self - other
        return d.value > BEYOND * d.se

    def below(self, other: Estimate | float) -> bool:
        """Whether this is below ``other`` beyond noise."""
        d = self - other
        return -d.value > BEYOND * d.se

    def fmt(self, digits: int = 1) -> str:
        """``"12.3 ± 4.5"``: the value and its combined standard error."""
        return f"{self.value:.{digits}f} ± {self.se:.{digits}f}"

    def as_dict(self) -> dict:
        """JSON-able: value, se, seeds, spread, sampling."""
        return {"value": self.value, "se": self.se, "seeds": self.seeds, "spread": self.spread,
                "sampling": self.sampling}

    __str__ = fmt


def mean_of(estimates: Sequence[Estimate]) -> Estimate:
    """The mean of several estimates (a suite's mean over benchmarks), their errors taken as independent:
    ``SE = sqrt(sum SE_i^2) / m``."""
    if not estimates:
        raise ValueError("mean_of needs at least one estimate")
    m = len(estimates)
    sampling = ([e.sampling for e in estimates] if all(e.sampling is not None for e in estimates) else None)
    return Estimate(statistics.fmean(e.value for e in estimates), math.sqrt(sum(e.se ** 2 for e in estimates)) / m,
                    min(e.seeds for e in estimates), math.sqrt(sum(e.spread ** 2 for e in estimates)) / m,
                    None if sampling is None else math.sqrt(sum(s * s for s in sampling)) / m)
