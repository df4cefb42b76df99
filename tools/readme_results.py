"""Write the README's results section from a run store.

    python tools/readme_results.py                       # profile mini, seed 0, outputs/
    python tools/readme_results.py --output-dir /tmp/run/outputs --profile mini --seed 0
    python tools/readme_results.py --seeds 0 1 2 --orders   # + the final tables over three seeds, the four orders

Replaces what lies between the README's `<!-- results:begin ... -->` and `<!-- results:end -->` markers with
the scores, the study's figures beside them, the lifts, the forgetting, the run time, and the commits that made
the runs (acl_lib.report.results_markdown, written by acl_lib.report.write_results_section); with --seeds at the
mini profile, also the regime table (the study, the mini regime before its mid-trained base, these runs:
acl_lib.report.regime_markdown). Nothing in that section is typed by hand.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from acl_lib import curriculum, report
from acl_lib.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="mini")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output-dir", default=None, help="run store root (default: the profile's output_dir)")
    ap.add_argument("--readme", default=str(ROOT / "README.md"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[],
                    help="also the final tables over these seeds (mean ± std, findings verdicts)")
    ap.add_argument("--orders", action="store_true",
                    help="also the curriculum-orders study over the four rotations of the curriculum (seed --seed)")
    args = ap.parse_args()
    overrides = [f"output_dir={Path(args.output_dir).resolve()}"] if args.output_dir else []
    cfg = load_config(args.profile, overrides, seed=args.seed)
    orders = curriculum.rotations(cfg.pipeline.curriculum) if args.orders else ()
    print(report.write_results_section(args.readme, cfg, seeds=args.seeds, orders=orders, overrides=overrides))


if __name__ == "__main__":
    main()
