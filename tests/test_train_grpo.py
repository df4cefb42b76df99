"""GRPO through TRL on tiny models: single-turn reward functions and multi-turn episode rollouts, for real."""

from __future__ import annotations

import json

import pytest
import torch

from acl_lib.envs.base import Environment, SingleTurnEpisode, Task
from acl_lib.train import grpo, trl_env
from train_kit import DeskEnv, tiny_cfg

torch.set_num_threads(1)


class ShortEnv(Environment):
    """Reward 1 when the answer has an even number of characters: a random tiny model gets it about half the
    time, so GRPO groups have a reward spread and the policy must move."""

    name = "short"

    def tasks(self, split, n, seed=0):
        return [Task(id=f"s{i}", domain="short", benchmark="short", system_prompt="Be even.",
                     user_prompt=f"Say something about {i}.") for i in range(n)]

    def start(self, task, max_turns=1):
        return SingleTurnEpisode(task, lambda text, t: (float(len(text) % 2 == 0), "odd length"))


def _params(model_dir):
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def test_episode_reward_scores_raw_text_with_the_env(base_dir):
    from acl_lib.model import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer(base_dir)
    env = ShortEnv()
    t = env.tasks("train", 1)[0]
    reward = trl_env.EpisodeReward(env, tok)
    ids = [tok.encode("ok", add_special_tokens=False) + [tok.eos_token_id],  # eos is not text: "ok" is even
           tok.encode("odd", add_special_tokens=False)]
    row = trl_env.task_row(t)
    seen = {}
    out = reward(prompts=[row["prompt"]] * 2, completions=None, completion_ids=ids, task=[row["task"]] * 2,
                 log_extra=lambda k, v: seen.setdefault(k, v))
    assert out == [1.0, 0.0] and seen["failure"] == ["", "odd length"]


@pytest.mark.slow
def test_single_turn_grpo_moves_the_policy_and_logs(base_dir, tmp_path):
    from acl_lib.runs import Run, run_once

    cfg = tiny_cfg(tmp_path, **{"grpo.max_steps": 2, "grpo.batch_size": 8, "grpo.num_generations": 4,
                                "grpo.max_completion_length": 12, "grpo.learning_rate": 1e-3})
    run = Run(cfg, "grpo_short")
    env = ShortEnv()
    run_once(run, lambda r: grpo.train_grpo(cfg, base_dir, "short", r.path, env=env, tasks=env.tasks("train", 4)))
    log = [json.loads(line) for line in (run.path / "train_log.jsonl").read_text().splitlines()]
    steps = [r for r in log if "reward" in r]
    assert len(steps) == 2
    assert all(0.0 <= r["reward"] <= 1.0 and "short_reward" in "".join(r) for r in steps)
    assert all(r["gen_tokens_per_s"] > 0 for r in steps)
    summary = json.loads((run.path / "train_summary.json").read_text())
    assert summary["job"] == "grpo" and summary["multi_turn"] is False and summary["wall_s"] > 0
    # Rewards varied within groups (reward_std > 0), so the update must have changed the weights.
    assert any(r["reward_std"] > 0 for r in steps)
    before, after = _params(base_dir), _params(run.path / "model")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert (run.path / "checkpoints").is_dir() and any((run.path / "checkpoints").glob("checkpoint-*"))


@pytest.mark.slow
def test_multi_turn_grpo_runs_episodes_in_the_trainer(base_dir, tmp_path):
    from acl_lib.runs import Run, run_once

    cfg = tiny_cfg(tmp_path, **{"grpo.max_steps": 1, "grpo.batch_size": 4, "grpo.num_generations": 2,
                                "grpo.max_completion_length": 48})
    run = Run(cfg, "grpo_desk")
    env = DeskEnv()
    run_once(run, lambda r: grpo.train_grpo(cfg, base_dir, "desk", r.path, env=env, tasks=env.tasks("train", 2)))
    log = [json.loads(line) for line in (run.path / "train_log.jsonl").read_text().splitlines()]
    step = next(r for r in log if "reward" in r)
    # The environment's own reward source (get_reward) is what TRL logged.
    assert "rewards/EpisodeEnv/mean" in step and step["reward"] == step["rewards/EpisodeEnv/mean"]
    assert json.loads((run.path / "train_summary.json").read_text())["multi_turn"] is True
    assert (run.path / "model" / "model.safetensors").exists()
