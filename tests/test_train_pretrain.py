"""Base pretraining: packing into blocks, and a short real run whose loss falls."""

from __future__ import annotations

import json

import pytest
import torch

from acl_lib.train import pretrain
from train_kit import desk_corpus, tiny_cfg

torch.set_num_threads(1)


def test_pack_corpus_blocks_and_separators(base_dir):
    from acl_lib.model import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer(base_dir)
    docs = ["1+1=2", "2+2=4", "3+3=6"]
    blocks = pretrain.pack_corpus(docs * 20, tok, 16)
    stream = [t for d in docs * 20 for t in tok.encode(d, add_special_tokens=False) + [tok.pad_token_id]]
    assert all(len(b) == 16 for b in blocks) and len(blocks) == len(stream) // 16
    assert sum(blocks, []) == stream[: len(blocks) * 16]  # nothing reordered, nothing lost but the tail
    assert tok.decode(blocks[0][: stream.index(tok.pad_token_id) + 1]) == "1+1=2<|endoftext|>"
    with pytest.raises(ValueError, match="fewer than one block"):
        pretrain.pack_corpus(["1+1=2"], tok, 64)


@pytest.mark.slow
def test_pretrain_loss_falls_and_outputs_are_written(base_dir, tmp_path):
    from acl_lib.runs import Run, run_once
    from acl_lib.train.common import read_log

    cfg = tiny_cfg(tmp_path, **{"pretrain.max_steps": 8, "pretrain.batch_size": 4, "pretrain.seq_len": 64,
                                "pretrain.learning_rate": 3e-3})
    corpus_file = tmp_path / "corpus.jsonl"
    corpus_file.write_text("".join(json.dumps({"text": d}) + "\n" for d in desk_corpus()))
    run = Run(cfg, "base_pretrain")
    run_once(run, lambda r: pretrain.train_pretrain(cfg, base_dir, corpus_file, r.path))
    log = read_log(run.path / "train_log.jsonl")
    losses = [r["loss"] for r in log if "loss" in r]
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.3
    assert all(r["tokens_per_s"] > 0 for r in log if "loss" in r and r["step"] > 1)
    summary = json.loads((run.path / "train_summary.json").read_text())
    assert summary["steps"] == 8 and summary["seq_len"] == 64 and summary["tokens_per_s"] > 0
    # The saved model loads and keeps the chat conventions (eos <|im_end|> in the generation config).
    from acl_lib.model import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(run.path / "model")
    assert model.generation_config.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
