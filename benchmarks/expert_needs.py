"""What the scripted experts need from the evaluation limits, and the per-benchmark limits that follow.

    python benchmarks/expert_needs.py [--profile mini] [--model DIR] [--turn-margin 2] [--token-margin 0.25]

For every benchmark it drives the scripted expert through the tasks the evaluator scores (``worlds.n_test`` /
``worlds.n_ood`` tasks, world seed ``worlds.seed``) with no limit that binds (64 turns), and counts the expert's
assistant turns per episode and the tokens of each turn (the tokenizer of ``--model``, default the profile's
base; + 1 for the end-of-turn token a model must also write). The limits it proposes are the longest episode
plus ``--turn-margin`` turns and the longest turn times (1 + ``--token-margin``), rounded up; it prints a table
and the ``eval.limits`` block for the profile's YAML.
"""

from __future__ import annotations

import argparse
import json


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="mini")
    ap.add_argument("--model", default=None, help="tokenizer directory (default: the profile's base)")
    ap.add_argument("--benchmarks", nargs="*", default=None)
    ap.add_argument("--turn-margin", type=int, default=2)
    ap.add_argument("--token-margin", type=float, default=0.25)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    from acl_lib.config import load_config
    from acl_lib.envs import BENCHMARKS
    from acl_lib.eval.sizing import expert_needs
    from acl_lib.model.shipped import shipped_dir

    cfg = load_config(args.profile, seed=0)
    tok = AutoTokenizer.from_pretrained(args.model or str(shipped_dir(cfg)))
    rows = expert_needs(cfg, tok, args.benchmarks or list(BENCHMARKS), args.turn_margin, args.token_margin)
    print(f"{'benchmark':<11} {'eps':>4} {'pass':>4} {'turns':>5} {'tokens':>6} {'p99':>5}  limits (turns, tokens)  "
          f"now ({cfg.eval.max_turns}, {cfg.eval.max_new_tokens})")
    for r in rows:
        now = cfg.eval.limits_for(r["benchmark"])
        differs = "" if now == (r["limit_turns"], r["limit_tokens"]) else f"profile: {now}"
        print(f"{r['benchmark']:<11} {r['episodes']:>4} {r['expert_pass']:>4} {r['max_turns']:>5} {r['max_tokens']:>6} "
              f"{r['p99_tokens']:>5}  ({r['limit_turns']}, {r['limit_tokens']})  {differs}")
    print("eval:\n  limits:")
    for r in rows:
        print(f"    {r['benchmark']}: {{max_turns: {r['limit_turns']}, max_new_tokens: {r['limit_tokens']}}}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"profile": args.profile, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
