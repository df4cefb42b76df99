"""The shared episode machinery: argument validation, error observations, limits, rewards in [0, 1]."""

from hypothesis import given, settings
from hypothesis import strategies as st

from acl_lib.chat import format_tool_call
from acl_lib.envs.base import (
    Environment,
    SingleTurnEpisode,
    Task,
    ToolEpisode,
    ToolError,
    function_schema,
    validate_arguments,
)

ADD = function_schema("add", "Add two integers.", {"a": {"type": "integer"}, "b": {"type": "integer"}})
NEG = function_schema("neg", "Negate.", {"x": {"type": "integer"}})


class AddEpisode(ToolEpisode):
    """Answer is the sum; the final answer is the text of a turn without calls."""

    def tool_functions(self):
        def add(a, b):
            return str(a + b)

        def neg(x):
            if x == 0:
                raise ToolError("zero has no interesting negation")
            return str(-x)

        return {"add": add, "neg": neg}

    def on_text(self, content):
        self.final = content
        self.done = True
        return []

    def _score(self):
        ok = getattr(self, "final", None) == str(self.task.answer)
        if not ok:
            self.failure = f"wrong answer: {getattr(self, 'final', None)!r}"
        return float(ok)


class AddEnv(Environment):
    name = "add"

    def tasks(self, split, n, seed=0):
        return [Task(f"t{i}", "add", "add", "sys", f"{i}+{i}?", [ADD, NEG], answer=2 * i) for i in range(n)]

    def start(self, task, max_turns=16):
        return AddEpisode(task, max_turns)


def test_validate_arguments():
    assert validate_arguments(ADD, {"a": 1, "b": 2}) is None
    assert "missing required argument 'b'" in validate_arguments(ADD, {"a": 1})
    assert "unexpected argument 'c'" in validate_arguments(ADD, {"a": 1, "b": 2, "c": 3})
    assert "must be of type integer" in validate_arguments(ADD, {"a": "1", "b": 2})
    assert "must be of type integer" in validate_arguments(ADD, {"a": True, "b": 2})


def test_tool_episode_solves_and_scores():
    env = AddEnv()
    task = env.tasks("test", 3)[2]
    ep = env.start(task)
    obs = ep.step(format_tool_call("add", {"a": 2, "b": 2}))
    assert obs == [{"role": "tool", "name": "add", "content": "4"}]
    assert ep.messages[-2]["tool_calls"][0]["function"]["name"] == "add"
    ep.step("4")
    assert ep.done and ep.reward() == 1.0 and ep.record()["failure"] is None


def test_bad_calls_are_error_observations():
    ep = AddEnv().start(AddEnv().tasks("test", 2)[1])
    bad = [
        "<tool_call>{oops</tool_call>",
        format_tool_call("mul", {"a": 1}),
        format_tool_call("add", {"a": 1}),
        format_tool_call("add", {"a": "x", "b": 1}),
        format_tool_call("neg", {"x": 0}),
    ]
    for text in bad:
        (obs,) = ep.step(text)
        assert obs["content"].startswith("Error: "), obs
    assert len(ep.protocol_errors) == 4  # the precondition failure is not a protocol error
    assert not ep.done


def test_turn_limit_ends_with_reason():
    ep = AddEnv().start(AddEnv().tasks("test", 2)[1], max_turns=2)
    ep.step(format_tool_call("add", {"a": 1, "b": 1}))
    ep.step(format_tool_call("add", {"a": 1, "b": 1}))
    assert ep.done and ep.reward() == 0.0 and "turn limit" in ep.failure


def test_single_turn_episode_survives_a_crashing_verifier():
    def boom(response, task):
        raise ZeroDivisionError("bad verifier")

    ep = SingleTurnEpisode(Task("t", "x", "x", "", "q"), boom)
    ep.step("anything")
    assert ep.reward() == 0.0 and "verifier error" in ep.failure


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(max_size=200), min_size=1, max_size=5))
def test_random_turns_never_raise(turns):
    env = AddEnv()
    ep = env.start(env.tasks("test", 2)[1], max_turns=4)
    for t in turns:
        if ep.done:
            break
        ep.step(t)
    assert 0.0 <= ep.reward() <= 1.0
