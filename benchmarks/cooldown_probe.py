"""Probe a cool-down (phase 4 of the mini base) from an existing base, then its scores on the evaluated world.

    git archive 3d522c8 acl_lib/data/mini_base | tar -x -C outputs/b6    # b6: the base before its phase 4
    python benchmarks/cooldown_probe.py --name c150n0 --from outputs/b6/acl_lib/data/mini_base \
        --set pretrain.cooldown_steps=150 pretrain.cooldown_noise=0

Runs ``acl_lib.train.pretrain.finish_cooldown`` (the very phase 4 of ``benchmarks/build_mini_base.py``: the phase-2
corpus drawn again with ``pretrain.cooldown_noise``, ``pretrain.cooldown_steps`` steps from
``pretrain.cooldown_lr``) from ``--from`` (default: the shipped base, which already has the profile's phase 4;
another phase 4 is probed from b6, the shipped base before it, as above) into ``outputs/cooldown_probes/<name>/``,
scores the result on the mini suite of world seed 0 (``--suites``, default in-domain), measures its context-copy
gain, and appends one JSON line to ``outputs/cooldown_probes/probes.jsonl`` (also printed as a ``RESULT`` line).
A probe is how the cool-down in ``acl_lib/profiles/mini.yaml`` was chosen (docs/mini-calibration.md);
interrupted, it resumes from its last checkpoint.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", required=True, help="the probe's directory under outputs/cooldown_probes/")
    ap.add_argument("--from", dest="start", default=None, help="the model to cool down (default: the shipped base)")
    ap.add_argument("--suites", default="in_domain", choices=["in_domain", "ood", "all"])
    ap.add_argument("--root", default="outputs/cooldown_probes")
    ap.add_argument("--set", dest="overrides", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                    help="config overrides on the mini profile (pretrain.cooldown_*, torch_threads)")
    args = ap.parse_args(argv)

    from acl_lib.config import load_config
    from acl_lib.eval.harness import evaluate
    from acl_lib.model import load_model_and_tokenizer
    from acl_lib.model.copying import copy_gain, world_word_lists
    from acl_lib.model.shipped import shipped_dir
    from acl_lib.runs import ensure_console_logging
    from acl_lib.train import common, pretrain

    ensure_console_logging()
    cfg = load_config("mini", args.overrides, seed=0)
    if cfg.pretrain.cooldown_steps <= 0:
        raise SystemExit("set pretrain.cooldown_steps: this probe has nothing to train")
    common.set_threads(cfg)
    start = Path(args.start) if args.start else shipped_dir(cfg)
    out = Path(args.root) / args.name
    t0 = time.perf_counter()
    summary = pretrain.finish_cooldown(cfg, start, out)
    wall = time.perf_counter() - t0
    model_dir = out / pretrain.COOLDOWN_DIR / "model"
    metrics = evaluate(cfg, str(model_dir), out / "eval", suites=args.suites)
    model, tok = load_model_and_tokenizer(model_dir)
    gain = copy_gain(model.eval(), tok, world_word_lists(cfg))
    p = cfg.pretrain
    row = {"name": args.name, "from": str(start), "overrides": args.overrides,
           "cooldown": {"steps": p.cooldown_steps, "lr": p.cooldown_lr, "noise": p.cooldown_noise},
           "train_wall_s": round(wall, 1), "last_loss": summary.get("last_loss"),
           "scores": metrics["scores"], "copy_gain": gain["gain"]}
    with open(Path(args.root) / "probes.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    print("RESULT", json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
