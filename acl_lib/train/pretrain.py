"""Causal-LM pretraining of the small base model (HF ``Trainer``), in up to four phases.

    summary = train_pretrain(cfg, model_dir, corpus, out_dir)   # model_dir: the freshly built base

1. **Copy warm-up** (``pretrain.copy_warmup_steps`` > 0): synthetic induction blocks (random token segments,
   each repeated; ``acl_lib.model.copying.induction_blocks``) at ``copy_warmup_batch`` x
   ``copy_warmup_seq_len``, constant ``copy_warmup_lr``. Small models form an induction head (in-context
   copying) only under such a batch shape and data, and the tool worlds need one (docs/mini-calibration.md).
2. **Corpus**: the documents (a list, or a ``.jsonl`` file of ``{"text": ...}`` lines), with a share
   ``copy_mix`` (in characters) of echo documents added (``acl_lib.model.copying.echo_documents``: a run of
   corpus words, then the same run; they keep the head at work on text), are shuffled, tokenized, joined with
   the pad token ``<|endoftext|>`` as document separator (Qwen's convention) and cut into ``seq_len``-token
   blocks (the tail shorter than a block is dropped). ``max_steps`` x ``batch_size`` blocks, cosine decay after
   ``warmup_steps``.

3. **Mid-training** (``pretrain.midtrain_steps`` > 0, ``acl_lib.train.midtrain``): the four domains' expert
   transcripts from worlds of other seeds, assistant-only loss, from phase 2's model. Phase 2 then writes under
   ``checkpoints/corpus/`` and phase 3 under ``checkpoints/midtrain/``; its model becomes ``model/``.

4. **Cool-down** (``pretrain.cooldown_steps`` > 0, after a phase 3): the phase-2 corpus drawn again
   (``cooldown_corpus``, its transcripts' noise ``cooldown_noise``), ``cooldown_steps`` x ``batch_size`` blocks
   from phase 3's model, cosine from ``cooldown_lr``, under ``checkpoints/cooldown/``; its model becomes
   ``model/``. The base keeps its skills but stops showing them on every prompt (docs/mini-calibration.md).

Every ``copy_eval_every`` steps the context-copy gain (``acl_lib.model.copying.copy_gain`` on word lists of
the search world) is measured and logged beside the loss, so the formation of the head can be watched.

Writes into ``out_dir``: ``train_log.jsonl`` (loss, learning rate, grad norm, wall time, tokens/s, copy gain
per step; ``phase`` says which), ``train_summary.json``, ``checkpoints/checkpoint-N`` (resumed from after a
crash), ``checkpoints/copy_warmup/`` (phase 1: its own log, checkpoints and model; not redone once written),
``model/``.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

from acl_lib.atomic import atomic_dir
from acl_lib.config import Config
from acl_lib.model.copying import copy_gain, echo_documents, induction_blocks, world_word_lists
from acl_lib.model.corpus import base_corpus
from acl_lib.train import common, midtrain

WARMUP_DIR = "checkpoints/copy_warmup"
CORPUS_DIR = "checkpoints/corpus"  # phase 2's own directory when a phase 3 follows
MIDTRAIN_DIR = "checkpoints/midtrain"
COOLDOWN_DIR = "checkpoints/cooldown"


def finished_phase(phase_dir: str | Path) -> dict | None:
    """The summary of the phase written into ``phase_dir`` when it is finished (its ``model/``, written atomically,
    and its ``train_summary.json`` both there), else None. A finished phase is not redone after a restart, and
    ``benchmarks/build_mini_base.py --reuse-phases`` takes only finished ones."""
    phase_dir = Path(phase_dir)
    summary_file = phase_dir / common.TRAIN_SUMMARY
    if (phase_dir / "model").is_dir() and summary_file.is_file():
        return json.loads(summary_file.read_text())
    return None


def read_corpus(corpus: list[str] | str | Path) -> list[str]:
    """Documents from a list, or from a ``.jsonl`` file with a ``text`` field per line."""
    if isinstance(corpus, (str, Path)):
        path = Path(corpus)
        if not path.is_file():
            raise FileNotFoundError(f"pretraining corpus file not found: {path}")
        lines = path.read_text().splitlines()
        return [json.loads(line)["text"] for line in lines if line.strip()]
    return list(corpus)


def pack_corpus(texts: list[str], tokenizer, seq_len: int) -> list[list[int]]:
    """Token blocks of exactly ``seq_len`` ids: documents joined by the pad token, tail dropped.

    Raises if the corpus is shorter than one block (training on nothing would silently succeed).
    """
    sep = tokenizer.pad_token_id
    stream: list[int] = []
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        stream.extend(ids)
        stream.append(sep)
    n = len(stream) // seq_len
    if n == 0:
        raise ValueError(f"corpus has {len(stream)} tokens, fewer than one block of {seq_len}")
    return [stream[i * seq_len:(i + 1) * seq_len] for i in range(n)]


def copy_token_ids(tokenizer) -> list[int]:
    """The ids synthetic copy blocks draw from: every token but the special ones."""
    special = set(tokenizer.all_special_ids)
    return [i for i in range(len(tokenizer)) if i not in special]


def copy_gain_callback(cfg: Config, tokenizer, every: int):
    """A ``TrainerCallback`` that adds ``copy_gain`` (nats) to the log record every ``every`` steps."""
    from transformers import TrainerCallback

    lists = world_word_lists(cfg, n=10)

    class CopyGain(TrainerCallback):
        def on_log(self, args, state, control, logs=None, model=None, **kw):
            if logs is None or model is None or not every or state.global_step % every:
                return
            was_training = model.training
            model.eval()
            logs["copy_gain"] = copy_gain(model, tokenizer, lists)["gain"]
            model.train(was_training)

    return CopyGain()


def pretrain_args(cfg: Config, out_dir, *, max_steps, batch_size, lr, warmup, scheduler):
    """The ``TrainingArguments`` of one pretraining phase (shared settings from ``common.trainer_kwargs``)."""
    from transformers import TrainingArguments

    return TrainingArguments(**common.trainer_kwargs(
        cfg, out_dir, max_steps=max_steps, batch_size=batch_size, learning_rate=lr, warmup_steps=warmup,
        scheduler=scheduler))


def _train(cfg: Config, model, tok, blocks, out_dir: Path, *, max_steps, batch_size, lr, warmup, scheduler, phase,
           seq_len) -> tuple[object, dict]:
    from datasets import Dataset
    from transformers import Trainer, default_data_collator

    p = cfg.pretrain
    # Every block is full, so labels are the inputs (the model shifts them) and nothing needs masking.
    data = Dataset.from_dict({"input_ids": blocks, "labels": blocks})
    args = pretrain_args(cfg, out_dir, max_steps=max_steps, batch_size=batch_size, lr=lr, warmup=warmup,
                         scheduler=scheduler)
    # The copy-gain callback runs before the logger, so the gain lands in the same log record.
    callbacks = [copy_gain_callback(cfg, tok, p.copy_eval_every)] if p.copy_eval_every else []
    callbacks.append(common.make_jsonl_logger(Path(out_dir) / common.TRAIN_LOG, tokens_per_step=batch_size * seq_len,
                                              extra={"job": "pretrain", "phase": phase}))
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator,
                      processing_class=tok, callbacks=callbacks)
    common.show_progress(trainer, "pretrain" if phase == "corpus" else phase.replace("_", " "))
    t0 = time.perf_counter()
    trainer.train(resume_from_checkpoint=common.last_checkpoint(out_dir))
    wall = time.perf_counter() - t0
    common.save_final_model(trainer, tok, out_dir)
    summary = common.summarize(common.read_log(Path(out_dir) / common.TRAIN_LOG), wall, job="pretrain",
                               phase=phase, blocks=len(blocks), seq_len=seq_len,
                               tokens_seen=max_steps * batch_size * seq_len, **common.distributed_info(trainer))
    gains = [r["copy_gain"] for r in common.read_log(Path(out_dir) / common.TRAIN_LOG) if "copy_gain" in r]
    summary["last_copy_gain"] = gains[-1] if gains else None
    return trainer, common.write_summary(trainer, out_dir, summary)


def train_pretrain(cfg: Config, model_dir: str | Path, corpus: list[str] | str | Path, out_dir: str | Path) -> dict:
    """Pretrain the model in ``model_dir`` (copy warm-up, then the corpus) into ``<out_dir>/model``; returns the
    summary (with the warm-up's under ``copy_warmup``)."""
    common.set_threads(cfg)
    p = cfg.pretrain
    out_dir = Path(out_dir)
    texts = read_corpus(corpus)
    _, tok = common.load_model_and_tokenizer(model_dir, cfg)
    warm_summary = None
    start = Path(model_dir)
    if p.copy_warmup_steps > 0:
        warm_dir = out_dir / WARMUP_DIR
        warm_summary = finished_phase(warm_dir)  # finished before a restart: not redone
        if warm_summary is None:
            model, _ = common.load_model_and_tokenizer(model_dir, cfg)
            blocks = induction_blocks(p.copy_warmup_steps * p.copy_warmup_batch, p.copy_warmup_seq_len,
                                      copy_token_ids(tok), seed=cfg.seed)
            _, warm_summary = _train(cfg, model, tok, blocks, warm_dir, max_steps=p.copy_warmup_steps,
                                     batch_size=p.copy_warmup_batch, lr=p.copy_warmup_lr, warmup=0,
                                     scheduler="constant", phase="copy_warmup", seq_len=p.copy_warmup_seq_len)
        start = warm_dir / "model"
    mid = midtrain.enabled(cfg)
    # With a phase 3 the corpus phase is an intermediate: it lives under checkpoints/ (kept across restarts).
    corpus_dir = out_dir / CORPUS_DIR if mid else out_dir
    summary = finished_phase(corpus_dir) if mid else None  # finished before a restart
    if summary is None:
        model, _ = common.load_model_and_tokenizer(start, cfg)
        blocks, echo = corpus_blocks(cfg, texts, tok, echo_seed=cfg.seed + 1, shuffle_seed=cfg.seed)
        _, summary = _train(cfg, model, tok, blocks, corpus_dir, max_steps=p.max_steps, batch_size=p.batch_size,
                            lr=p.learning_rate, warmup=p.warmup_steps, scheduler="cosine", phase="corpus",
                            seq_len=p.seq_len)
        summary.update(echo_documents=len(echo), echo_chars=sum(map(len, echo)))
        if mid:
            common.write_summary_main(summary, corpus_dir)
    summary["copy_warmup"] = warm_summary
    if mid:
        summary["midtrain"] = finish_midtrain(cfg, corpus_dir / "model", out_dir)
        last = out_dir / MIDTRAIN_DIR / "model"
        if p.cooldown_steps > 0:
            summary["cooldown"] = finish_cooldown(cfg, last, out_dir)
            last = out_dir / COOLDOWN_DIR / "model"
        if common.is_main_process():
            with atomic_dir(out_dir / "model") as tmp:
                shutil.copytree(last, tmp, dirs_exist_ok=True)
    return common.write_summary_main(summary, out_dir)


def corpus_blocks(cfg: Config, texts: list[str], tok, *, echo_seed: int,
                  shuffle_seed: int) -> tuple[list[list[int]], list]:
    """``(blocks, echo documents)``: the documents with a share ``pretrain.copy_mix`` (in characters) of echo
    documents added, shuffled, packed into ``pretrain.seq_len``-token blocks."""
    p = cfg.pretrain
    n_chars = sum(map(len, texts))
    echo = (echo_documents(texts, int(n_chars * p.copy_mix / (1 - p.copy_mix)), seed=echo_seed)
            if p.copy_mix else [])
    docs = texts + echo
    random.Random(shuffle_seed).shuffle(docs)
    return pack_corpus(docs, tok, p.seq_len), echo


def finish_midtrain(cfg: Config, corpus_model: str | Path, out_dir: str | Path) -> dict:
    """Phase 3 from the corpus phase's model into ``<out_dir>/checkpoints/midtrain``; returns its summary (a finished
    phase 3 is not redone). ``train_pretrain`` then copies the last phase's model to ``<out_dir>/model``."""
    mid_dir = Path(out_dir) / MIDTRAIN_DIR
    if (done := finished_phase(mid_dir)) is not None:
        return done
    return midtrain.train_midtrain(cfg, corpus_model, mid_dir)


def cooldown_corpus(cfg: Config) -> list[str]:
    """Phase 4's documents: the corpus of phase 2 (``acl_lib.model.corpus.base_corpus``, deterministic) drawn with
    ``pretrain.cooldown_noise`` as its transcripts' noise (unset: phase 2's)."""
    p = cfg.pretrain
    if p.cooldown_noise is not None and p.cooldown_noise != p.noise:
        tree = cfg.to_dict()
        tree["pretrain"]["noise"] = p.cooldown_noise
        cfg = Config.model_validate(tree)
    return base_corpus(cfg)[0]


def finish_cooldown(cfg: Config, start_model: str | Path, out_dir: str | Path) -> dict:
    """Phase 4 from phase 3's model into ``<out_dir>/checkpoints/cooldown``: ``pretrain.cooldown_steps`` steps of
    the corpus (``cooldown_corpus``: its own noise, another draw of its echo documents, another order), cosine from
    ``pretrain.cooldown_lr``; returns its summary (a finished phase 4 is not redone)."""
    p = cfg.pretrain
    cool_dir = Path(out_dir) / COOLDOWN_DIR
    if (done := finished_phase(cool_dir)) is not None:
        return done
    texts = cooldown_corpus(cfg)
    model, tok = common.load_model_and_tokenizer(start_model, cfg)
    blocks, _ = corpus_blocks(cfg, texts, tok, echo_seed=cfg.seed + 2, shuffle_seed=cfg.seed + 3)
    _, summary = _train(cfg, model, tok, blocks[: p.cooldown_steps * p.batch_size], cool_dir,
                        max_steps=p.cooldown_steps, batch_size=p.batch_size, lr=p.cooldown_lr,
                        warmup=min(20, p.cooldown_steps // 10), scheduler="cosine", phase="cooldown",
                        seq_len=p.seq_len)
    return common.write_summary_main(summary, cool_dir)
