"""The loss mask of multi-turn GRPO, token by token, on real episodes.

A real multi-turn episode (tool responses *and* simulated-user turns) is driven by the scripted expert through
``trl_env.rollout_episodes`` (the code ``EpisodeRollout`` runs inside the trainer), then through a real
``GRPOTrainer`` step. The mask the trainer uses must be 1 exactly on the tokens the policy wrote and 0 on
every observation token, checked against the chat template's own rendering of the finished conversation.
"""

from __future__ import annotations

import pytest
import torch

from acl_lib.train import trl_env
from train_kit import DeskEnv, expert_policy, tiny_cfg

torch.set_num_threads(1)


def trained_conversation(episode):
    """The episode's messages up to its last assistant turn: what ends an episode (retail's customer saying
    ###STOP###) is never followed by a generation, so it is not part of the rollout."""
    msgs = list(episode.messages)
    while msgs[-1]["role"] != "assistant":
        msgs.pop()
    return msgs


def rendered_spans(tok, episode):
    """The rollout's conversation rendered by the template: ids and its assistant ({% generation %}) mask."""
    out = tok.apply_chat_template(trained_conversation(episode), tools=episode.task.tools, tokenize=True,
                                  return_dict=True, return_assistant_tokens_mask=True)
    return list(out["input_ids"]), list(out["assistant_masks"])


def _segments(ids, mask, value):
    """Maximal runs of ``ids`` whose mask equals ``value``."""
    out, cur = [], []
    for t, m in zip(ids, mask):
        if m == value:
            cur.append(t)
        elif cur:
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def check_against_template(tok, episode, prompt_ids, completion_ids, mask, turns=None):
    """Token by token against the template's rendering; returns the (masked, trained) completion texts.

    ``turns``: the raw policy turns; when given, each trained span must be exactly one turn + <|im_end|>.
    """
    ids, amask = rendered_spans(tok, episode)
    n = len(prompt_ids) + len(completion_ids)
    # The concatenated rollout is the template's rendering up to the last <|im_end|> (only its "\n" follows).
    assert prompt_ids + completion_ids == ids[:n]
    assert tok.decode(ids[n:]) == "\n"
    # Token by token: trained exactly where the template marks assistant output.
    assert list(mask) == amask[len(prompt_ids):n]
    # Span by span: each masked-out span is one group of observations (tool results of one turn, or one
    # customer reply), in order; each trained span is one policy turn and its <|im_end|>.
    convo = trained_conversation(episode)
    groups, cur = [], []
    for m in convo[len(episode.task.initial_messages()):]:
        if m["role"] == "assistant":
            if cur:
                groups.append(cur)
            cur = []
        else:
            cur.append(m)
    masked_spans = [tok.decode(seg) for seg in _segments(completion_ids, mask, 0)]
    assert len(masked_spans) == len(groups) > 0
    for text, group in zip(masked_spans, groups):
        assert all(m["content"] in text for m in group)
        assert text.startswith("\n<|im_start|>user\n") and text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    trained_spans = [tok.decode(seg) for seg in _segments(completion_ids, mask, 1)]
    assert len(trained_spans) == len(groups) + 1
    if turns is not None:
        assert trained_spans == [t + "<|im_end|>" for t in turns]
    return "".join(masked_spans), "".join(trained_spans)


def check_desk(tok, episode, prompt_ids, completion_ids, mask, turns=None):
    masked, trained = check_against_template(tok, episode, prompt_ids, completion_ids, mask, turns)
    assert "<tool_response>" in masked and "population of" in masked  # the tool response
    assert "I mean" in masked  # the simulated user's turn
    assert "<tool_response>" not in trained and "I mean" not in trained
    assert "<tool_call>" in trained and "Which city do you mean?" in trained


def test_rollout_mask_matches_rendered_assistant_spans(base_dir):
    from acl_lib.model import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer(base_dir)
    env = DeskEnv()
    episodes = [env.start(t, max_turns=6) for t in env.tasks("train", 3)]
    rolls = trl_env.rollout_episodes(episodes, expert_policy(tok), tok, max_completion_length=512)
    for ep, r in zip(episodes, rolls):
        assert ep.reward() == 1.0 and len(r.turns) == 3
        assert len(r.completion_ids) == len(r.env_mask)
        check_desk(tok, ep, r.prompt_ids, r.completion_ids, r.env_mask, r.turns)


def test_rollout_mask_on_real_retail_episodes(base_dir):
    """The real retail desk: tool results and the rule-based customer's replies carry no loss."""
    from acl_lib.envs import make_env, scripted_expert
    from acl_lib.model import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer(base_dir)
    env = make_env("retail", None, seed=0)
    episodes = [env.start(t, max_turns=12) for t in env.tasks("train", 2)]
    rolls = trl_env.rollout_episodes(episodes, expert_policy(tok, scripted_expert("retail")), tok, 20000)
    for ep, r in zip(episodes, rolls):
        assert ep.reward() == 1.0, ep.failure
        roles = {m["role"] for m in trained_conversation(ep)[2:]}
        assert {"tool", "user"} <= roles  # both kinds of observation happened
        masked, trained = check_against_template(tok, ep, r.prompt_ids, r.completion_ids, r.env_mask, r.turns)
        assert "<tool_response>" in masked and "<tool_response>" not in trained


def test_rollout_budget_cuts_the_episode_and_scores_zero(base_dir):
    from acl_lib.model import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer(base_dir)
    env = DeskEnv()
    ep = env.start(env.tasks("train", 1)[0])
    (r,) = trl_env.rollout_episodes([ep], expert_policy(tok), tok, max_completion_length=40)
    assert len(r.completion_ids) <= 40 and ep.done
    assert ep.reward() == 0.0 and "budget" in ep.failure
    # The per-turn cap (the evaluator's max_new_tokens) cuts a turn even with rollout budget left.
    ep = env.start(env.tasks("train", 1)[0])
    (r,) = trl_env.rollout_episodes([ep], expert_policy(tok), tok, max_completion_length=512, max_new_tokens=3)
    assert r.truncated and r.completion_ids == r.completion_ids[:3] and len(r.completion_ids) == 3
    assert ep.reward() == 0.0 and "cut off after 3 tokens" in ep.failure


@pytest.mark.slow
def test_grpo_trainer_loss_mask_on_expert_rollouts(base_dir, tmp_path):
    """The mask inside a real GRPOTrainer step (completion_mask * tool_mask, what the loss multiplies)."""
    from acl_lib.model import load_model_and_tokenizer
    from acl_lib.runs import Run
    from acl_lib.train import grpo

    cfg = tiny_cfg(tmp_path, **{"grpo.max_completion_length": 256, "grpo.batch_size": 4})
    run = Run(cfg, "mask_check")
    _, tok = load_model_and_tokenizer(base_dir)
    env = DeskEnv()
    tasks = env.tasks("train", 2)
    trainer = grpo.build_trainer(cfg, base_dir, env, tasks, run.path, policy=expert_policy(tok))
    batch = [trainer.train_dataset[i] for i in (0, 0, 1, 1)]  # num_generations=2: each prompt twice
    trainer.model.train()
    out = trainer._generate_and_score_completions(batch)
    loss_mask = out["completion_mask"] * out["tool_mask"]
    assert out["advantages"].shape == (4,)
    for k, env_ep in enumerate(trainer.environments):
        ep = env_ep.episode
        assert ep.reward() == 1.0
        n = int(out["completion_mask"][k].sum())
        prompt = out["prompt_ids"][k][out["prompt_mask"][k].bool()].tolist()
        check_desk(tok, ep, prompt, out["completion_ids"][k][:n].tolist(), loss_mask[k][:n].tolist())
    # The loss on these rollouts runs through the same mask (the training loop sets the accumulation count).
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer.compute_loss(trainer.model, out)
    assert torch.isfinite(loss)
