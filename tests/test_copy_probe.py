"""The copy-probe diagnostic (benchmarks/copy_probe.py): its synthetic tasks and its reference losses."""

import math
import random

import pytest

from bench_kit import load_benchmark

copy_probe = load_benchmark("copy_probe")


def test_offset_tasks_repeat_at_their_distance():
    rng = random.Random(0)
    x = copy_probe.make_batch("offset1", rng, 300, 2, 64)
    assert (x[:, 0::2] == x[:, 1::2]).all()
    x = copy_probe.make_batch("offset9", rng, 300, 2, 190)
    for row in x.tolist():
        for start in range(0, 190 - 19, 19):  # [1] seg(8) [2] seg(8) [3]
            block = row[start:start + 19]
            assert block[0] == 1 and block[9] == 2 and block[18] == 3 and block[1:9] == block[10:18]


def test_induction_segments_vary_in_length_and_repeat():
    rng = random.Random(1)
    row = copy_probe.make_batch("induction", rng, 300, 1, 400).tolist()[0]
    lengths, i = set(), 0
    while i < len(row) and row[i] == 1:
        j = row.index(2, i)
        n = j - i - 1
        if j + n + 1 >= len(row):
            break
        assert row[i + 1:j] == row[j + 1:j + 1 + n] and row[j + 1 + n] == 3
        lengths.add(n)
        i = j + n + 2
    assert len(lengths) > 1 and all(5 <= n <= 15 for n in lengths)


def test_reference_losses_bracket_a_copying_model():
    h = math.log(290)
    assert copy_probe.reference_losses("offset1", 300) == pytest.approx((h, h / 2))
    no_copy, perfect = copy_probe.reference_losses("offset9", 300)
    assert no_copy == pytest.approx(16 * h / 19) and perfect == pytest.approx(8 * h / 19)


def test_probe_runs_on_the_smoke_model():
    from acl_lib.config import load_config

    out = copy_probe.probe(load_config("smoke"), "offset1", steps=3, lr=1e-3, vocab=50, batch=2, length=32, seed=0)
    assert out["steps"] == 3 and out["first_loss"] > out["perfect_copy_loss"] > 0
