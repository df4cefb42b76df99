"""Calibration probe: an MLE expert's LoRA-RL learning rate (``mle.grpo_learning_rate``).

    python benchmarks/lora_lr_probe.py BACKBONE_DIR --domain math --steps 100 --lrs 3e-4 1e-3 3e-3 [--seed 0]

For each learning rate, trains the domain's LoRA expert on ``BACKBONE_DIR`` by GRPO (``mle``'s recipe: the stage's
rollouts, ``expert_cfg``; ``--steps`` GRPO steps), merges the adapter into a copy of the backbone and scores the
domain's in-domain benchmark; the backbone itself is scored first. Writes under ``--out`` (default
``/tmp/lora_lr_probe``) and prints one ``RESULT`` line per learning rate: training seconds, the score and its
lift over the backbone. Numbers from this probe are in docs/mini-calibration.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("backbone")
    ap.add_argument("--domain", default="math", choices=["math", "search", "ecom", "if"])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--lrs", type=float, nargs="+", default=[3e-4, 1e-3, 3e-3])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default="mini")
    ap.add_argument("--out", default="/tmp/lora_lr_probe")
    ap.add_argument("--set", dest="overrides", nargs="*", action="extend", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)

    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from acl_lib.config import load_config
    from acl_lib.consolidate.mle.experts import train_lora_grpo
    from acl_lib.consolidate.mle.specs import expert_cfg
    from acl_lib.envs import IN_DOMAIN
    from acl_lib.eval.harness import evaluate

    out = Path(args.out)
    bench = IN_DOMAIN[args.domain]
    base_cfg = load_config(args.profile, overrides=[f"output_dir={out}", *args.overrides], seed=args.seed)
    before = evaluate(base_cfg, args.backbone, out / "backbone_eval", benchmarks=[bench])["scores"][bench]
    print(f"backbone {bench} {before:.1f}", flush=True)
    for lr in args.lrs:
        cfg = load_config(args.profile, seed=args.seed, overrides=[
            f"output_dir={out}", f"mle.grpo_learning_rate={lr}", f"mle.grpo_max_steps={args.steps}",
            *args.overrides])
        run = out / f"lr{lr:g}"
        t0 = time.perf_counter()
        train_lora_grpo(expert_cfg(cfg, args.domain), args.backbone, args.domain, run / "expert")
        wall = time.perf_counter() - t0
        tok = AutoTokenizer.from_pretrained(args.backbone)
        merged = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(args.backbone),
                                           run / "expert" / "model").merge_and_unload()
        merged.save_pretrained(run / "merged")
        tok.save_pretrained(run / "merged")
        score = evaluate(cfg, str(run / "merged"), run / "eval", benchmarks=[bench])["scores"][bench]
        row = {"lr": lr, "steps": args.steps, "train_s": round(wall, 1), bench: score, "lift": round(score - before, 2)}
        (run / "result.json").write_text(json.dumps(row))
        print("RESULT", json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
