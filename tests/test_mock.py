"""The tau2 mock desk: tools, generated and real tasks, reward, scripted expert, robustness to random text."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acl_lib.chat import format_tool_call
from acl_lib.envs.base import Task, ToolError
from acl_lib.envs.desk import (
    DeskEpisode,
    compact_schemas,
    db_diff,
    db_equal,
    info_said,
    replay_actions,
)
from acl_lib.envs.mock import (
    MOCK_KINDS,
    MOCK_TOOLS,
    MockEnv,
    MockTools,
    load_tau2_mock,
    scripted_expert,
)
from acl_lib.envs.retail import RetailEnv
from acl_lib.envs.telecom import TelecomEnv
from acl_lib.envs.usersim import STOP
from conftest import drive_random_turns

FIXTURES = Path(__file__).parent / "data" / "tau2"


def drive(env, task, policy, max_turns=10):
    ep = env.start(task, max_turns=max_turns)
    while not ep.done:
        ep.step(policy(task, ep.messages))
    return ep


def small_db():
    return {"tasks": {"task_1": {"task_id": "task_1", "title": "A", "description": None, "status": "pending"}},
            "users": {"user_1": {"user_id": "user_1", "name": "Ann Lee", "tasks": ["task_1"]}}}


# --- tools and helpers ----------------------------------------------------------------------------


def test_compact_schemas_change_only_the_prose():
    names = [s["function"]["name"] for s in MOCK_TOOLS]
    short = compact_schemas(MOCK_TOOLS, {n: f"Short {n}." for n in names})
    create, update = short[0]["function"], short[2]["function"]
    assert create["description"] == "Short create_task." and create["parameters"]["required"] == ["user_id", "title"]
    assert update["parameters"]["properties"]["status"] == {"type": "string", "enum": ["pending", "completed"]}
    assert not any("description" in p for s in short for p in s["function"]["parameters"]["properties"].values())
    assert MOCK_TOOLS[0]["function"]["parameters"]["properties"]["title"]["description"]  # the original is untouched
    with pytest.raises(KeyError):  # every tool needs its short description
        compact_schemas(MOCK_TOOLS, {})


def test_tools_follow_tau2_semantics():
    tools = MockTools(small_db())
    t = tools.create_task("user_1", "Meet", "room 2")
    assert t == {"task_id": "task_2", "title": "Meet", "description": "room 2", "status": "pending"}
    assert tools.db["users"]["user_1"]["tasks"] == ["task_1", "task_2"]
    assert tools.update_task_status("task_1", "completed")["status"] == "completed"
    assert [u["user_id"] for u in tools.get_users()] == ["user_1"]
    with pytest.raises(ToolError, match="User user_9 not found"):
        tools.create_task("user_9", "x")
    with pytest.raises(ToolError, match="title"):
        tools.create_task("user_1", "  ")
    with pytest.raises(ToolError, match="Task task_9 not found"):
        tools.update_task_status("task_9", "completed")
    assert tools.assert_task_status("task_2", "pending") and tools.assert_number_of_tasks("user_1", 2)
    assert tools.transfer_to_human_agents("x") == "Transfer successful" and tools.transferred


def test_replay_and_db_diff():
    db = small_db()
    out = replay_actions(MockTools, db, [{"name": "update_task_status", "arguments": {"task_id": "task_1",
                                                                                      "status": "completed"}}])
    assert db["tasks"]["task_1"]["status"] == "pending"  # the input is not mutated
    assert db_diff(db, out) == "db.tasks.task_1.status ('completed', expected 'pending')"
    assert db_equal(out, json.loads(json.dumps(out)))
    assert db_diff({"a": [1, 2]}, {"a": [1]}) == "db.a (length 1, expected 2)"
    assert db_diff({"a": 1}, {"b": 1}) == "db.a (missing)"
    assert db_diff({"x": None}, {"x": ""}) is not None  # tau2 compares exactly
    with pytest.raises(ValueError, match="fails"):
        replay_actions(MockTools, db, [{"name": "create_task", "arguments": {"user_id": "nobody", "title": "t"}}])
    with pytest.raises(ValueError, match="must be one of"):
        replay_actions(MockTools, db, [{"name": "update_task_status", "arguments": {"task_id": "task_1",
                                                                                   "status": "done"}}])
    assert info_said("$1,234.50", ["You paid $1234.50 today."])
    assert not info_said("noon", ["tomorrow"])


def test_mock_telecom_and_retail_play_the_one_desk_episode():
    """The three tool desks share desk.DeskEpisode itself (no subclass, no second loop)."""
    for env in (MockEnv(), TelecomEnv(), RetailEnv()):
        ep = env.start(env.tasks("test", 1)[0])
        assert type(ep) is DeskEpisode and DeskEpisode.__module__ == "acl_lib.envs.desk", env.name


# --- generated tasks ------------------------------------------------------------------------------


def test_generated_tasks_are_deterministic_and_disjoint():
    env = MockEnv(seed=3)
    a = env.tasks("test", 12, seed=1)
    assert [t.to_dict() for t in a] == [t.to_dict() for t in MockEnv(seed=3).tasks("test", 12, seed=1)]
    assert [t.to_dict() for t in a[:5]] == [t.to_dict() for t in env.tasks("test", 5, seed=1)]
    assert [t.to_dict() for t in a] != [t.to_dict() for t in env.tasks("test", 12, seed=2)]
    assert {t.meta["kind"] for t in a} == set(MOCK_KINDS)
    train = env.tasks("train", 60)
    test = env.tasks("test", 60)
    names = lambda ts: {u["name"] for t in ts for u in t.answer["db"]["users"].values()}  # noqa: E731
    assert not names(train) & names(test)
    # a task is its database + request + gold actions: none is shared ("mark task_2 done" recurs, over other dbs)
    sig = lambda ts: {json.dumps([t.answer["db"], t.user_prompt, t.answer["actions"]]) for t in ts}  # noqa: E731
    assert not sig(train) & sig(test)
    assert env.splits == {"test": "mock", "train": None}
    with pytest.raises(ValueError):
        env.tasks("dev", 1)


def test_expert_solves_every_generated_task_and_null_scores_zero():
    env = MockEnv(seed=0)
    for t in env.tasks("test", 24) + env.tasks("train", 12):
        t = Task.from_dict(json.loads(json.dumps(t.to_dict())))  # as TRL rebuilds tasks from dataset rows
        ep = drive(env, t, scripted_expert)
        assert ep.reward() == 1.0, (t.id, ep.failure)
        assert not ep.protocol_errors
        null = drive(env, t, lambda task, msgs: "")
        assert null.reward() == 0.0 and null.failure


def test_conversation_uses_the_rule_user():
    env = MockEnv()
    task = next(t for t in env.tasks("test", 6) if t.meta["kind"] == "create")
    ep = drive(env, task, scripted_expert)
    users = [m["content"] for m in ep.messages if m["role"] == "user"]
    uid = task.answer["actions"][0]["arguments"]["user_id"]
    assert users[0] == task.user_prompt and users[1] == f"My user id is {uid}."
    assert STOP in users[-1] and ep.user.stopped


def test_wrong_actions_fail_with_reason():
    env = MockEnv()
    task = next(t for t in env.tasks("test", 6) if t.meta["kind"] == "update_direct")
    args = task.answer["actions"][0]["arguments"]
    wrong = "pending" if args["status"] == "completed" else "completed"
    ep = env.start(task)
    ep.step(format_tool_call("update_task_status", {"task_id": args["task_id"], "status": wrong}))
    ep.step("All done.")
    assert ep.done and ep.reward() == 0.0 and "status" in ep.failure
    # the right write, then an extra unrelated creation: the database no longer matches
    uid = next(iter(task.answer["db"]["users"]))
    ep = env.start(task)
    ep.step(format_tool_call("update_task_status", args) + format_tool_call("create_task", {"user_id": uid,
                                                                                            "title": "extra"}))
    ep.step("Done.")
    assert ep.reward() == 0.0 and "missing" not in ep.failure and "unexpected" in ep.failure


def test_transfer_ends_episode_and_only_counts_for_delete():
    env = MockEnv()
    tasks = env.tasks("test", 6)
    delete = next(t for t in tasks if t.meta["kind"] == "delete")
    ep = env.start(delete)
    ep.step(format_tool_call("transfer_to_human_agents", {"summary": "anything"}))  # compare_args: []
    assert ep.done and ep.reward() == 1.0
    other = next(t for t in tasks if t.meta["kind"] == "update_direct")
    ep = env.start(other)
    ep.step(format_tool_call("transfer_to_human_agents", {"summary": "help"}))
    assert ep.done and ep.reward() == 0.0


def test_bad_calls_become_errors_not_exceptions():
    env = MockEnv()
    ep = env.start(env.tasks("test", 1)[0])
    obs = ep.step('<tool_call>\n{"name": "create_task", "arguments": {"user_id": 5}}\n</tool_call>'
                  "<tool_call>{not json</tool_call>" + format_tool_call("drop_table", {})
                  + format_tool_call("update_task_status", {"task_id": "task_99", "status": "completed"}))
    assert [o["content"].split(":")[0] for o in obs] == ["Error"] * 4
    assert "Task task_99 not found" in obs[3]["content"]
    assert len(ep.protocol_errors) == 3  # the precondition failure is not a protocol error


# --- real tau2 tasks ------------------------------------------------------------------------------


def test_real_tau2_tasks_load_play_and_skip():
    tasks, skipped = load_tau2_mock(FIXTURES / "mock")
    assert len(tasks) == 8 and set(skipped) == {"create_task_1_nl_eval", "update_task_with_user_tools"}
    by_id = {t.id: t for t in tasks}
    hist = by_id["tau2-mock-update_task_with_message_history"]
    assert hist.answer["db"]["tasks"]["task_2"]["title"] == "Project Review"  # history replayed into the db
    assert hist.user_prompt == "Please mark task_2 as completed."
    assert by_id["tau2-mock-impossible_task_1"].user_prompt == "I want to delete all my current tasks."
    assert by_id["tau2-mock-update_task_with_history_and_env_assertions"].answer["reward_basis"] == ["ENV_ASSERTION"]
    env = MockEnv(SimpleNamespace(data_dir=str(FIXTURES)))
    got = env.tasks("test", 40)
    assert sorted(t.id for t in got) == sorted(by_id) and env.skipped == skipped
    sample = [t.id for t in env.tasks("test", 3, seed=5)]
    assert sample == [t.id for t in env.tasks("test", 3, seed=5)] != [t.id for t in env.tasks("test", 3, seed=6)]
    for t in got:
        assert drive(env, t, scripted_expert).reward() == 1.0, t.id
        null = drive(env, t, lambda task, msgs: "")
        assert null.reward() == 0.0, t.id


# --- robustness -----------------------------------------------------------------------------------

_TASKS = MockEnv().tasks("test", 6)
_NAMES = ["create_task", "get_users", "update_task_status", "transfer_to_human_agents", "nope"]
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                     max_leaves=6)
_call = st.builds(lambda n, a: format_tool_call(n, a), st.sampled_from(_NAMES),
                  st.dictionaries(st.sampled_from(["user_id", "title", "task_id", "status", "summary", "x"]),
                                  _json, max_size=3))
_turn = st.one_of(st.text(max_size=120), _call,
                  st.builds(lambda a, b: a + "<tool_call>" + b, st.text(max_size=20), st.text(max_size=40)))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(_TASKS) - 1), st.lists(_turn, min_size=1, max_size=8))
def test_random_turns_never_raise(i, turns):
    drive_random_turns(MockEnv(), _TASKS[i], turns)


_op = st.one_of(
    st.tuples(st.just("create_task"), st.sampled_from(["user_1", "user_2", "user_3", "user_9"]), st.text(max_size=6)),
    st.tuples(st.just("update_task_status"), st.sampled_from([f"task_{i}" for i in range(1, 9)]),
              st.sampled_from(["pending", "completed"])),
)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, len(_TASKS) - 1), st.lists(_op, max_size=10))
def test_tools_keep_the_database_consistent(i, ops):
    """Whatever sequence of calls: ids stay task_1..task_n, each task has exactly one owner, statuses valid."""
    tools = MockTools(json.loads(json.dumps(_TASKS[i].answer["db"])))
    n0 = len(tools.db["tasks"])
    made = 0
    for name, a, b in ops:
        try:
            if name == "create_task":
                tools.create_task(a, b)
                made += 1
            else:
                tools.update_task_status(a, b)
        except ToolError:
            pass
    db = tools.db
    assert sorted(db["tasks"]) == sorted(f"task_{k}" for k in range(1, n0 + made + 1))
    owners = [t for u in db["users"].values() for t in u["tasks"]]
    assert sorted(owners) == sorted(db["tasks"])
    assert all(t["status"] in ("pending", "completed") and t["title"].strip() for t in db["tasks"].values())
