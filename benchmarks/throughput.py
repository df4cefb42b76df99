"""Throughput of an evaluation as the profile runs it: every benchmark with its own tasks, k and temperature.

    python benchmarks/throughput.py MODEL_DIR [--profile mini] [--benchmarks aime26 retail ...] [--json FILE]
    PYTHONPATH=/path/to/other/checkout python benchmarks/throughput.py ...   # the same measurement of other code

It runs one ``acl_lib.eval.harness.evaluate`` of ``MODEL_DIR`` exactly as a pipeline evaluation does (one policy for
the suite; the profile's ``eval`` settings: ``max_tasks``, ``k``, temperature, turn and token limits per
benchmark) and reports, per benchmark, episodes, generated tokens, seconds (the harness's own
``seconds_per_benchmark``) and generated tokens per second, then the single-turn and the desk benchmarks together
and the whole evaluation's wall time. Each row's ``transcripts_sha256`` digests every episode's messages: two
checkouts that generate the same transcripts give the same digests, and ``benchmarks/engine_check.py`` lists the
episodes where they differ. The numbers go to ``--json`` (default
``outputs/benchmarks/throughput-<model name>.json``), with
``benchmarks/machine_speed.py``'s reference seconds beside them (``--no-speed`` skips it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path

DESKS = ("retail", "telecom", "mock")  # the multi-turn desk worlds (environment names)


def measure(cfg, model_dir: str, benchmarks: list[str]) -> tuple[list[dict], float]:
    """One evaluation of ``benchmarks`` (the policy built once, as a pipeline evaluation builds it); per benchmark
    its seconds as the harness times them (``seconds_per_benchmark``: episodes, environments and generation).
    Returns the rows and the evaluation's whole wall time (model loading included)."""
    from acl_lib.envs import BENCHMARKS
    from acl_lib.eval.harness import evaluate

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        m = evaluate(cfg, model_dir, tmp, benchmarks=benchmarks)
        whole = time.perf_counter() - t0
        for key in benchmarks:
            records = [json.loads(line) for line in (Path(tmp) / "records" / f"{key}.jsonl").open()]
            tokens = m["generated_tokens_by_benchmark"][key]
            wall = m["seconds_per_benchmark"][key]
            rows.append({
                "benchmark": key, "desk": BENCHMARKS[key].env in DESKS, "score": m["scores"][key],
                "tasks": m["n_tasks"][key], "k": m["k_by_benchmark"][key], "temperature": m["temperature"][key],
                "episodes": len(records), "turns": sum(r.get("turns", 0) for r in records),
                "generated_tokens": tokens, "wall_s": wall,
                "tokens_per_s": round(tokens / wall, 1) if wall else None,
                "transcripts_sha256": hashlib.sha256(json.dumps([r["messages"] for r in records], sort_keys=True)
                                                     .encode()).hexdigest()[:16],
            })
            r = rows[-1]
            print(f"{key:<11} {r['tasks']:>4} x {r['k']} @ {r['temperature']:<4} {r['episodes']:>5} {r['turns']:>6} "
                  f"{r['generated_tokens']:>8} {r['wall_s']:>7.1f} {r['tokens_per_s']:>8.1f}  "
                  f"score {r['score']:>5.1f}  {r['transcripts_sha256']}", flush=True)
    return rows, whole


def totals(rows: list[dict]) -> dict:
    out = {}
    for name, part in (("single_turn", [r for r in rows if not r["desk"]]), ("desks", [r for r in rows if r["desk"]]),
                       ("all", rows)):
        tokens, wall = sum(r["generated_tokens"] for r in part), sum(r["wall_s"] for r in part)
        out[name] = {"generated_tokens": tokens, "wall_s": round(wall, 1),
                     "tokens_per_s": round(tokens / wall, 1) if wall else None}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("--profile", default="mini")
    ap.add_argument("--set", dest="overrides", nargs="*", action="extend", default=[], metavar="KEY=VALUE")
    ap.add_argument("--benchmarks", nargs="*", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-speed", action="store_true", help="skip benchmarks/machine_speed.py's reference work")
    args = ap.parse_args(argv)

    import acl_lib
    from acl_lib.config import load_config
    from acl_lib.envs import BENCHMARKS
    from acl_lib.progress import hf_progress_bars

    hf_progress_bars(False)
    cfg = load_config(args.profile, args.overrides, seed=0)
    benchmarks = args.benchmarks or list(BENCHMARKS)
    unknown = [b for b in benchmarks if b not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark(s) {unknown}; known: {list(BENCHMARKS)}")
    speed = None
    if not args.no_speed:
        import machine_speed

        speed = {t: round(machine_speed.reference_work(t), 2) for t in (1, 2)}
        print(f"machine_speed.py reference work: {speed[1]} s at 1 thread, {speed[2]} s at 2")
    print(f"acl_lib from {Path(acl_lib.__file__).parent}; model {args.model_dir}, profile {args.profile}, "
          f"torch_threads {cfg.torch_threads}")
    print(f"{'benchmark':<11} {'n':>4}   k @ temp {'eps':>5} {'turns':>6} {'gen_tok':>8} {'wall_s':>7} {'tok/s':>8}")
    rows, whole = measure(cfg, args.model_dir, benchmarks)
    tot = totals(rows)
    tot["evaluation_wall_s"] = round(whole, 1)
    print(f"the whole evaluation: {tot['evaluation_wall_s']} s (model loading and worlds included)")
    for name, t in tot.items():
        if name == "evaluation_wall_s":
            continue
        print(f"{name}: {t['generated_tokens']} generated tokens in {t['wall_s']} s, {t['tokens_per_s']} tokens/s")
    name = Path(args.model_dir).name if Path(args.model_dir).name != "model" else Path(args.model_dir).parent.name
    out = Path(args.json or Path(cfg.output_dir) / "benchmarks" / f"throughput-{name}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": args.model_dir, "profile": args.profile, "acl_lib": str(Path(acl_lib.__file__)
                                                                                               .parent),
                               "machine_speed_s": speed, "eval": cfg.to_dict()["eval"], "benchmarks": rows,
                               "totals": tot}, indent=2))
    print(f"written: {out}")


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))  # machine_speed beside this file
    main()
