"""The pretrained mini base shipped with the suite (``acl_lib/data/mini_base/``) and its model card.

The mini profile starts from a base built once by the suite's own recipe (``benchmarks/build_mini_base.py``,
about an hour on 2 CPU cores), as the paper profile starts from the released Qwen3-8B-Base. Beside the weights
and tokenizer lie ``card.json`` (machine-readable: recipe, config hash, tokens seen, wall time, scores,
context-copy gain, sha256 of the weights) and ``MODEL_CARD.md`` (the same for people).

- ``shipped_dir(cfg)``: where it lies (``pretrain.shipped_dir``, relative to the checkout).
- ``read_card(cfg)``: the card, or a clear error naming the missing file.
- ``verify(cfg)``: the card plus checks that the weights are the card's (sha256) and that ``cfg.model`` is
  the architecture they were built with; a mismatch is an error before any compute.
- ``write_shipped(...)``: used by the builder script to write the directory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from acl_lib.atomic import file_sha256
from acl_lib.config import PretrainConfig

if TYPE_CHECKING:
    from acl_lib.config import Config

CARD = "card.json"
CARD_MD = "MODEL_CARD.md"
WEIGHTS = "model.safetensors"
# The fields of cfg.model a shipped checkpoint fixes (the rest, dtype and base_model, are how it is loaded).
ARCH_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "max_position_embeddings", "tie_word_embeddings")


def shipped_dir(cfg: Config) -> Path:
    p = Path(cfg.pretrain.shipped_dir)
    if p.is_absolute():
        return p
    return Path(__file__).resolve().parents[2] / p


sha256 = file_sha256  # one implementation, in acl_lib.atomic


def read_card(cfg: Config) -> dict:
    path = shipped_dir(cfg) / CARD
    if not path.is_file():
        raise FileNotFoundError(
            f"the shipped base's model card {path} is missing; restore it from the repository, or build the "
            "base from scratch with --set pretrain.source=pretrain")
    return json.loads(path.read_text())


def verify(cfg: Config) -> dict:
    """The card of the shipped base, after checking weights (sha256) and architecture against it."""
    card = read_card(cfg)
    weights = shipped_dir(cfg) / WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(f"the shipped base's weights {weights} are missing")
    digest = sha256(weights)
    if digest != card["sha256"]:
        raise ValueError(f"{weights} has sha256 {digest}, its model card says {card['sha256']}: the file was "
                         "changed or is a Git LFS pointer; restore it, or rebuild with --set pretrain.source=pretrain")
    built = card["config"]["model"]
    diff = {k: (cfg.model.model_dump()[k], built[k]) for k in ARCH_KEYS if cfg.model.model_dump()[k] != built[k]}
    if diff:
        raise ValueError(f"model.* differs from the shipped base's architecture (yours, shipped): {diff}; "
                         "to train another architecture build its base with --set pretrain.source=pretrain")
    return card


def write_shipped(model_dir: Path, dest: Path, card: dict) -> dict:
    """Copy a built base (weights, configs, tokenizer) into ``dest`` with its card (sha256 filled in)."""
    dest.mkdir(parents=True, exist_ok=True)
    for p in Path(model_dir).iterdir():
        if p.is_file() and p.name != "training_args.bin":  # a pickle of the trainer's arguments: not the model
            shutil.copy2(p, dest / p.name)
    card = dict(card, sha256=sha256(dest / WEIGHTS))
    (dest / CARD).write_text(json.dumps(card, indent=2) + "\n")
    (dest / CARD_MD).write_text(render_card(card))
    return card


def midtrain_line(p: dict, mid: dict) -> str:
    """The model card's line on phase 3 (mid-training): its mixture, budget and what was kept."""
    kept = ", ".join(f"{d} {s['kept']}" for d, s in mid["demos"]["domains"].items())
    return (f"- Phase 3, mid-training: {p['midtrain_steps']} steps x {p['midtrain_batch_size']} rows, lr "
            f"{p['midtrain_lr']} cosine, assistant-only loss, on rejection-sampled scripted-expert episodes of the "
            f"four training worlds from worlds with seeds {mid['demos']['world_seeds']} ({kept}; prompts equal to an "
            f"evaluated prompt dropped: {sum(s['dropped_as_evaluated'] for s in mid['demos']['domains'].values())}); "
            f"{mid['tokens_seen']:,} tokens seen."
            + (" The instruction-following rows use the wide vocabulary (`pretrain.midtrain_if_vocab: wide`: "
               "topics and keywords from `acl_lib.envs.instruct.WIDE_NOUNS`, none of them a held-out word)."
               if p.get("midtrain_if_vocab") == "wide" else ""))


def cooldown_line(p: dict, cool: dict) -> str:
    """The model card's line on phase 4 (the cool-down). Settings at their defaults are absent from the dumped
    recipe (``PretrainConfig``'s serializer): the section is validated back to have them."""
    pc = PretrainConfig.model_validate(p)
    noise = pc.noise if pc.cooldown_noise is None else pc.cooldown_noise
    return (f"- Phase 4, cool-down: {cool['steps']} steps x {p['batch_size']} x {p['seq_len']} tokens of the phase-2 "
            f"corpus drawn again with its transcripts' noise at {noise} (another draw of its echo documents, another "
            f"order), lr {pc.cooldown_lr} cosine, {cool['tokens_seen']:,} tokens: the base keeps its "
            "skills but no longer shows them on every prompt, as a modern base that saw general text after its "
            f"mid-training ({cool['wall_s'] / 60:.1f} min).")


def desk_line(p: dict, worlds: dict) -> str:
    """The model card's line on a pretraining retail desk wider than the evaluated one."""
    return (f"- The pretraining worlds' retail desk has the task kinds {', '.join(p['world_retail_kinds'])} "
            "(`pretrain.world_retail_kinds`); the evaluated world's, on which the scores below are taken, "
            f"{', '.join(worlds['retail_kinds'])}.")


def render_card(card: dict) -> str:
    """``MODEL_CARD.md``: what the base is, how it was built, how to rebuild it, what it scores."""
    m, p = card["config"]["model"], card["config"]["pretrain"]
    scores = card.get("scores", {})
    gain = card.get("context_copy", {})
    lines = [
        "# mini base: the pretrained starting point of the mini profile",
        "",
        f"A {card['parameters']:,}-parameter `Qwen3ForCausalLM` (hidden {m['hidden_size']}, {m['num_hidden_layers']} "
        f"layers, {m['num_attention_heads']} heads / {m['num_key_value_heads']} KV heads of {m['head_dim']}, "
        f"byte-level BPE of {card['vocab_size']} tokens with the Qwen3 chat convention), pretrained by the suite's own "
        "recipe on the mini worlds. `make run` (profile `mini`) starts every stage from it, as the paper profile "
        "starts from Qwen3-8B-Base. The base-model step (`build_base`) checks the weights' sha256 against this card "
        "before using them.",
        "",
        "## How it was built",
        "",
        f"- Command: `{card['command']}` (config hash of the recipe: `{card['recipe_config_hash']}`; "
        "the recipe is the `pretrain` section of `acl_lib/profiles/mini.yaml`).",
        f"- Phase 1, copy warm-up: {p['copy_warmup_steps']} steps x {p['copy_warmup_batch']} x "
        f"{p['copy_warmup_seq_len']} tokens of synthetic induction blocks (random token segments, each repeated), "
        f"lr {p['copy_warmup_lr']} constant.",
        f"- Phase 2, corpus: {p['max_steps']} steps x {p['batch_size']} x {p['seq_len']} tokens, lr "
        f"{p['learning_rate']} cosine ({p['warmup_steps']} warm-up steps); the corpus is noisy scripted-expert "
        f"transcripts of the four training worlds and the search world's documents, drawn from worlds with seeds "
        f"{p['world_seeds']} (never the evaluated world's seed), {card['corpus_tokens']:,} tokens, plus echo "
        f"documents (a run of corpus words, then the same run) making up {int(p['copy_mix'] * 100)}% of the "
        "characters.",
        *([midtrain_line(p, card["midtrain"])] if card.get("midtrain") else []),
        *([cooldown_line(p, card["cooldown"])] if card.get("cooldown") else []),
        *([desk_line(p, card["config"]["worlds"])] if p.get("world_retail_kinds") else []),
        f"- Tokens seen: {card['tokens_seen']:,}. Wall time: {card['wall_s'] / 60:.1f} min on {card['machine']}"
        + (f" (phase 1 {card['wall_s_copy_warmup'] / 60:.1f} min, phase 2 {card['wall_s_corpus'] / 60:.1f} min"
           + (f", phase 3 {card['midtrain']['wall_s'] / 60:.1f} min" if card.get("midtrain") else "")
           + (f", phase 4 {card['cooldown']['wall_s'] / 60:.1f} min" if card.get("cooldown") else "") + ")."
           if card.get("wall_s_copy_warmup") is not None else "."),
        *([f"- Phase 1 was taken from an earlier build with the same phase-1 settings and a byte-identical "
           f"tokenizer (`--reuse-warmup`; {card['copy_warmup_reused_from']})."] if card.get("copy_warmup_reused_from")
          else []),
        *(f"- {which} were taken from an earlier build with the same phase {span} settings and a byte-identical "
          f"tokenizer (`--reuse-phases`; {card[key]}); the wall time counts their time where they ran."
          for key, which, span in (("phases_1_2_reused_from", "Phases 1 and 2", "1-2"),
                                   ("phases_1_3_reused_from", "Phases 1-3", "1-3")) if card.get(key)),
        *([f"- Phases 1-3 were taken from {card['phases_1_3_from']} (`--from-base`: the same recipe of phases 1-3, "
           "weights checked against its card); the wall time counts their time where they ran."]
          if card.get("phases_1_3_from") else []),
        f"- Built {card['built_at']}.",
        "",
        "## What it does",
        "",
        f"- Context-copy gain (`python benchmarks/context_copy.py acl_lib/data/mini_base`): **{gain.get('gain')} "
        f"nats** per token (first copy {gain.get('first')}, second {gain.get('second')}); ~0 means no copying.",
        "- Scores on the mini suite (percent; world seed 0, the profile's `eval` settings: the desks greedy, the "
        "single-turn benchmarks avg@k sampled at temperature 0.6"
        + (f"; {card['scores_note']}" if card.get("scores_note") else "") + "):",
        "",
        "| " + " | ".join(scores) + " |",
        "|" + "---:|" * len(scores),
        "| " + " | ".join(f"{v:.1f}" for v in scores.values()) + " |",
        "",
        f"sha256 of `model.safetensors`: `{card['sha256']}`",
        "",
    ]
    return "\n".join(lines)
