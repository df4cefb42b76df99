"""Calibration probe: run one stage recipe from any checkpoint and score its in-domain benchmark before/after.

    python benchmarks/probe_stage.py TAG DOMAIN MODEL_DIR [--profile mini] [--seed 0] [--also BENCH ...]
                                     [--set KEY=VALUE ...]

``DOMAIN`` is math, search, ecom or if; the profile's ``pipeline.stage_overrides`` for it apply first, then
``--set``. Writes ``outputs/<profile>/seed<SEED>/pstage_<TAG>/`` (replaced on every call). ``--seed`` sets the
training seed and the sampling seed of the scores (a run's lift depends on both: the seeds' bases score aime26
19.9 / 25.2 / 24.8 at seeds 0 / 1 / 2). Prints one ``RESULT``
line: training wall time and the in-domain score before and after, then, with ``--also``, other benchmarks'
scores before and after (e.g. ``--also aime26`` for what a search stage started from ``seq_math`` leaves of math).
"""

from __future__ import annotations

import argparse
import shutil
import time

from acl_lib.domains import BENCHMARK_DOMAIN


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tag")
    ap.add_argument("domain", choices=["math", "search", "ecom", "if"])
    ap.add_argument("model_dir")
    ap.add_argument("--profile", default="mini")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--also", nargs="*", default=[], metavar="BENCH", choices=list(BENCHMARK_DOMAIN),
                    help="more benchmarks to score before and after (what the stage leaves of other domains)")
    ap.add_argument("--set", dest="overrides", nargs="*", action="extend", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)

    from acl_lib.config import load_config
    from acl_lib.envs import IN_DOMAIN
    from acl_lib.eval.harness import evaluate
    from acl_lib.pipeline import STAGE_SECTIONS
    from acl_lib.runs import Run
    from acl_lib.train.stage import run_stage

    # the stage overrides (the profile's, or --set pipeline.stage_overrides=...) first, then --set, which wins
    given = load_config(args.profile, overrides=args.overrides, seed=args.seed)
    stage_items = given.pipeline.stage_overrides.get(args.domain, [])
    cfg = load_config(args.profile, overrides=[*stage_items, *args.overrides], seed=args.seed)
    run = Run(cfg, f"pstage_{args.tag}", sections=STAGE_SECTIONS)
    shutil.rmtree(run.path, ignore_errors=True)
    run.path.mkdir(parents=True)
    bench = IN_DOMAIN[args.domain]
    benches = [bench, *(b for b in args.also if b != bench)]
    scores_before = evaluate(cfg, args.model_dir, run.path / "eval_before", benchmarks=benches)["scores"]
    t0 = time.perf_counter()
    run_stage(cfg, args.domain, args.model_dir, run.path)
    out = run.path / "model"
    train_s = time.perf_counter() - t0
    scores_after = evaluate(cfg, str(out), run.path / "eval_after", benchmarks=benches)["scores"]
    print("RESULT", args.tag, args.domain, "seed", args.seed, "train_s", round(train_s),
          *(f"{b} before {scores_before[b]} after {scores_after[b]}" for b in benches), flush=True)


if __name__ == "__main__":
    main()
