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


def test_micro_batches_split_a_step_into_accumulated_passes(tmp_path):
    """Issue 32 item 4: grpo.micro_batch_size trains a process's share of the step in accumulated micro-batches
    (one generation per optimizer step); a split that does not divide is refused when the config loads."""
    from acl_lib.config import ConfigError, load_config
    from acl_lib.train.common import micro_batches

    assert micro_batches(256, 16) == (16, 1)
    assert micro_batches(256, 16, 4) == (4, 4) and micro_batches(256, 16, 1) == (1, 16)
    assert micro_batches(8, 2, 8) == (4, 1)  # a micro-batch as large as the share: no accumulation
    with pytest.raises(ValueError, match="micro_batch_size 3 does not divide the 16"):
        micro_batches(256, 16, 3)
    with pytest.raises(ValueError, match="not divisible by the 3 processes"):
        micro_batches(256, 3)
    cfg = tiny_cfg(tmp_path, **{"grpo.batch_size": 8, "grpo.num_generations": 2, "grpo.micro_batch_size": 2})
    args = grpo.grpo_args(cfg, tmp_path / "g")
    assert args.per_device_train_batch_size == 2 and args.gradient_accumulation_steps == 4
    assert args.steps_per_generation == 4 and args.generation_batch_size == 8  # one generation per step
    paper = load_config("paper")
    assert paper.grpo.micro_batch_size == 4 and paper.for_stage("ecom").grpo.micro_batch_size == 1
    with pytest.raises(ConfigError, match="grpo.micro_batch_size 3 does not divide the 16 sequences"):
        load_config("paper", ["grpo.micro_batch_size=3"])
    from acl_lib.train.grpo import vllm_kwargs

    assert paper.grpo.vllm_sleep_mode
    assert vllm_kwargs(paper, False, [1])["vllm_enable_sleep_mode"] is True  # single-turn: sleeps while training
    assert vllm_kwargs(paper, True, [1])["vllm_enable_sleep_mode"] is False  # multi-turn: stays awake


@pytest.mark.slow
def test_grpo_step_in_accumulated_micro_batches_moves_the_policy(base_dir, tmp_path):
    from acl_lib.runs import Run, run_once

    cfg = tiny_cfg(tmp_path, **{"grpo.max_steps": 1, "grpo.batch_size": 8, "grpo.num_generations": 4,
                                "grpo.micro_batch_size": 2, "grpo.max_completion_length": 16})
    run = Run(cfg, "grpo_micro")
    env = ShortEnv()
    run_once(run, lambda r: grpo.train_grpo(cfg, base_dir, "short", r.path, env=env, tasks=env.tasks("train", 4)))
    log = [json.loads(line) for line in (run.path / "train_log.jsonl").read_text().splitlines()]
    assert len([r for r in log if "reward" in r]) == 1  # one generation of 8, four passes of 2, one step
    before, after = _params(base_dir), _params(run.path / "model")
    assert any(not torch.equal(before[k], after[k]) for k in before)
