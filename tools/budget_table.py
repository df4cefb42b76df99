"""Where a seed's compute goes, from a run store: print the budget table, or write it into the README.

    python tools/budget_table.py --output-dir /tmp/run/outputs --seeds 0            # print it
    python tools/budget_table.py --output-dir /tmp/run/outputs --seeds 0 1 2 --readme README.md

The table is ``acl_lib.report.budget_section``: each step's run-minutes and its share of a seed, training and
evaluation inside them, and the RL rollouts of each run beside the paper profile's recipe. With ``--readme`` it
replaces what lies between the README's ``<!-- budget:begin -->`` and ``<!-- budget:end -->`` markers (the results
over seeds carry the same table, from ``tools/readme_results.py --seeds``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from acl_lib import report
from acl_lib.atomic import atomic_write_text
from acl_lib.config import load_config
from acl_lib.runs import code_version

BEGIN, END = "<!-- budget:begin", "<!-- budget:end -->"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="mini")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--output-dir", default=None, help="run store root (default: the profile's output_dir)")
    ap.add_argument("--readme", default=None, help="write the table between the budget markers of this file")
    args = ap.parse_args()
    overrides = [f"output_dir={Path(args.output_dir).resolve()}"] if args.output_dir else []
    cfg = load_config(args.profile, overrides, seed=args.seeds[0])
    body = report.budget_section(cfg, args.seeds, overrides)
    if not body:
        raise SystemExit(f"no complete runs of seeds {args.seeds} under {cfg.seed_dir().parent}")
    codes = sorted({json.loads((p / "COMPLETE.json").read_text()).get("code", "?")
                    for p in cfg.seed_dir().iterdir() if (p / "COMPLETE.json").is_file()})
    body += (f"\n\nSeeds {', '.join(map(str, args.seeds))} of the profile {args.profile}; the runs' code: "
             f"{', '.join(codes)} (this table: `python tools/budget_table.py`, code {code_version()}).")
    if not args.readme:
        print(body)
        return
    readme = Path(args.readme)
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{readme} has no '{BEGIN} -->' / '{END}' markers")
    head, rest = text.split(BEGIN, 1)
    marker_line, _ = rest.split("-->", 1)
    _, tail = rest.split(END, 1)
    atomic_write_text(readme, f"{head}{BEGIN}{marker_line}-->\n{body}\n{END}{tail}")
    print(body)


if __name__ == "__main__":
    main()
