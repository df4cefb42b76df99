"""The stage recipe on the real mini worlds, tiny model: cold start + multi-turn GRPO (search), GRPO (math)."""

from __future__ import annotations

import json

import pytest
import torch

from acl_lib.train.stage import run_stage
from train_kit import tiny_cfg

torch.set_num_threads(1)


def _run(cfg, name):
    from acl_lib.runs import Run

    return Run(cfg, name, sections=("model", "sft", "grpo", "pipeline", "worlds"))


@pytest.mark.slow
def test_search_stage_cold_start_then_grpo(base_dir, tmp_path):
    from acl_lib.runs import run_once

    cfg = tiny_cfg(tmp_path, **{"grpo.max_turns": 4, "sft.max_length": 4096, "model.max_position_embeddings": 4096,
                                "grpo.max_completion_length": 48})
    run = run_once(_run(cfg, "seq_search"), lambda r: run_stage(cfg, "search", base_dir, r.path))
    info = json.loads((run.path / "stage.json").read_text())
    assert info["cold_start"] is True and info["demos"]["kept"] == cfg.sft.num_demos
    assert info["sft"]["steps"] == cfg.sft.max_steps and info["sft"]["truncated_rows"] == 0
    assert info["grpo"]["multi_turn"] is True and info["grpo"]["steps"] == cfg.grpo.max_steps
    # GRPO started from the cold-start model; the stage's model is GRPO's output.
    assert info["sft_model"] == str(run.path / "checkpoints" / "sft" / "model")
    assert (run.path / "checkpoints" / "sft" / "model" / "model.safetensors").exists()
    assert (run.path / "model" / "model.safetensors").exists() and run.is_complete()
    demos = (run.path / "checkpoints" / "sft" / "demos.jsonl").read_text().splitlines()
    row = json.loads(demos[0])
    assert any(m.get("tool_calls") for m in row["messages"]) and json.loads(row["tools"])[0]["function"]["name"]


@pytest.mark.slow
def test_math_stage_is_grpo_only(base_dir, tmp_path):
    from acl_lib.runs import run_once

    cfg = tiny_cfg(tmp_path)
    run = run_once(_run(cfg, "seq_math"), lambda r: run_stage(cfg, "math", base_dir, r.path))
    info = json.loads((run.path / "stage.json").read_text())
    assert info["cold_start"] is False and "sft" not in info
    assert info["grpo"]["multi_turn"] is False and info["grpo"]["domain"] == "math"
    assert not (run.path / "checkpoints" / "sft").exists()
    log = [json.loads(line) for line in (run.path / "train_log.jsonl").read_text().splitlines()]
    assert any("rewards/math_reward/mean" in r for r in log)
