"""Resuming only from checkpoints whose save completed (issue 32, item 7): a save cut off (a 115 GB ZeRO-3
checkpoint interrupted) must not block every restart; the newest complete checkpoint is used instead."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from acl_lib.train import common, pretrain
from train_kit import desk_corpus, tiny_cfg

torch.set_num_threads(1)


def _complete(d, step: int, deepspeed: bool = False):
    c = d / common.CHECKPOINTS / f"checkpoint-{step}"
    c.mkdir(parents=True)
    (c / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if deepspeed:  # ZeRO-3 without gathered 16-bit weights: the engine's state only
        (c / f"global_step{step}").mkdir()
        (c / f"global_step{step}" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"x")
        (c / "latest").write_text(f"global_step{step}")
    else:
        (c / "model.safetensors").write_bytes(b"x")
    return c


def test_half_written_checkpoints_are_skipped_with_a_warning(tmp_path, caplog):
    assert common.last_checkpoint(tmp_path) is None
    ten = _complete(tmp_path, 10)
    half = tmp_path / common.CHECKPOINTS / "checkpoint-20"  # weights written, the save cut off before its state
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"x")
    with caplog.at_level(logging.WARNING, logger="acl_lib.train.common"):
        assert common.last_checkpoint(tmp_path) == str(ten)
    assert "checkpoint-20" in caplog.text and "trainer_state.json" in caplog.text
    assert half.is_dir()  # kept: the next save of step 20 writes over it
    # trainer_state.json cut off mid-write
    (half / "trainer_state.json").write_text('{"global_st')
    assert common.last_checkpoint(tmp_path) == str(ten)
    assert common.checkpoint_problem(half) == "no readable trainer_state.json"
    (half / "trainer_state.json").write_text("{}")
    assert common.last_checkpoint(tmp_path) == str(half)
    # DeepSpeed: the engine's 'latest' tag is written after every rank's shards; without it, or naming no
    # folder, the save did not complete.
    ds = _complete(tmp_path, 30, deepspeed=True)
    assert common.last_checkpoint(tmp_path) == str(ds)
    (ds / "latest").write_text("global_step31")
    assert common.last_checkpoint(tmp_path) == str(half)
    (ds / "latest").unlink()
    assert "latest" in common.checkpoint_problem(ds)
    # Without DeepSpeed state, the weights Trainer._load_from_checkpoint loads must be there.
    (half / "model.safetensors").unlink()
    assert common.last_checkpoint(tmp_path) == str(ten)
    (half / "adapter_model.safetensors").write_bytes(b"x")  # a PEFT checkpoint
    assert common.last_checkpoint(tmp_path) == str(half)
    assert common.last_checkpoint(tmp_path / "missing") is None


@pytest.mark.slow
def test_a_run_interrupted_while_saving_resumes_from_the_last_complete_checkpoint(base_dir, tmp_path):
    """A real pretraining run; its last checkpoint's save is then cut short (weights half written, no trainer
    state); the restarted, longer run resumes from the checkpoint before it and logs each step once after it."""
    from acl_lib.train.common import read_log

    kw = {"pretrain.batch_size": 4, "pretrain.seq_len": 64, "pretrain.learning_rate": 3e-3}
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in desk_corpus()))
    out = tmp_path / "run"
    pretrain.train_pretrain(tiny_cfg(tmp_path, **{"pretrain.max_steps": 4, **kw}), base_dir, corpus, out)
    ckpts = out / common.CHECKPOINTS
    assert sorted(p.name for p in ckpts.iterdir()) == ["checkpoint-3", "checkpoint-4"]  # save_total_limit 2
    cut = ckpts / "checkpoint-4"
    (cut / "trainer_state.json").unlink()
    weights = cut / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert common.last_checkpoint(out) == str(ckpts / "checkpoint-3")
    pretrain.train_pretrain(tiny_cfg(tmp_path, **{"pretrain.max_steps": 6, **kw}), base_dir, corpus, out)
    steps = [r["step"] for r in read_log(out / common.TRAIN_LOG) if "loss" in r]
    assert steps == [1, 2, 3, 4, 4, 5, 6]  # step 4 again: the first run's step 4 was never saved whole
    assert common.checkpoint_problem(ckpts / "checkpoint-6") is None
