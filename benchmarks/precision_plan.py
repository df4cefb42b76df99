"""How many test tasks each benchmark needs for the precision the regime asks, and what they cost.

Reads a store (``<output_dir>/<profile>/seed<S>/<run>/eval/records``) and, per benchmark:

* the largest per-seed standard error over every evaluated checkpoint, clustered by task (``acl_lib.noise``);
* the largest paired standard error of a stage-to-stage difference of the sequence (base -> stage 1 -> ... ->
  the last stage, each pair scored on the same tasks);
* the tasks needed for each bar, scaling the observed worst case by ``1 / sqrt(n)`` (the same checkpoints on more
  tasks of the same world), and the bar's worst case over any score (a pass rate of 50% at avg@1, ``50 / sqrt(n)``
  points, the floor a benchmark that comes alive must still meet; for a difference, half the tasks flipping one
  way, the same ``50 / sqrt(n)``);
* what those tasks cost an evaluation, from ``benchmarks/throughput.py --json`` files of trained checkpoints
  (seconds an episode, per benchmark, the slowest of the files).

    python benchmarks/throughput.py <store>/mini/seed0/seq_ecom/model --json /tmp/tp_ecom.json
    python benchmarks/precision_plan.py --output-dir <store> --seeds 0 1 2 --throughput /tmp/tp_*.json

The bars (the regime issue's): in-domain at most 4 points per seed, a stage-to-stage difference at most 3, out
of domain at most 6. Nothing here changes a config; the numbers go to ``docs/mini-calibration.md``.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
from pathlib import Path

from acl_lib import domains
from acl_lib.noise import clustered_se, contrast_se, read_task_counts, same_tasks

IN_BAR, PAIRED_BAR, OOD_BAR = 4.0, 3.0, 6.0


def needed(n: int, se: float, bar: float, multiple: int = 16) -> int:
    """Tasks for ``se`` (observed at ``n`` tasks) to reach ``bar``, rounded up to ``multiple``."""
    if se <= bar:
        return n
    return int(math.ceil(n * (se / bar) ** 2 / multiple) * multiple)


def worst_case(bar: float, multiple: int = 16) -> int:
    """Tasks for a 50% pass rate at avg@1 to reach ``bar`` (the binomial SE ``50 / sqrt(n)``)."""
    return int(math.ceil((50.0 / bar) ** 2 / multiple) * multiple)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output-dir", required=True)
    ap.add_argument("--profile", default="mini")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--throughput", nargs="*", default=[], help="benchmarks/throughput.py --json files")
    args = ap.parse_args(argv)

    root = Path(args.output_dir) / args.profile
    seq = ["base"] + [f"seq_{d}" for d in domains.ORDER]
    worst: dict[str, tuple[float, int, str]] = {}
    paired: dict[str, tuple[float, int, str]] = {}
    for s in args.seeds:
        for rec in sorted(glob.glob(str(root / f"seed{s}" / "*" / "eval" / "records" / "*.jsonl"))):
            b = Path(rec).stem
            tc = read_task_counts(rec)
            if tc is None:
                continue
            se = clustered_se(tc)
            if se > worst.get(b, (-1.0,))[0]:
                worst[b] = (se, tc.n_tasks, f"seed{s}/{Path(rec).parents[2].name} at {tc.score:.1f}")
        for a, c in zip(seq, seq[1:]):
            for rec in sorted(glob.glob(str(root / f"seed{s}" / c / "eval" / "records" / "*.jsonl"))):
                b = Path(rec).stem
                ta = read_task_counts(root / f"seed{s}" / a / "eval" / "records" / f"{b}.jsonl")
                tb = read_task_counts(rec)
                if ta is None or tb is None or not same_tasks([ta, tb]):
                    continue
                se = contrast_se([(1.0, tb), (-1.0, ta)])
                if se > paired.get(b, (-1.0,))[0]:
                    paired[b] = (se, tb.n_tasks, f"seed{s} {a} -> {c} ({ta.score:.1f} -> {tb.score:.1f})")

    cost: dict[str, float] = {}  # seconds an evaluation spends per task (all its samples)
    for f in args.throughput:
        for row in json.loads(Path(f).read_text())["benchmarks"]:
            per_task = row["wall_s"] / max(1, row["tasks"])
            cost[row["benchmark"]] = max(cost.get(row["benchmark"], 0.0), per_task)

    in_domain = set(domains.IN_DOMAIN.values())
    head = ("benchmark", "kind", "n", "worst SE", "where", "paired SE", "where", "n for bars", "n at 50%",
            "s/eval now", "s/eval then")
    print(" | ".join(head))
    total_now = total_then = 0.0
    for b in domains.BENCHMARK_DOMAIN:
        if b not in worst:
            continue
        se, n, where = worst[b]
        kind = "in" if b in in_domain else "ood"
        bar = IN_BAR if kind == "in" else OOD_BAR
        want = needed(n, se, bar)
        floor = worst_case(bar)
        pse, pn, pwhere = paired.get(b, (float("nan"), n, ""))
        if kind == "in" and not math.isnan(pse):
            want = max(want, needed(pn, pse, PAIRED_BAR))
            floor = max(floor, worst_case(PAIRED_BAR))  # half the tasks flipping one way (forgetting a 50% score)
        now = cost.get(b, float("nan")) * n
        then = cost.get(b, float("nan")) * max(want, n)
        total_now += 0 if math.isnan(now) else now
        total_then += 0 if math.isnan(then) else then
        print(f"{b} | {kind} | {n} | {se:.2f} | {where} | {pse:.2f} | {pwhere} | {want} | {floor} | {now:.1f} | "
              f"{then:.1f}")
    print(f"one whole-suite evaluation: {total_now:.0f} s now, {total_then:.0f} s at the sizes the bars need "
          "(observed worst cases; generation only, the slowest checkpoint's seconds a task)")


if __name__ == "__main__":
    main()
