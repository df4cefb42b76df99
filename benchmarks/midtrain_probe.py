"""Probe a mid-training mixture: phase 3 alone from an existing base, then the scores on the evaluated world.

    python benchmarks/midtrain_probe.py --name m1 --set pretrain.midtrain_steps=300 \\
        "pretrain.midtrain_demos={math: 400, search: 200, ecom: 150, if: 300}"
    python benchmarks/midtrain_probe.py --name m2 --from outputs/base_build/mini/seed0/base/checkpoints/corpus/model ...

Runs ``acl_lib.train.midtrain.train_midtrain`` (the very phase 3 of ``benchmarks/build_mini_base.py``) from
``--from`` (default: the shipped mini base, whose phases 1-2 are this recipe's) into
``outputs/midtrain_probes/<name>/``, scores the result on the mini suite (``--suites``, default all) of world
seed 0, and appends one JSON line (settings, demos, wall time, scores, context-copy gain) to
``outputs/midtrain_probes/probes.jsonl``. A probe is how the mixture in ``acl_lib/profiles/mini.yaml`` was
chosen (docs/mini-calibration.md); interrupted, it resumes from its last checkpoint.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True, help="the probe's directory under outputs/midtrain_probes/")
    ap.add_argument("--from", dest="start", default=None, help="the model to mid-train (default: the shipped base)")
    ap.add_argument("--suites", default="all", choices=["in_domain", "ood", "all"])
    ap.add_argument("--root", default="outputs/midtrain_probes")
    ap.add_argument("--set", dest="overrides", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                    help="config overrides on the mini profile (pretrain.midtrain_*)")
    args = ap.parse_args(argv)

    from acl_lib.config import load_config
    from acl_lib.eval.harness import evaluate
    from acl_lib.model import load_model_and_tokenizer
    from acl_lib.model.copying import copy_gain, world_word_lists
    from acl_lib.model.shipped import shipped_dir
    from acl_lib.runs import ensure_console_logging
    from acl_lib.train import midtrain

    ensure_console_logging()  # the phase's and the evaluation's progress lines, in a terminal or a log file

    cfg = load_config("mini", args.overrides, seed=0)
    if not midtrain.enabled(cfg):
        raise SystemExit("set pretrain.midtrain_steps and pretrain.midtrain_demos: this probe has nothing to train")
    start = Path(args.start) if args.start else shipped_dir(cfg)
    out = Path(args.root) / args.name
    t0 = time.perf_counter()
    summary = midtrain.train_midtrain(cfg, start, out)
    wall = time.perf_counter() - t0
    metrics = evaluate(cfg, str(out / "model"), out / "eval", suites=args.suites)
    model, tok = load_model_and_tokenizer(out / "model")
    gain = copy_gain(model.eval(), tok, world_word_lists(cfg))
    p = cfg.pretrain
    row = {"name": args.name, "from": str(start), "overrides": args.overrides,
           "midtrain": {"demos": p.midtrain_demos, "steps": p.midtrain_steps, "batch_size": p.midtrain_batch_size,
                        "lr": p.midtrain_lr},
           "kept": {d: s["kept"] for d, s in summary["demos"]["domains"].items()},
           "dropped_as_evaluated": {d: s["dropped_as_evaluated"] for d, s in summary["demos"]["domains"].items()},
           "train_wall_s": round(wall, 1),
           "first_loss": summary.get("first_loss"), "last_loss": summary.get("last_loss"),
           "scores": metrics["scores"], "copy_gain": gain["gain"]}
    with open(Path(args.root) / "probes.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row, indent=1), flush=True)


if __name__ == "__main__":
    main()
