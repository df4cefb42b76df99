"""The test kit's desk world (tests/train_kit.py): its expert solves every task with both observation kinds."""

from __future__ import annotations

from train_kit import DeskEnv, desk_expert


def test_desk_expert_solves_every_task_with_both_observation_kinds():
    env = DeskEnv()
    for t in env.tasks("train", 8):
        ep = env.start(t)
        while not ep.done:
            ep.step(desk_expert(t, ep.messages))
        assert ep.reward() == 1.0 and not ep.protocol_errors
        roles = [m["role"] for m in ep.messages]
        assert roles == ["system", "user", "assistant", "user", "assistant", "tool", "assistant"]


def test_desk_episode_scores_a_malformed_call_zero():
    env = DeskEnv()
    t = env.tasks("train", 1)[0]
    ep = env.start(t, max_turns=2)
    ep.step('<tool_call>\n{"name": "lookup", "arguments": {"city": \n</tool_call>')
    ep.step("No idea.")
    assert ep.reward() == 0.0 and ep.protocol_errors
