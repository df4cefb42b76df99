"""Causal-LM pretraining of the small base model on a text corpus (HF ``Trainer``).

    summary = train_pretrain(cfg, model_dir, corpus, out_dir)   # model_dir: the freshly built base

The corpus (a list of documents, or a ``.jsonl`` file of ``{"text": ...}`` lines) is tokenized, the documents
are joined with the pad token ``<|endoftext|>`` as document separator (Qwen's convention) and cut into
``cfg.pretrain.seq_len``-token blocks (the tail shorter than a block is dropped). Settings from
``cfg.pretrain``: ``max_steps``, ``batch_size`` (blocks per optimizer step, all processes together),
``learning_rate`` (cosine decay after ``warmup_steps``).

Writes into ``out_dir``: ``train_log.jsonl`` (loss, learning rate, grad norm, wall time, tokens/s per
step), ``train_summary.json``, ``checkpoints/checkpoint-N`` (resumed from after a crash), ``model/``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from acl_lib.train import common


def read_corpus(corpus: list[str] | str | Path) -> list[str]:
    """Documents from a list, or from a ``.jsonl`` file with a ``text`` field per line."""
    if isinstance(corpus, (str, Path)):
        lines = Path(corpus).read_text().splitlines()
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


def train_pretrain(cfg, model_dir: str | Path, corpus: list[str] | str | Path, out_dir: str | Path) -> dict:
    """Pretrain the model in ``model_dir`` on ``corpus`` into ``<out_dir>/model``; returns the summary."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments, default_data_collator

    common.set_threads(cfg)
    p = cfg.pretrain
    model, tok = common.load_model_and_tokenizer(model_dir, cfg)
    blocks = pack_corpus(read_corpus(corpus), tok, p.seq_len)
    # Every block is full, so labels are the inputs (the model shifts them) and nothing needs masking.
    data = Dataset.from_dict({"input_ids": blocks, "labels": blocks})
    args = TrainingArguments(**common.trainer_kwargs(
        cfg, out_dir, max_steps=p.max_steps, batch_size=p.batch_size, learning_rate=p.learning_rate,
        warmup_steps=p.warmup_steps, scheduler="cosine"))
    log = common.make_jsonl_logger(Path(out_dir) / common.TRAIN_LOG, tokens_per_step=p.batch_size * p.seq_len,
                                   extra={"job": "pretrain"})
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator,
                      processing_class=tok, callbacks=[log])
    t0 = time.perf_counter()
    trainer.train(resume_from_checkpoint=common.last_checkpoint(out_dir))
    wall = time.perf_counter() - t0
    common.save_final_model(trainer, tok, out_dir)
    summary = common.summarize(common.read_log(Path(out_dir) / common.TRAIN_LOG), wall, job="pretrain",
                               blocks=len(blocks), seq_len=p.seq_len, corpus_tokens=len(blocks) * p.seq_len,
                               **common.distributed_info(trainer))
    return common.write_summary(trainer, out_dir, summary)
