"""Throughput of evaluation: what the harness encodes and generates, beside raw batched ``generate``.

    python benchmarks/throughput.py MODEL_DIR [--profile mini] [--benchmarks retail telecom ...] [--json FILE]

For each benchmark (default: all of the suite) it runs the harness's evaluation of ``MODEL_DIR`` and reports
episodes, assistant turns, prompt tokens (the length of every prompt, summed), tokens encoded (what actually ran
through the model once cached prefixes are reused), the share of encoded tokens that re-encode a prefix the same
episode had already had (its previous prompt and what it generated), pad tokens, tokens generated and wall
seconds. ``--no-reuse`` measures the harness re-encoding every prompt whole, as it did before per-episode KV
caches (``acl_lib/eval/turns.py``); each row's ``transcripts_sha256`` (a digest of every episode's messages) is
the same in both modes when greedy results did not change.
Then it replays every ``generate`` call of that benchmark as raw batched ``generate`` on the same model, with the
same rows, prompt width and number of new tokens (random token ids; ``min_new_tokens`` makes every row generate
them all), and gives both throughputs in generated tokens per second and their ratio. The table is printed; the
numbers go to ``--json`` (default ``outputs/benchmarks/throughput-<model name>.json``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path


def raw_generate_seconds(model, calls: list[tuple[int, int, int]], vocab: int, pad: int, seed: int = 0) -> float:
    """Seconds raw ``generate`` takes for ``calls`` = [(rows, prompt width, new tokens)], greedy."""
    import torch

    g = torch.Generator().manual_seed(seed)
    total = 0.0
    for rows, width, new in calls:
        ids = torch.randint(10, vocab, (rows, width), generator=g)
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                           min_new_tokens=new, do_sample=False, pad_token_id=pad)
        total += time.perf_counter() - t0
    return total


def measure(cfg, model_dir: str, benchmarks: list[str], reuse_kv: bool = True) -> list[dict]:
    from acl_lib.envs import BENCHMARKS
    from acl_lib.eval.harness import HFPolicy, evaluate_benchmark, world
    from acl_lib.seeding import seed_and_threads

    seed_and_threads(cfg.seed, cfg.torch_threads)
    rows = []
    for key in benchmarks:
        bench = BENCHMARKS[key]
        max_turns, max_new_tokens = cfg.eval.limits_for(key)  # the benchmark's own limits, as evaluate() uses
        policy = HFPolicy(model_dir, max_new_tokens, cfg.eval.temperature, cfg.eval.top_p,
                          cfg.eval.batch_size, dtype=cfg.model.dtype, reuse_kv=reuse_kv)
        env = world(cfg, bench.env)
        n = cfg.worlds.n_test if bench.suite == "in_domain" else cfg.worlds.n_ood
        t0 = time.perf_counter()
        summary, records = evaluate_benchmark(policy, bench, env, n, 1, max_turns, task_seed=cfg.worlds.seed,
                                              batch_size=max(cfg.eval.batch_size, 1) * 4)
        wall = time.perf_counter() - t0
        st = policy.stats
        raw_s = raw_generate_seconds(policy.model, st["calls"], len(policy.tok), policy.tok.pad_token_id)
        raw_tokens = sum(r * new for r, _, new in st["calls"])
        harness_tps = policy.generated_tokens / wall if wall else 0.0
        raw_tps = raw_tokens / raw_s if raw_s else 0.0
        rows.append({
            "benchmark": key, "score": round(summary["score"], 2), "episodes": len(records),
            "max_turns": max_turns, "max_new_tokens": max_new_tokens,
            "turns": sum(r["turns"] for r in records), "prompt_tokens": st["prompt_tokens"],
            "encoded_tokens": st["encoded_tokens"], "reencoded_tokens": st["reencoded_tokens"],
            "reencoded_share": round(st["reencoded_tokens"] / max(1, st["encoded_tokens"]), 4),
            "pad_tokens": st["pad_tokens"], "generated_tokens": policy.generated_tokens,
            "generate_calls": len(st["calls"]), "wall_s": round(wall, 2),
            "generate_s": round(policy.generate_seconds, 2),
            "harness_tokens_per_s": round(harness_tps, 1), "raw_generate_tokens_per_s": round(raw_tps, 1),
            "raw_generate_s": round(raw_s, 2), "raw_generated_tokens": raw_tokens,
            "ratio": round(harness_tps / raw_tps, 3) if raw_tps else None,
            # one digest of every episode's messages: equal with and without --no-reuse when greedy results match
            "transcripts_sha256": hashlib.sha256(json.dumps([r["messages"] for r in records], sort_keys=True)
                                                 .encode()).hexdigest()[:16],
        })
        r = rows[-1]
        print(f"{key:<11} {r['episodes']:>4} {r['turns']:>5} {r['prompt_tokens']:>9} {r['encoded_tokens']:>9} "
              f"{100 * r['reencoded_share']:>7.1f}% "
              f"{r['pad_tokens']:>8} {r['generated_tokens']:>7} {r['wall_s']:>7.1f} {r['harness_tokens_per_s']:>8.1f} "
              f"{r['raw_generate_tokens_per_s']:>8.1f} {r['ratio'] or 0:>6.2f}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("--profile", default="mini")
    ap.add_argument("--set", dest="overrides", nargs="*", action="extend", default=[], metavar="KEY=VALUE")
    ap.add_argument("--benchmarks", nargs="*", default=None)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-reuse", action="store_true",
                    help="re-encode every prompt whole (the harness before per-episode KV caches), for comparison")
    args = ap.parse_args(argv)

    from acl_lib.config import load_config
    from acl_lib.envs import BENCHMARKS
    from acl_lib.progress import hf_progress_bars

    DESKS = ("retail", "telecom", "mock")  # the multi-turn desk worlds (environment names)

    hf_progress_bars(False)
    cfg = load_config(args.profile, args.overrides, seed=0)
    benchmarks = args.benchmarks or list(BENCHMARKS)
    unknown = [b for b in benchmarks if b not in BENCHMARKS]
    if unknown:
        ap.error(f"unknown benchmark(s) {unknown}; known: {list(BENCHMARKS)}")
    print(f"model {args.model_dir}, profile {args.profile}: eval.batch_size {cfg.eval.batch_size}, limits per "
          f"benchmark (max_turns, max_new_tokens): "
          + ", ".join(f"{b} {cfg.eval.limits_for(b)}" for b in benchmarks))
    print(f"{'benchmark':<11} {'eps':>4} {'turns':>5} {'prompt_tok':>9} {'encoded':>9} {'re-enc':>8} {'pad_tok':>8} "
          f"{'gen_tok':>7} {'wall_s':>7} {'tok/s':>8} {'raw tok/s':>8} {'ratio':>6}")
    rows = measure(cfg, args.model_dir, benchmarks, reuse_kv=not args.no_reuse)
    desk = [r for r in rows if BENCHMARKS[r["benchmark"]].env in DESKS]

    def share(rs):
        return round(sum(r["reencoded_tokens"] for r in rs) / max(1, sum(r["encoded_tokens"] for r in rs)), 4)

    harness = sum(r["generated_tokens"] for r in rows) / max(1e-9, sum(r["wall_s"] for r in rows))
    raw = sum(r["raw_generated_tokens"] for r in rows) / max(1e-9, sum(r["raw_generate_s"] for r in rows))
    total = {"wall_s": round(sum(r["wall_s"] for r in rows), 1), "reencoded_share": share(rows),
             "desk_benchmarks": [r["benchmark"] for r in desk], "desk_reencoded_share": share(desk) if desk else None,
             "harness_tokens_per_s": round(harness, 1), "raw_generate_tokens_per_s": round(raw, 1),
             "ratio": round(harness / raw, 3) if raw else None}
    print(f"total wall {total['wall_s']} s; re-encoded share of all encoded tokens "
          f"{100 * total['reencoded_share']:.1f}%"
          + (f", of the desks' ({', '.join(total['desk_benchmarks'])}) {100 * total['desk_reencoded_share']:.1f}%"
             if desk else "")
          + f"; harness {total['harness_tokens_per_s']} generated tokens/s against raw generate "
            f"{total['raw_generate_tokens_per_s']} (ratio {total['ratio']})")
    print("transcript digests: " + ", ".join(f"{r['benchmark']} {r['transcripts_sha256']}" for r in rows))
    name = Path(args.model_dir).name if Path(args.model_dir).name != "model" else Path(args.model_dir).parent.name
    out = Path(args.json or Path(cfg.output_dir) / "benchmarks"
               / f"throughput-{name}{'-no-reuse' if args.no_reuse else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"model": args.model_dir, "profile": args.profile, "reuse_kv": not args.no_reuse,
                               "eval": cfg.to_dict()["eval"],
                               "benchmarks": rows, "total": total}, indent=2))
    print(f"written: {out}")


if __name__ == "__main__":
    main()
