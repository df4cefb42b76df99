"""Wall time of the pipeline notebooks, per notebook and seed, from an empty store (the mini budgets).

    python benchmarks/pipeline_time.py --profile smoke                          # budget: 3 minutes (00-05)
    python benchmarks/pipeline_time.py --profile mini                           # budget: 60 min for one seed, 00-12
    python benchmarks/pipeline_time.py --profile mini --seeds 0 1 2 --keep DIR  # budget: 3 h, make run SEEDS="0 1 2"

It runs what ``make run`` runs (``acl run --profile P --seeds ... --jobs 2``: two notebooks at a time) into a
fresh temporary outputs/papermill dir (or ``--keep DIR``, which must not hold runs yet: the budgets are from an
empty store), then reads each executed notebook's papermill duration and each run's metrics.json, prints markdown
tables and writes them with the total to ``<DIR>/outputs/<profile>/timing.json``, where
``tools/readme_results.py`` puts it under the README's tables over the seeds. Budgets are measured here, never
asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from acl_lib.runs import code_version

BUDGET_S = {"smoke": 180, "mini": 30 * 60}  # notebooks 00-05 (base .. oracles) of one seed
BUDGET_ALL_S = {("mini", 1): 60 * 60, ("mini", 3): 3 * 3600}  # the whole acl run, 00-12, for 1 or 3 seeds


def machine_speed() -> dict[str, float]:
    """``benchmarks/machine_speed.py``'s seconds at one and two threads, ``{"1": s, "2": s}`` ({} if it failed)."""
    script = Path(__file__).with_name("machine_speed.py")
    res = subprocess.run([sys.executable, str(script), "--threads", "1", "2", "--repeats", "2", "--json"],
                         capture_output=True, text=True)
    speed = json.loads(res.stdout.splitlines()[-1]) if res.returncode == 0 else {}
    print(f"machine speed (benchmarks/machine_speed.py): {speed or res.stderr[-500:]}", flush=True)
    return speed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", default="smoke")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--jobs", type=int, default=2, help="notebooks at a time (make run's JOBS, default 2)")
    ap.add_argument("--only", nargs="*", default=None, help="notebook prefixes (default: all)")
    ap.add_argument("--keep", default=None, help="directory for outputs/ and papermill_runs/ (default: a tmp dir)")
    ap.add_argument("--set", nargs="*", action="extend", default=[], help="config overrides")
    ap.add_argument("--no-machine-speed", action="store_true",
                    help="skip benchmarks/machine_speed.py before the run (about 40 s; skipped at smoke)")
    args = ap.parse_args()

    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix=f"acl-bench-{args.profile}-"))
    out, pm = root / "outputs", root / "papermill_runs"
    if any(out.glob(f"{args.profile}/seed*/*/COMPLETE.json")):
        ap.error(f"{out} already holds complete runs: the budgets are measured from an empty store")
    cmd = [sys.executable, "-m", "acl_lib.cli", "run", "--profile", args.profile,
           "--seeds", *map(str, args.seeds), "--jobs", str(args.jobs),
           "--output-dir", str(out), "--papermill-dir", str(pm)]
    if args.only:
        cmd += ["--only", *args.only]
    if args.set:
        cmd += ["--set", *args.set]
    # how fast this machine is, measured while it is idle, so the timing can be read against another machine's
    speed = {} if args.no_machine_speed or args.profile == "smoke" else machine_speed()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    t0 = time.perf_counter()
    rc = subprocess.call(cmd)
    total = time.perf_counter() - t0

    # per notebook and seed, papermill's duration; the across-seeds notebook (12) sits beside the seed folders
    durations: dict[str, dict[str, float | None]] = {}
    failed = []
    executed = [(f"seed {seed}", nb) for seed in args.seeds
                for nb in sorted((pm / args.profile / f"seed{seed}").glob("*.ipynb"))]
    executed += [("once", nb) for nb in sorted((pm / args.profile).glob("*.ipynb"))]
    for label, nb in executed:
        meta = json.loads(nb.read_text()).get("metadata", {}).get("papermill", {})
        durations.setdefault(nb.stem, {})[label] = meta.get("duration")
        if meta.get("exception"):
            failed.append(nb.stem if label == "once" else f"{nb.stem} ({label})")
    cols = [f"seed {s}" for s in args.seeds]
    print("\n| notebook | " + " | ".join(f"{c} (min)" for c in cols) + " |\n|---|" + "---:|" * len(cols))
    for name, by in durations.items():
        if "once" in by:
            print(f"| {name} (once, over the seeds) | {by['once'] / 60:.1f} |" + " |" * (len(cols) - 1))
        else:
            print(f"| {name} | " + " | ".join(f"{by[c] / 60:.1f}" if by.get(c) else "-" for c in cols) + " |")
    first = sum(by.get(cols[0]) or 0 for n, by in durations.items() if n[:2] <= "05")
    budget = BUDGET_S.get(args.profile)
    if budget and len(args.seeds) == 1:
        print(f"| notebooks 00-05 | {first / 60:.1f} min | budget {budget / 60:.0f} min: "
              f"{'within' if first <= budget else 'OVER'} |")
    budget_all = BUDGET_ALL_S.get((args.profile, len(args.seeds)))
    within = (f"budget {budget_all / 60:.0f} min: {'within' if total <= budget_all and rc == 0 else 'OVER'}"
              if budget_all else "")
    print(f"\n**total (acl run, exit {rc})**: {total:.0f} s = {total / 60:.1f} min. {within}")
    seed_dir = out / args.profile / f"seed{args.seeds[0]}"
    found = {p.parent.parent.name: json.loads(p.read_text())["scores"] for p in seed_dir.glob("*/eval/metrics.json")}
    order = ["base"] + [f"{kind}_{d}" for kind in ("seq", "oracle") for d in ("math", "search", "ecom", "if")]
    scores = {r: found[r] for r in sorted(found, key=lambda r: (order.index(r) if r in order else len(order), r))}
    if scores:
        benches = list(next(iter(scores.values())))
        print(f"\nseed {args.seeds[0]}:\n| run | " + " | ".join(benches) + " |\n|---|" + "---:|" * len(benches))
        for run, s in scores.items():
            print(f"| {run} | " + " | ".join(f"{s.get(b, float('nan')):.1f}" for b in benches) + " |")
    summary = {"command": cmd, "seeds": list(args.seeds), "jobs": args.jobs, "commit": code_version() or "unknown",
               "started": started, "total_s": round(total, 1),
               "exit_status": rc, "budget_s": budget_all, "within_budget": bool(budget_all and total <= budget_all
                                                                                 and rc == 0),
               "failed": failed, "notebook_s": durations, "machine_speed_s": speed}
    # beside the seeds' folders, where tools/readme_results.py finds it (acl_lib.report.wall_time_markdown)
    timing = out / args.profile / "timing.json"
    timing.parent.mkdir(parents=True, exist_ok=True)
    timing.write_text(json.dumps(summary, indent=1))
    print(f"\noutputs in {root}; timing in {timing}")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
