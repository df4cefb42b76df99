"""Seconds per GRPO step of the mini recipe: the math and the search stage's settings, a few steps from the base.

    python benchmarks/grpo_step.py [--domains math search] [--steps 6] [--threads 1] [--json FILE]
    python benchmarks/other_checkout.py /path/to/old benchmarks/grpo_step.py ...   # the same on other code

Each domain trains ``--steps`` GRPO steps with its stage's settings (``pipeline.stage_overrides``: math 64
completions of 22 tokens, search 16 episodes of 4 turns of 37 tokens) from the shipped base, in a temporary
directory, and reports the median seconds of a step (``train_log.jsonl``'s ``wall_s`` differences; the first step,
which warms up, left out) and the mean share of rows the loss skipped (advantage 0).
``benchmarks/machine_speed.py``'s reference seconds are printed beside it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path


def step_seconds(domain: str, steps: int, threads: int) -> dict:
    from acl_lib.config import load_config
    from acl_lib.model.shipped import shipped_dir
    from acl_lib.train.grpo import train_grpo

    cfg = load_config("mini", [f"torch_threads={threads}"], seed=0).for_stage(domain)
    cfg.grpo.max_steps = steps  # after the stage's overrides, which set the stage's own step count
    with tempfile.TemporaryDirectory() as tmp:
        train_grpo(cfg, shipped_dir(cfg), domain, tmp)
        records = [r for r in map(json.loads, (Path(tmp) / "train_log.jsonl").open()) if "loss" in r]
    walls = [r["wall_s"] for r in records]
    per = [b - a for a, b in zip(walls, walls[1:])]
    skipped = [r.get("zero_advantage_rows_skipped", 0.0) for r in records]
    return {"domain": domain, "steps": steps, "threads": threads, "step_s": [round(x, 3) for x in per],
            "median_step_s": round(statistics.median(per), 3) if per else None,
            "zero_advantage_rows_skipped": round(statistics.mean(skipped), 3) if skipped else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--domains", nargs="*", default=["math", "search"])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import machine_speed

    from acl_lib.progress import hf_progress_bars

    hf_progress_bars(False)
    speed = round(machine_speed.reference_work(args.threads), 2)
    print(f"machine_speed.py reference work: {speed} s at {args.threads} thread(s)", flush=True)
    rows = [step_seconds(d, args.steps, args.threads) for d in args.domains]
    for r in rows:
        print(f"{r['domain']:<7} median {r['median_step_s']} s a step over steps 2-{r['steps']}: {r['step_s']} "
              f"(rows without advantage, skipped in the loss: {r['zero_advantage_rows_skipped']:.0%})")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine_speed_s": speed, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
