"""benchmarks/precision_plan.py: the tasks a standard-error bar needs, and its table read from a store's records."""

from __future__ import annotations

import json

from bench_kit import load_benchmark

plan = load_benchmark("precision_plan")


def test_tasks_scale_with_the_square_of_the_standard_error():
    assert plan.needed(32, 8.0, 4.0) == 128  # half the SE: four times the tasks
    assert plan.needed(32, 3.0, 4.0) == 32  # already within its bar
    assert plan.worst_case(4.0) == 160  # 50 / sqrt(n) <= 4 at n >= 156.25, rounded up to 16


def _records(path, passes):
    path.mkdir(parents=True)
    with open(path / "nq.jsonl", "w") as f:
        for i, ok in enumerate(passes):
            f.write(json.dumps({"id": f"t{i}", "reward": float(ok)}) + "\n")


def test_the_table_reads_the_worst_se_and_the_paired_one_from_a_store(tmp_path, capsys):
    seed = tmp_path / "mini" / "seed0"
    _records(seed / "base" / "eval" / "records", [0] * 32)
    _records(seed / "seq_math" / "eval" / "records", [0] * 32)
    _records(seed / "seq_search" / "eval" / "records", [1] * 16 + [0] * 16)  # 0 -> 50: the worst case
    tp = tmp_path / "tp.json"
    tp.write_text(json.dumps({"benchmarks": [{"benchmark": "nq", "wall_s": 3.2, "tasks": 32}]}))
    plan.main(["--output-dir", str(tmp_path), "--seeds", "0", "--throughput", str(tp)])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("nq |")).split(" | ")
    assert row[2] == "32" and row[4].startswith("seed0/seq_search at 50.0")
    assert "seq_math -> seq_search (0.0 -> 50.0)" in row[6]
    paired = float(row[5])
    # half the tasks flipping: sqrt(0.25 / 32) = 8.8 points, with the zero score's Agresti-Coull floor (3.8 points)
    # and Agresti-Min's half episode each way: sqrt(8.84^2 + 3.82^2 + 2.94^2) = 10.07
    assert abs(paired - 10.07) < 0.01
    assert row[7] == "368" and row[9] == "3.2" and row[10] == "36.8"  # 32 x (10.07 / 3)^2 = 360.6, to 16
