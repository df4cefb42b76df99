"""Where a desk score comes from: episodes passed per task kind (retail: order_status, cancel, ...), per evaluation.

    python benchmarks/desk_breakdown.py outputs/mini/seed0/base/eval outputs/mini/seed0/oracle_ecom/eval
    python benchmarks/desk_breakdown.py --benchmark nq outputs/mini/seed*/seq_search/eval

Reads each evaluation directory's ``records/<benchmark>.jsonl``. Each record names its task's kind (the harness
writes the task's ``kind``); records written before it did are matched by task id to the tasks the mini profile
draws for that benchmark on world seed 0 (``--profile``, ``--world-seed``, and ``--set`` for a world the evaluation
changed, e.g. ``--set "worlds.retail_kinds=[order_status, cancel]"``). Prints a markdown table: one row per
evaluation, one column per kind, passed / episodes.

This is how the mini retail desk's ceiling was found (docs/mini-calibration.md): no checkpoint of any regime has
passed an address change, which are 15 of its 32 tasks.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def task_kinds(profile: str, benchmark: str, world_seed: int, overrides: list[str] = ()) -> dict[str, str]:
    """Task id -> kind for the tasks the harness draws for ``benchmark`` (records older than the ``kind`` field)."""
    from acl_lib.config import load_config
    from acl_lib.envs import BENCHMARKS
    from acl_lib.eval.harness import benchmark_size, world

    cfg = load_config(profile, [*overrides, f"worlds.seed={world_seed}"], seed=0)
    bench = BENCHMARKS[benchmark]
    tasks = world(cfg, bench.env).tasks(bench.split, benchmark_size(cfg, bench), seed=cfg.worlds.seed)
    return {t.id: str((t.meta or {}).get("kind")) for t in tasks}


def breakdown(records: list[dict], kinds: dict[str, str] | None = None) -> dict[str, list[int]]:
    """Kind -> [passed, episodes] (passed as the harness counts it: reward 1)."""
    from acl_lib.eval.harness import PASS_EPS

    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in records:
        kind = r.get("kind") or (kinds or {}).get(r["id"], "?")
        out[kind][0] += r["reward"] >= 1.0 - PASS_EPS
        out[kind][1] += 1
    return dict(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("evals", nargs="+", help="evaluation directories (each with records/)")
    ap.add_argument("--benchmark", default="retail")
    ap.add_argument("--profile", default="mini")
    ap.add_argument("--world-seed", type=int, default=0)
    ap.add_argument("--set", dest="overrides", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                    help="config overrides of the world the evaluations ran on (records without their kind)")
    args = ap.parse_args(argv)
    rows, kinds = [], None
    for d in args.evals:
        path = Path(d) / "records" / f"{args.benchmark}.jsonl"
        if not path.is_file():
            raise SystemExit(f"no {args.benchmark} records at {path}")
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        if kinds is None and any("kind" not in r for r in records):
            kinds = task_kinds(args.profile, args.benchmark, args.world_seed, args.overrides)
        rows.append((d, breakdown(records, kinds)))
    names = sorted({k for _, b in rows for k in b})
    print("| evaluation | " + " | ".join(names) + " | all |")
    print("|---|" + "---:|" * (len(names) + 1))
    for d, b in rows:
        cells = [f"{b[k][0]}/{b[k][1]}" if k in b else "" for k in names]
        total = [sum(v[0] for v in b.values()), sum(v[1] for v in b.values())]
        print(f"| {d} | " + " | ".join(cells) + f" | {total[0]}/{total[1]} |")


if __name__ == "__main__":
    main()
