"""Build the mini base with the suite's recipe and ship it (weights, tokenizer, model card) in the repository.

    python benchmarks/build_mini_base.py [--set KEY=VALUE ...]  # the profile's recipe, scored and shipped (resumes;
                                                                # the shipped base's exact command is in its card)
    python benchmarks/build_mini_base.py --no-ship  # build and score only
    python benchmarks/build_mini_base.py --reuse-warmup DIR   # phase 1 taken from an earlier build
    python benchmarks/build_mini_base.py --reuse-phases RUN   # phases 1-2 (or 1-3) taken from an earlier build
    python benchmarks/build_mini_base.py --from-base DIR      # phases 1-3 are a base built by this recipe

Runs notebook 00's step with ``pretrain.source=pretrain`` for the mini profile, seed 0, into
``outputs/base_build/`` (a run like any other: killed, it resumes from its last checkpoint), scores the result
on the whole mini suite, measures its context-copy gain, and writes ``acl_lib/data/mini_base/`` (model files,
``card.json``, ``MODEL_CARD.md``). The mini profile then loads that directory (``pretrain.source: shipped``),
checking the weights' sha256 against the card.

``--reuse-warmup DIR``: the copy warm-up (phase 1) depends only on the initialised model, the tokenizer and the
``copy_warmup_*`` settings, so a build that changes only phase 2 may take the finished phase 1 of an earlier
build (its ``checkpoints/copy_warmup``) instead of recomputing it. It is refused unless the earlier warm-up's
tokenizer is byte-identical to this build's; the card records that it was reused.

``--reuse-phases RUN``: the same for phases 1 and 2 together, when only phase 3 (``pretrain.midtrain_*``) or phase 4
(``pretrain.cooldown_*``) changed, and for phase 3 as well when only phase 4 changed (a cool-down tried on an
earlier build's mid-training). ``RUN`` is the earlier build's run directory (``.../mini/seed0/base``); it is
refused unless its recorded config equals this build's in everything but the ``midtrain_*`` and ``cooldown_*``
settings and its tokenizer is byte-identical.

``--from-base DIR``: only phase 4 (the cool-down, ``pretrain.cooldown_*``) runs, from the base in ``DIR`` (a shipped
base directory: weights and ``card.json``). It is refused unless the card's recipe hash equals this recipe's with
the cool-down taken out, and the weights are the card's (sha256). The new card keeps the earlier card's phases
1-3 (their wall time counted where they ran) and says they were taken from it.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import date
from pathlib import Path

RECIPE_SECTIONS = ("model", "pretrain", "worlds")


def recipe_hash(cfg) -> str:
    """Hash of what the recipe computes: model, pretrain and worlds sections, minus where the result goes."""
    import hashlib

    d = cfg.to_dict()
    tree = {k: d[k] for k in RECIPE_SECTIONS}
    for k in ("source", "shipped_dir"):
        tree["pretrain"].pop(k, None)
    return hashlib.sha256(json.dumps(tree, sort_keys=True).encode()).hexdigest()[:16]


def machine() -> str:
    import os

    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPU cores ({cpu})"


def _start_from(flag: str, copies: dict, check=None, more=None) -> None:
    """Make ``train_pretrain`` start from finished phases of an earlier build: ``copies`` maps each phase's
    directory there to its place under this build (``pretrain.WARMUP_DIR``...), copied before training (marked
    ``REUSED_FROM``) so that ``train_pretrain`` finds them finished; ``more(cfg)`` adds copies decided by this
    build's config. Refused (``SystemExit`` naming ``flag``) unless the earlier build's tokenizer is byte-identical
    to this build's and ``check(cfg)`` (a reason or None) passes."""
    import shutil

    from acl_lib.train import pretrain

    missing = [str(d) for d in copies if pretrain.finished_phase(d) is None]
    if missing:
        raise SystemExit(f"{flag}: no finished phase (its model/ and train_summary.json) at {', '.join(missing)}")
    original = pretrain.train_pretrain

    def train_pretrain(cfg, model_dir, corpus, out_dir):
        why = check(cfg) if check else None
        if why:
            raise SystemExit(f"{flag}: {why}; refused")
        ours = (Path(model_dir) / "tokenizer.json").read_bytes()
        taken = {**copies, **(more(cfg) if more else {})}
        other = [str(d) for d in taken if (d / "model" / "tokenizer.json").read_bytes() != ours]
        if other:
            raise SystemExit(f"{flag}: {', '.join(other)} built with another tokenizer (another corpus); refused")
        for src_dir, rel in taken.items():
            dest = Path(out_dir) / rel
            if not (dest / "model").exists():
                shutil.copytree(src_dir, dest, dirs_exist_ok=True)
                (dest / "REUSED_FROM").write_text(str(src_dir.resolve()) + "\n")
        return original(cfg, model_dir, corpus, out_dir)

    pretrain.train_pretrain = train_pretrain


def reuse_warmup(src: str) -> None:
    """Make ``train_pretrain`` start from the finished warm-up in ``src`` (checked: same tokenizer)."""
    from acl_lib.train import pretrain

    _start_from("--reuse-warmup", {Path(src): pretrain.WARMUP_DIR})


def _settings_before(tree: dict, prefixes: tuple[str, ...]) -> dict:
    """The recipe sections with the settings of the later phases (``pretrain`` keys starting with one of
    ``prefixes``) and where the result goes taken out."""
    tree = {k: dict(tree[k]) for k in RECIPE_SECTIONS}
    tree["pretrain"] = {k: v for k, v in tree["pretrain"].items()
                        if not k.startswith(prefixes) and k not in ("source", "shipped_dir")}
    return tree


def _diff(ours: dict, theirs: dict) -> list[str]:
    return sorted(f"{sec}.{k}" for sec in ours for k in set(ours[sec]) | set(theirs.get(sec, {}))
                  if ours[sec].get(k) != theirs.get(sec, {}).get(k))


def reuse_phases(src: str) -> None:
    """Make ``train_pretrain`` start phase 3 from the finished phases 1-2 of the build in ``src`` (checked: same
    settings but for phases 3-4, same tokenizer), or phase 4 from its finished phases 1-3 when phase 3's settings
    are this build's too."""
    import yaml

    from acl_lib.train import pretrain

    src_dir = Path(src)
    if not (src_dir / "config.yaml").is_file():
        raise SystemExit(f"--reuse-phases: {src_dir} has no finished phases 1-2 (missing its config.yaml)")
    tree = yaml.safe_load((src_dir / "config.yaml").read_text())
    later = ("midtrain_", "cooldown_")

    def check(cfg) -> str | None:
        diff = _diff(_settings_before(cfg.to_dict(), later), _settings_before(tree, later))
        return f"{src_dir} was built with other phase 1-2 settings ({diff})" if diff else None

    def phase_3(cfg) -> dict:
        """Phase 3 too, when it is finished there and only the cool-down's settings differ."""
        mid = src_dir / pretrain.MIDTRAIN_DIR
        same = not _diff(_settings_before(cfg.to_dict(), ("cooldown_",)), _settings_before(tree, ("cooldown_",)))
        return {mid: pretrain.MIDTRAIN_DIR} if same and pretrain.finished_phase(mid) is not None else {}

    _start_from("--reuse-phases", {src_dir / d: d for d in (pretrain.WARMUP_DIR, pretrain.CORPUS_DIR)}, check,
                more=phase_3)


def phases_1_3(cfg):
    """The recipe of the base a cool-down starts from: ``cfg`` without phase 4, and with the worlds its phases
    train on (``Config.pretraining_worlds``) as its worlds. The evaluated desk enters phases 1-3 only through the
    prompts phase 3 drops as evaluated, which ``cooldown_from_base`` checks apart."""
    from acl_lib.config import Config, PretrainConfig

    tree = cfg.to_dict()
    tree["worlds"] = cfg.pretraining_worlds().model_dump(mode="json")
    tree["pretrain"].update({k: PretrainConfig.model_fields[k].default
                             for k in (*PretrainConfig.COOLDOWN_KEYS, "world_retail_kinds")})
    return Config.model_validate(tree)


def same_phase_3_draw(cfg, card: dict) -> str | None:
    """Where the evaluated desk differs from the pretraining one: ``None`` if phase 3, drawn under ``cfg``, keeps
    and drops (as evaluated) the episodes the card's base was trained on, else what differs."""
    from acl_lib.train import midtrain

    if cfg.pretraining_worlds() == cfg.worlds:
        return None
    ours = midtrain.midtrain_demos(cfg)[1]
    theirs = card.get("midtrain", {}).get("demos")
    return None if ours == theirs else f"phase 3 would draw {ours}, the base was trained on {theirs}"


def cooldown_from_base(cfg, src: str, out_dir: str) -> tuple[str, dict, dict]:
    """Phase 4 alone from the base in ``src`` (checked against its card) into ``<out_dir>/mini/seed0/from_base``;
    returns ``(model directory, the earlier card, phase 4's summary)``."""
    import shutil

    from acl_lib.atomic import atomic_dir
    from acl_lib.model.shipped import CARD, WEIGHTS, sha256
    from acl_lib.train import pretrain

    src_dir = Path(src)
    if cfg.pretrain.cooldown_steps <= 0:
        raise SystemExit("--from-base: the recipe has no phase 4 (pretrain.cooldown_steps is 0)")
    if not (src_dir / CARD).is_file() or not (src_dir / WEIGHTS).is_file():
        raise SystemExit(f"--from-base: {src_dir} has no {CARD} and {WEIGHTS} (a shipped base directory)")
    card = json.loads((src_dir / CARD).read_text())
    want = recipe_hash(phases_1_3(cfg))
    if card.get("recipe_config_hash") != want:
        raise SystemExit(f"--from-base: {src_dir} was built by recipe {card.get('recipe_config_hash')}, this "
                         f"recipe's phases 1-3 are {want}; refused")
    if (why := same_phase_3_draw(cfg, card)) is not None:
        raise SystemExit(f"--from-base: {why}; refused")
    if sha256(src_dir / WEIGHTS) != card.get("sha256"):
        raise SystemExit(f"--from-base: {src_dir / WEIGHTS} is not the weights its card names (sha256); refused")
    run_dir = Path(out_dir) / cfg.profile / "seed0" / "from_base"
    summary = pretrain.finish_cooldown(cfg, src_dir, run_dir)
    with atomic_dir(run_dir / "model") as tmp:
        shutil.copytree(run_dir / pretrain.COOLDOWN_DIR / "model", tmp, dirs_exist_ok=True)
    return str(run_dir / "model"), card, summary


def cooldown_card(cfg, summary: dict) -> dict:
    """The card's entry on phase 4: its wall time, steps and tokens."""
    p = cfg.pretrain
    return {"wall_s": summary["wall_s"], "steps": p.cooldown_steps,
            "tokens_seen": p.cooldown_steps * p.batch_size * p.seq_len}


def score(cfg, model_dir, eval_dir) -> tuple[dict, dict]:
    """``(scores on the whole mini suite, context-copy gain)`` of the built base."""
    from acl_lib.eval.harness import evaluate
    from acl_lib.model import load_model_and_tokenizer
    from acl_lib.model.copying import copy_gain, world_word_lists

    metrics = evaluate(cfg, str(model_dir), eval_dir, suites="all")
    model, tok = load_model_and_tokenizer(model_dir)
    gain = copy_gain(model.eval(), tok, world_word_lists(cfg))
    print("context-copy gain", gain, "scores", metrics["scores"], flush=True)
    return metrics["scores"], gain


def ship(args: argparse.Namespace, cfg, model_dir, card: dict) -> None:
    """Write the base and its card to ``--ship-to`` (default: the profile's shipped base), unless ``--no-ship``."""
    from acl_lib.model.shipped import shipped_dir, write_shipped

    if args.no_ship:
        return
    dest = Path(args.ship_to) if args.ship_to else shipped_dir(cfg)
    card = write_shipped(Path(model_dir), dest, card)
    print(f"shipped to {dest} (sha256 {card['sha256']})", flush=True)


def command(args: argparse.Namespace) -> str:
    """The command that rebuilds the base from scratch, as its card records it."""
    return " ".join(["python benchmarks/build_mini_base.py", *(["--set", *args.overrides] if args.overrides else [])])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-ship", action="store_true", help="build and score, do not write acl_lib/data/mini_base")
    ap.add_argument("--output-dir", default="outputs/base_build")
    ap.add_argument("--reuse-warmup", metavar="DIR", default=None,
                    help="a finished checkpoints/copy_warmup of an earlier build with the same phase-1 settings")
    ap.add_argument("--set", dest="overrides", nargs="*", action="extend", default=[], metavar="KEY=VALUE",
                    help="config overrides on the mini profile (the shipped base's are in its card's command)")
    ap.add_argument("--reuse-phases", metavar="RUN", default=None,
                    help="an earlier build's run directory whose phases 1-2 had this build's settings")
    ap.add_argument("--ship-to", metavar="DIR", default=None,
                    help="write the base there instead of acl_lib/data/mini_base (a candidate: run the suite on it "
                         "with --set pretrain.shipped_dir=DIR)")
    ap.add_argument("--from-base", metavar="DIR", default=None,
                    help="a base built by this recipe's phases 1-3 (card checked): run phase 4 only")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if sum(map(bool, (args.reuse_warmup, args.reuse_phases, args.from_base))) > 1:
        raise SystemExit("--reuse-warmup, --reuse-phases and --from-base: give one")
    if args.from_base:
        return main_from_base(args)
    if args.reuse_phases:
        reuse_phases(args.reuse_phases)
    if args.reuse_warmup:
        reuse_warmup(args.reuse_warmup)

    from acl_lib.config import load_config
    from acl_lib.model import base_run
    from acl_lib.pipeline import build_base
    from acl_lib.train import pretrain
    from acl_lib.train.common import read_log

    cfg = load_config("mini", [*args.overrides, f"output_dir={args.output_dir}", "pretrain.source=pretrain"], seed=0)
    t0 = time.perf_counter()
    model_dir = build_base(cfg, evaluate=False)
    run = base_run(cfg)
    print(f"base built in {run.path} ({time.perf_counter() - t0:.0f} s this call)", flush=True)
    scores, gain = score(cfg, model_dir, run.path / "eval")
    info = json.loads((run.path / "base.json").read_text())
    summary = json.loads((run.path / "train_summary.json").read_text())
    warm = summary.get("copy_warmup") or {}
    mid = summary.get("midtrain")
    if mid:  # phase 3's tokens: its rows' tokens times the epochs its steps cover (rows have unequal lengths)
        mid = {"wall_s": mid["wall_s"], "steps": mid["steps"], "demos": mid["demos"],
               "tokens_seen": round(mid["dataset_tokens"] * mid["steps"] * cfg.pretrain.midtrain_batch_size
                                    / max(1, mid["rows"]))}
    cool = cooldown_card(cfg, summary["cooldown"]) if summary.get("cooldown") else None
    tokens = (summary["tokens_seen"] + warm.get("tokens_seen", 0) + (mid["tokens_seen"] if mid else 0)
              + (cool["tokens_seen"] if cool else 0))
    complete = json.loads((run.path / "COMPLETE.json").read_text())
    # each phase's own time, recorded where it ran; a phase copied from an earlier build (--reuse-*) is marked
    # REUSED_FROM and was not spent by this run
    phase_s = {pretrain.WARMUP_DIR: warm.get("wall_s", 0.0), pretrain.CORPUS_DIR: summary["wall_s"],
               pretrain.MIDTRAIN_DIR: mid["wall_s"] if mid else 0.0,
               pretrain.COOLDOWN_DIR: cool["wall_s"] if cool else 0.0}
    reused = {d for d in phase_s if (run.path / d / "REUSED_FROM").is_file()}
    phase_3_reused = pretrain.MIDTRAIN_DIR in reused
    reused_s = sum(phase_s[d] for d in reused)
    card = {
        "command": command(args),
        "recipe_config_hash": recipe_hash(cfg),
        "run_config_hash": complete["config_hash"],
        "config": {k: cfg.to_dict()[k] for k in RECIPE_SECTIONS},
        "parameters": info["parameters"],
        "vocab_size": info["vocab_size"],
        "corpus_tokens": info["corpus_tokens"],
        "tokens_seen": tokens,
        # reused phases count where they ran; a build resumed after an interruption has a run duration of its
        # last attempt only, and then the phases' sum is the better measure
        "wall_s": round(max(complete["duration_s"] + reused_s, sum(phase_s.values())), 1),
        "wall_s_copy_warmup": round(warm.get("wall_s", 0.0), 1),
        "wall_s_corpus": round(summary["wall_s"], 1),
        "midtrain": mid,
        "cooldown": cool,
        "machine": machine(),
        "built_at": date.today().isoformat(),
        "copy_warmup_reused_from": ("an earlier build of this recipe, stopped in its phase 2 (the phase-2 "
                                    "settings changed)") if args.reuse_warmup else None,
        "phases_1_2_reused_from": ("an earlier build of this recipe with other phase-3 (mid-training) settings"
                                   if args.reuse_phases and not phase_3_reused else None),
        "phases_1_3_reused_from": ("an earlier build of this recipe with other phase-4 (cool-down) settings"
                                   if phase_3_reused else None),
        "context_copy": gain,
        "copy_gain_during_training": [
            {"phase": r["phase"], "step": r["step"], "copy_gain": r["copy_gain"]}
            for log in (run.path / "checkpoints" / "copy_warmup" / "train_log.jsonl", run.path / "train_log.jsonl",
                        run.path / "checkpoints" / "corpus" / "train_log.jsonl",
                        run.path / "checkpoints" / "cooldown" / "train_log.jsonl")
            for r in read_log(log) if "copy_gain" in r],
        "scores": scores,
    }
    ship(args, cfg, run.path / "model", card)


def main_from_base(args: argparse.Namespace) -> None:
    """``--from-base``: phase 4 from an earlier base, scored, its card the earlier card plus phase 4."""
    from acl_lib.config import load_config
    from acl_lib.train.common import read_log, set_threads
    from acl_lib.train.pretrain import COOLDOWN_DIR

    cfg = load_config("mini", [*args.overrides, f"output_dir={args.output_dir}", "pretrain.source=pretrain"], seed=0)
    set_threads(cfg)
    model_dir, old, summary = cooldown_from_base(cfg, args.from_base, args.output_dir)
    run_dir = Path(model_dir).parent
    scores, gain = score(cfg, model_dir, run_dir / "eval")
    cooldown = cooldown_card(cfg, summary)
    card = {k: v for k, v in old.items() if k != "sha256"}
    card.update({
        "command": command(args),
        "recipe_config_hash": recipe_hash(cfg),
        "config": {k: cfg.to_dict()[k] for k in RECIPE_SECTIONS},
        "tokens_seen": old["tokens_seen"] + cooldown["tokens_seen"],
        "wall_s": round(old["wall_s"] + cooldown["wall_s"], 1),
        "cooldown": cooldown,
        "phases_1_3_from": (f"the base of recipe {old['recipe_config_hash']} (sha256 {old['sha256'][:16]}...), "
                            f"built {old['built_at']} by `{old['command']}`"),
        "machine": machine(),
        "built_at": date.today().isoformat(),
        "context_copy": gain,
        "copy_gain_during_training": old.get("copy_gain_during_training", []) + [
            {"phase": r["phase"], "step": r["step"], "copy_gain": r["copy_gain"]}
            for r in read_log(run_dir / COOLDOWN_DIR / "train_log.jsonl") if "copy_gain" in r],
        "scores": scores,
    })
    ship(args, cfg, model_dir, card)


if __name__ == "__main__":
    main()
