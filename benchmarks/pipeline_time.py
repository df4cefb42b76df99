"""Wall time of the pipeline notebooks, per notebook, from a clean output dir (the issue's budgets).

    python benchmarks/pipeline_time.py --profile smoke            # budget: 3 minutes
    python benchmarks/pipeline_time.py --profile mini             # budgets: 30 min for 00-05, 60 for 00-12

It runs ``acl run --profile P --seeds 0`` into a fresh temporary outputs/papermill dir (or ``--keep DIR``),
then reads each executed notebook's papermill duration and each run's metrics.json, and prints a
markdown table. Budgets are measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUDGET_S = {"smoke": 180, "mini": 30 * 60}  # notebooks 00-05 (base .. oracles)
BUDGET_ALL_S = {"mini": 60 * 60}  # the whole one-seed acl run, 00-12


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="smoke")
    ap.add_argument("--only", nargs="*", default=None, help="notebook prefixes (default: all)")
    ap.add_argument("--keep", default=None, help="directory for outputs/ and papermill_runs/ (default: a tmp dir)")
    ap.add_argument("--set", nargs="*", action="extend", default=[], help="config overrides")
    args = ap.parse_args()

    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix=f"acl-bench-{args.profile}-"))
    out, pm = root / "outputs", root / "papermill_runs"
    cmd = [sys.executable, "-m", "acl_lib.cli", "run", "--profile", args.profile, "--seeds", "0",
           "--output-dir", str(out), "--papermill-dir", str(pm)]
    if args.only:
        cmd += ["--only", *args.only]
    if args.set:
        cmd += ["--set", *args.set]
    t0 = time.perf_counter()
    rc = subprocess.call(cmd)
    total = time.perf_counter() - t0

    rows = []
    # the per-seed notebooks, then those that read every seed (12), whose copy sits beside the seed folders
    for nb in [*sorted((pm / args.profile / "seed0").glob("*.ipynb")), *sorted((pm / args.profile).glob("*.ipynb"))]:
        meta = json.loads(nb.read_text()).get("metadata", {}).get("papermill", {})
        rows.append((nb.name, meta.get("duration"), meta.get("exception")))
    print("\n| notebook | seconds | status |\n|---|---:|---|")
    for name, dur, exc in rows:
        print(f"| {name} | {dur or 0:.1f} | {'failed' if exc else 'ok'} |")
    first = sum(d or 0 for n, d, _ in rows if n[:2] <= "05")
    budget = BUDGET_S.get(args.profile)
    if budget:
        print(f"| notebooks 00-05 | {first:.1f} = {first / 60:.1f} min | budget {budget / 60:.0f} min: "
              f"{'within' if first <= budget else 'OVER'} |")
    budget_all = BUDGET_ALL_S.get(args.profile)
    within = f"budget {budget_all / 60:.0f} min: {'within' if total <= budget_all else 'OVER'}" if budget_all else ""
    print(f"| **total (acl run)** | **{total:.1f}** = {total / 60:.1f} min | {within} |")
    seed_dir = out / args.profile / "seed0"
    found = {p.parent.parent.name: json.loads(p.read_text())["scores"] for p in seed_dir.glob("*/eval/metrics.json")}
    order = ["base"] + [f"{kind}_{d}" for kind in ("seq", "oracle") for d in ("math", "search", "ecom", "if")]
    scores = {r: found[r] for r in sorted(found, key=lambda r: (order.index(r) if r in order else len(order), r))}
    if scores:
        benches = list(next(iter(scores.values())))
        print("\n| run | " + " | ".join(benches) + " |\n|---|" + "---:|" * len(benches))
        for run, s in scores.items():
            print(f"| {run} | " + " | ".join(f"{s.get(b, float('nan')):.1f}" for b in benches) + " |")
    print(f"\noutputs in {root}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
