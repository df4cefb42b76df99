"""The noise floor (acl_lib.noise): a score's standard error clustered by task, a difference's paired by task, and
the simulation that checks their 95% intervals cover what they should; the final tables reading them from records."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from acl_lib import final
from acl_lib.noise import (
    TaskCounts,
    binomial_se,
    clustered_se,
    contrast_se,
    design_effect,
    detectable,
    read_task_counts,
    score_se,
)

Z95 = 1.959964
DRAWS = 4000  # per setting: the coverage's own standard error is 0.34 points at 95%


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# Gauss-Hermite nodes for the exact mean of sigmoid(N(mu, sd^2)): the true pass rate of a population of tasks.
_GH_X, _GH_W = np.polynomial.hermite_e.hermegauss(80)


def _mean_pass(mu: float, sd: float) -> float:
    return float((_GH_W * _sigmoid(mu + sd * _GH_X)).sum() / _GH_W.sum())


def _coverage_of_scores(n: int, k: int, seed: int) -> tuple[float, float]:
    """Coverage of score ± 1.96 SE of the true population pass rate, clustered vs binomial, over DRAWS tests of
    ``n`` tasks whose difficulties are drawn from a Beta (its mean uniform in [0.2, 0.6], concentration 3: task-level
    variance), each task sampled ``k`` times (sample-level variance)."""
    rng = np.random.default_rng(seed)
    hit_c = hit_b = 0
    for _ in range(DRAWS):
        mean = rng.uniform(0.2, 0.6)
        p = rng.beta(3 * mean, 3 * (1 - mean), n)
        tc = TaskCounts.from_arrays(rng.binomial(k, p), k)
        hit_c += abs(tc.score - 100 * mean) <= Z95 * clustered_se(tc)
        hit_b += abs(tc.score - 100 * mean) <= Z95 * binomial_se(tc.score, n, k)
    return hit_c / DRAWS, hit_b / DRAWS


def _coverage_of_differences(n: int, k: int, seed: int) -> tuple[float, float]:
    """Coverage of (B - A) ± 1.96 SE of the true difference of two checkpoints scored on the same ``n`` tasks: a
    task's logit difficulty is shared (sd 1.5), checkpoint B shifts it by a common delta and a task-level noise
    (sd 0.7); paired SE vs the two scores' SEs taken as independent."""
    rng = np.random.default_rng(seed)
    hit_p = hit_u = 0
    for _ in range(DRAWS):
        mu, delta = rng.uniform(-1.2, 0.4), rng.uniform(-0.6, 0.6)
        truth = 100 * (_mean_pass(mu + delta, math.hypot(1.5, 0.7)) - _mean_pass(mu, 1.5))
        z = rng.normal(mu, 1.5, n)
        a = TaskCounts.from_arrays(rng.binomial(k, _sigmoid(z)), k)
        b = TaskCounts.from_arrays(rng.binomial(k, _sigmoid(z + delta + rng.normal(0, 0.7, n))), k)
        d = b.score - a.score
        hit_p += abs(d - truth) <= Z95 * contrast_se([(1.0, b), (-1.0, a)])
        hit_u += abs(d - truth) <= Z95 * math.hypot(clustered_se(a), clustered_se(b))
    return hit_p / DRAWS, hit_u / DRAWS


@pytest.mark.parametrize("k", [1, 4])
def test_clustered_intervals_cover_95_percent_and_the_binomial_ones_do_not_at_avg_at_k(k):
    """64 tasks (the size of the mini profile's sampled benchmarks), avg@1 and avg@4."""
    clustered, binomial = _coverage_of_scores(64, k, seed=k)
    assert 0.93 <= clustered <= 0.97, clustered
    if k == 1:
        assert binomial == clustered  # at avg@1 a task is one trial: the two are the same
    else:
        assert binomial < 0.90, binomial  # n x k samples as independent trials: too narrow


@pytest.mark.parametrize("k", [1, 4])
def test_paired_intervals_of_a_difference_cover_95_percent(k):
    paired, unpaired = _coverage_of_differences(64, k, seed=10 + k)
    assert 0.93 <= paired <= 0.97, paired
    assert unpaired > 0.97, unpaired  # what the two checkpoints share on a task does not cancel: too wide


def test_clustered_se_is_the_binomial_one_at_avg_at_1_and_between_n_and_nk_trials_at_avg_at_k():
    rng = np.random.default_rng(0)
    one = TaskCounts.from_arrays(rng.integers(0, 2, 32), 1)
    assert clustered_se(one) == pytest.approx(binomial_se(one.score, 32, 1)) and design_effect(one) == 1.0
    # tasks either always or never solved: the 4 samples of a task are one trial
    alike = TaskCounts.from_arrays([4] * 12 + [0] * 20, 4)
    assert design_effect(alike) == pytest.approx(4.0)
    assert clustered_se(alike) == pytest.approx(binomial_se(alike.score, 32, 1))
    # every task a coin: the samples are independent trials
    coins = TaskCounts.from_arrays([2] * 32, 4)
    assert design_effect(coins) == 1.0 and clustered_se(coins) == pytest.approx(binomial_se(50.0, 32, 4))
    mixed = TaskCounts.from_arrays([4, 0, 2, 3, 1, 4, 0, 0] * 4, 4)
    assert binomial_se(mixed.score, 32, 4) < clustered_se(mixed) < binomial_se(mixed.score, 32, 1)
    # a score of 0 keeps the noise of its n tasks (nothing says how alike their samples are)
    zero = TaskCounts.from_arrays([0] * 32, 4)
    assert clustered_se(zero) == pytest.approx(binomial_se(0.0, 32, 1))
    assert clustered_se(zero) > binomial_se(0.0, 32, 4)


def test_a_paired_difference_cancels_what_the_checkpoints_share():
    a = TaskCounts.from_arrays([1] * 16 + [0] * 16, 1)
    b = TaskCounts.from_arrays([1] * 18 + [0] * 14, 1)  # a's 16 tasks and two more
    unpaired = math.hypot(clustered_se(a), clustered_se(b))
    paired = contrast_se([(1.0, b), (-1.0, a)])
    assert paired < unpaired / 2
    # the same tasks in another order pair by id
    shuffled = TaskCounts(tuple(reversed(b.ids)), b.passes[::-1].copy(), b.samples[::-1].copy())
    assert contrast_se([(1.0, shuffled), (-1.0, a)]) == pytest.approx(paired)
    # two checkpoints at 0 everywhere: the difference keeps both scores' floors and Agresti-Min's (1 / (n + 2))
    zero = TaskCounts.from_arrays([0] * 32, 1)
    assert contrast_se([(1.0, zero), (-1.0, zero)]) == pytest.approx(
        math.sqrt(2 * binomial_se(0.0, 32) ** 2 + (100 / 34) ** 2))
    # two checkpoints that pass the same 16 tasks: no discordant task, Agresti-Min's floor alone
    assert contrast_se([(1.0, a), (-1.0, a)]) == pytest.approx(100 / 34)
    # other tasks: nothing pairs, the two are independent
    other = TaskCounts.from_arrays(b.passes, 1, ids=[f"x{i}" for i in range(32)])
    assert contrast_se([(1.0, other), (-1.0, a)]) == pytest.approx(unpaired)
    assert detectable(3.0) == pytest.approx(2.8416 * 3.0)


def _records(path: Path, passes: list[list[int]], tasks: list[str] | None = None) -> None:
    """A records/<benchmark>.jsonl as the harness writes it: one line per episode, k per task, in task order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tasks = tasks or [f"t{i}" for i in range(len(passes))]
    with open(path, "w") as f:
        for tid, samples in zip(tasks, passes):
            for j, ok in enumerate(samples):
                f.write(json.dumps({"id": tid, "benchmark": path.stem, "reward": 1.0 if ok else 0.25,
                                    "failure": None if ok else "wrong", "turns": 1, "protocol_errors": [],
                                    "messages": [], "sample": j}) + "\n")


def test_records_give_the_clustered_se_and_the_final_tables_pair_differences(tmp_path):
    rng = np.random.default_rng(3)
    solved = rng.random(40) < 0.5  # a task is solved by both checkpoints or by neither, mostly
    runs = {"seq_math": [[int(s and rng.random() < 0.9) for _ in range(4)] for s in solved],
            "seq_search": [[int(s and rng.random() < 0.8) for _ in range(4)] for s in solved]}
    for run, passes in runs.items():
        eval_dir = tmp_path / "seed0" / run / "eval"
        _records(eval_dir / "records" / "aime26.jsonl", passes)
        score = 100 * np.mean(passes)
        (eval_dir / "metrics.json").write_text(json.dumps({"scores": {"aime26": score, "nq": 10.0},
                                                          "n_tasks": {"aime26": 40, "nq": 32}, "k": 4}))
    tc = read_task_counts(tmp_path / "seed0" / "seq_math" / "eval" / "records" / "aime26.jsonl")
    assert tc.n_tasks == 40 and tc.episodes == 160 and tc.score == pytest.approx(100 * np.mean(runs["seq_math"]))
    metrics = json.loads((tmp_path / "seed0" / "seq_math" / "eval" / "metrics.json").read_text())
    assert score_se(metrics, "aime26", tc) == pytest.approx(clustered_se(tc))
    assert clustered_se(tc) > score_se(metrics, "aime26")  # the binomial fallback of 40 x 4 trials

    data = final.collect({0: tmp_path / "seed0"}, ["math", "search"], ["base", "seq_math", "seq_search"])
    est = data.estimate("seq_math", "aime26")
    assert est.se == pytest.approx(clustered_se(tc)) and data.clustered("seq_math", "aime26")
    assert not data.clustered("seq_math", "nq")  # no records: the binomial fallback, and it says so
    assert data.estimate("seq_math", "nq").se == pytest.approx(binomial_se(10.0, 32, 4))
    assert "seq_math (seed 0)" in data.binomial_fallback()
    diff = data.diff("seq_search", "seq_math", "aime26")
    assert diff.value == pytest.approx(data.mean("seq_search", "aime26") - data.mean("seq_math", "aime26"))
    assert diff.se < 0.5 * (data.estimate("seq_search", "aime26") - est).se  # paired, far below unpaired
    # records that do not give the score metrics.json reports (another evaluation) are not used
    (tmp_path / "seed0" / "seq_math" / "eval" / "metrics.json").write_text(json.dumps(
        {"scores": {"aime26": 12.5}, "n_tasks": {"aime26": 40}, "k": 4}))
    stale = final.collect({0: tmp_path / "seed0"}, ["math", "search"], ["base", "seq_math", "seq_search"])
    assert stale.estimate("seq_math", "aime26").se == pytest.approx(binomial_se(12.5, 40, 4))
