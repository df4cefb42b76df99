"""Continual-learning metrics on a hand-computed matrix, with gaps, and the study's trajectory."""

from __future__ import annotations

import pytest

from acl_lib.diagnostics.cl_metrics import capability_matrix, cl_frame, cl_metrics, sequential_cl_metrics

R = [[50.0, 10.0, 0.0],   # after stage 1
     [30.0, 60.0, 5.0],   # after stage 2
     [20.0, 40.0, 70.0]]  # after stage 3 (final)
BASE = [10.0, 5.0, 2.0]


def test_hand_computed_matrix():
    m = cl_metrics(R, BASE, ["a", "b", "c"])
    assert m["average_accuracy"] == pytest.approx((20 + 40 + 70) / 3)
    assert m["backward_transfer"] == pytest.approx(((20 - 50) + (40 - 60)) / 2)  # -25
    assert m["forward_transfer"] == pytest.approx(((10 - 5) + (5 - 2)) / 2)  # 4
    assert m["forgetting"] == {"a": pytest.approx(30.0), "b": pytest.approx(20.0)}  # best earlier minus final
    assert m["mean_forgetting"] == pytest.approx(25.0)
    assert m["n_terms"] == {"average_accuracy": 3, "backward_transfer": 2, "forward_transfer": 2, "forgetting": 2}


def test_gaps_are_left_out_and_counted():
    gappy = [row[:] for row in R]
    gappy[1][2] = None  # stage 2's score on task c unreported: one forward-transfer term less
    gappy[1][0] = float("nan")  # task a after stage 2 unreported: forgetting of a from stage 1 only
    m = cl_metrics(gappy, [10.0, None, 2.0], ["a", "b", "c"])
    assert m["forward_transfer"] is None and m["n_terms"]["forward_transfer"] == 0
    assert m["forgetting"]["a"] == pytest.approx(30.0)
    with pytest.raises(ValueError, match="square"):
        cl_metrics([[1.0, 2.0]], None)


def test_capability_matrix_from_scores():
    scores = {"base": {"x": 1.0}, "s1": {"x": 2.0, "y": 3.0}, "s2": {"y": 4.0}}
    M, b = capability_matrix(scores, ["s1", "s2", "s3"], ["x", "y"])
    assert M == [[2.0, 3.0], [None, 4.0], [None, None]] and b == [1.0, None]


def test_study_trajectory_and_an_empty_run_store(smoke_cfg):
    out = sequential_cl_metrics(smoke_cfg)
    assert out["benchmarks"] == ["aime26", "nq", "retail", "ifeval"]
    study = out["study"]  # paper_results.yaml sequential: aime26 25.83 -> 10.21, nq 45.2 -> 33.5, retail 34.0 -> 29.6
    assert study["backward_transfer"] == pytest.approx(((10.21 - 25.83) + (33.5 - 45.2) + (29.6 - 34.0)) / 3)
    assert study["forward_transfer"] == pytest.approx(22.0 - 13.3) and study["n_terms"]["forward_transfer"] == 1
    assert study["average_accuracy"] == pytest.approx((10.21 + 33.5 + 29.6 + 84.8) / 4)
    assert study["forgetting"]["aime26"] == pytest.approx(25.83 - 10.21)
    assert out["ours"]["average_accuracy"] is None and "seq_if" in out["missing"]
    frame = cl_frame(out)
    assert frame.loc["backward transfer", "study"] == pytest.approx(study["backward_transfer"])
