"""The telecom troubleshooting desk: tools and their preconditions, tasks, reward, expert, random text."""

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acl_lib.chat import format_tool_call
from acl_lib.envs.base import Task, ToolError
from acl_lib.envs.telecom import (
    COMPACT_SYSTEM_PROMPT,
    SYSTEM_PROMPT,
    TELECOM_KINDS,
    TELECOM_TOOLS,
    TELECOM_TOOLS_COMPACT,
    TelecomEnv,
    TelecomTools,
    scripted_expert,
)
from acl_lib.model.chat_template import render_chat
from conftest import drive_random_turns


def drive(env, task, policy, max_turns=10):
    ep = env.start(task, max_turns=max_turns)
    while not ep.done:
        ep.step(policy(task, ep.messages))
    return ep


def by_kind(kind, n=12, seed=0):
    return next(t for t in TelecomEnv(seed=seed).tasks("test", n) if t.meta["kind"] == kind)


def test_tool_list():
    assert [s["function"]["name"] for s in TELECOM_TOOLS] == [
        "get_customer_by_phone", "get_line_details", "get_data_usage", "check_network_status", "get_bills",
        "enable_roaming", "reset_apn", "refuel_data", "pay_bill", "resume_line", "transfer_to_human_agents"]


def test_mini_prompt_is_compact_with_the_same_signatures():
    def signature(s):
        fn = s["function"]
        props = {k: {kk: vv for kk, vv in v.items() if kk != "description"}
                 for k, v in fn["parameters"]["properties"].items()}
        return fn["name"], json.dumps(props, sort_keys=True), fn["parameters"]["required"]

    assert [signature(s) for s in TELECOM_TOOLS_COMPACT] == [signature(s) for s in TELECOM_TOOLS]
    assert all(s["function"]["description"] for s in TELECOM_TOOLS_COMPACT)
    mini = TelecomEnv(seed=0).tasks("test", 6)
    paper = TelecomEnv(seed=0, full_prompt=True).tasks("test", 6)  # the generated desk's full prose
    assert all(t.tools == TELECOM_TOOLS_COMPACT and t.system_prompt == COMPACT_SYSTEM_PROMPT for t in mini)
    assert all(t.tools == TELECOM_TOOLS and t.system_prompt == SYSTEM_PROMPT for t in paper)
    assert [t.answer for t in mini] == [t.answer for t in paper]  # the same tasks, only the prose differs
    size = lambda t: len(render_chat(t.initial_messages(), tools=t.tools, add_generation_prompt=True))  # noqa: E731
    assert max(map(size, mini)) < 3300 < 4500 < min(map(size, paper))


def test_tools_and_preconditions():
    task = by_kind("refuel")
    db = copy.deepcopy(task.answer["db"])
    lid = task.meta["line_id"]
    line = db["lines"][lid]
    plan = db["plans"][line["plan_id"]]
    tools = TelecomTools(db)
    assert tools.get_customer_by_phone(line["phone_number"])["matched_line_id"] == lid
    with pytest.raises(ToolError, match="No customer"):
        tools.get_customer_by_phone("000-0000")
    assert tools.get_data_usage(lid)["remaining_gb"] == 0
    with pytest.raises(ToolError, match="at most 2"):
        tools.refuel_data(lid, 3)
    with pytest.raises(ToolError, match="more than 0"):
        tools.refuel_data(lid, 0)
    out = tools.refuel_data(lid, 1.5)
    assert out["charged"] == round(1.5 * plan["refuel_price_per_gb"], 2)
    assert db["bills"][out["bill_id"]] == {"bill_id": out["bill_id"], "customer_id": line["customer_id"],
                                           "amount": out["charged"], "status": "pending",
                                           "description": "Data refuel 1.5 GB"}
    assert tools.get_data_usage(lid)["remaining_gb"] == 1.5
    with pytest.raises(ToolError, match="not used up"):
        tools.refuel_data(lid, 1)
    with pytest.raises(ToolError, match="already the default"):
        tools.reset_apn(lid)
    with pytest.raises(ToolError, match="not suspended"):
        tools.resume_line(lid)
    with pytest.raises(ToolError, match="not found"):
        tools.get_line_details("L9")
    assert tools.check_network_status("Nowhere")["status"] == "normal"


def test_suspended_line_needs_bills_paid_first():
    task = by_kind("suspended")
    db = copy.deepcopy(task.answer["db"])
    tools = TelecomTools(db)
    lid = task.meta["line_id"]
    with pytest.raises(ToolError, match="Overdue bills must be paid first"):
        tools.resume_line(lid)
    with pytest.raises(ToolError, match="suspended"):
        tools.enable_roaming(lid)
    bills = [a["arguments"]["bill_id"] for a in task.answer["actions"] if a["name"] == "pay_bill"]
    for b in bills:
        tools.pay_bill(b)
    with pytest.raises(ToolError, match="already paid"):
        tools.pay_bill(bills[0])
    assert tools.resume_line(lid) == f"Line {lid} resumed" and db["lines"][lid]["status"] == "active"


def test_outage_is_where_the_line_is():
    task = by_kind("outage")
    db = task.answer["db"]
    area = db["lines"][task.meta["line_id"]]["area"]
    status = TelecomTools(copy.deepcopy(db)).check_network_status(area.upper())
    assert status["status"] == "outage" and task.answer["communicate_info"] == [status["expected_fix"]]
    assert task.answer["actions"] == []


def test_tasks_deterministic_disjoint_and_serialisable():
    env = TelecomEnv(seed=1)
    a = env.tasks("test", 18)
    assert [t.to_dict() for t in a] == [t.to_dict() for t in TelecomEnv(seed=1).tasks("test", 18)]
    assert [t.to_dict() for t in a] != [t.to_dict() for t in TelecomEnv(seed=2).tasks("test", 18)]
    assert {t.meta["kind"] for t in a} == set(TELECOM_KINDS)
    names = lambda ts: {c["name"] for t in ts for c in t.answer["db"]["customers"].values()}  # noqa: E731
    assert not names(env.tasks("train", 60)) & names(env.tasks("test", 60))
    for t in a:
        assert Task.from_dict(json.loads(json.dumps(t.to_dict()))) == t
    assert env.splits == {"test": "telecom", "train": None}


def test_expert_solves_every_task_and_null_scores_zero():
    env = TelecomEnv(seed=0)
    for t in env.tasks("test", 30) + env.tasks("train", 6):
        ep = drive(env, Task.from_dict(t.to_dict()), scripted_expert)
        assert ep.reward() == 1.0, (t.id, ep.failure)
        assert not ep.protocol_errors and ep.turns <= 10
        assert all(not c["error"] for c in ep.tool_log), ep.tool_log
        null = drive(env, t, lambda task, msgs: "")
        assert null.reward() == 0.0 and null.failure


def test_reward_needs_db_and_communication():
    env = TelecomEnv()
    # the right refuel, never telling the price: database right, communication missing
    task = by_kind("refuel")
    ep = env.start(task)
    ep.step(format_tool_call("refuel_data", task.answer["actions"][0]["arguments"]))
    ep.step("Done, anything else?")
    assert ep.reward() == 0.0 and ep.failure.startswith("did not tell the user")
    # the price told, but the wrong amount refuelled: database differs
    args = dict(task.answer["actions"][0]["arguments"])
    args["gb"] = 2.0 if args["gb"] != 2.0 else 1.0
    ep = env.start(task)
    ep.step(format_tool_call("refuel_data", args))
    ep.step(f"Refuelled, it costs {task.answer['communicate_info'][0]}.")
    assert ep.reward() == 0.0 and "database differs" in ep.failure
    # a fix the problem did not need (reset APN on a roaming problem): 0
    task = by_kind("roaming")
    lid = task.meta["line_id"]
    ep = env.start(task)
    ep.step(format_tool_call("enable_roaming", {"line_id": lid}))
    ep.step(format_tool_call("refuel_data", {"line_id": lid, "gb": 1}))  # refused: data left -> no change
    ep.step("Roaming is on now.")
    assert ep.reward() == 1.0  # the refused write changed nothing
    ep = env.start(task)
    ep.step(format_tool_call("transfer_to_human_agents", {"summary": "roaming"}))
    assert ep.done and ep.reward() == 0.0


_TASKS = TelecomEnv().tasks("test", 6)
_NAMES = [s["function"]["name"] for s in TELECOM_TOOLS] + ["nope"]
_val = st.one_of(st.none(), st.booleans(), st.integers(-3, 5), st.floats(allow_nan=True), st.text(max_size=8),
                 st.sampled_from(["L2001", "L2002", "B3001", "C1001", "555-1234"]))
_call = st.builds(format_tool_call, st.sampled_from(_NAMES),
                  st.dictionaries(st.sampled_from(["line_id", "gb", "bill_id", "customer_id", "area",
                                                   "phone_number", "summary", "zzz"]), _val, max_size=3))
_turn = st.one_of(st.text(max_size=120), _call, st.just("Shall I proceed? (yes/no)"), st.just("What is your phone?"))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, len(_TASKS) - 1), st.lists(_turn, min_size=1, max_size=8))
def test_random_turns_never_raise(i, turns):
    drive_random_turns(TelecomEnv(), _TASKS[i], turns)


_op = st.tuples(
    st.sampled_from(["enable_roaming", "reset_apn", "refuel_data", "pay_bill", "resume_line"]),
    st.sampled_from(["L2001", "L2002", "L2003", "L2004", "L2005", "L2006", "L9"]),
    st.sampled_from(["B3001", "B3002", "B3003", "B3004", "B3005", "B3006", "B3007"]),
    st.sampled_from([0.5, 1.0, 2.0, 2.5]),
)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, len(_TASKS) - 1), st.lists(_op, max_size=12))
def test_tools_keep_the_database_consistent(i, ops):
    """Whatever the calls: an active line that was suspended has no overdue bills, every refuel is billed
    at the plan's price, nothing is refuelled while data is left beyond the 2 GB cap."""
    db0 = _TASKS[i].answer["db"]
    tools = TelecomTools(copy.deepcopy(db0))
    for name, lid, bid, gb in ops:
        try:
            if name == "pay_bill":
                tools.pay_bill(bid)
            elif name == "refuel_data":
                tools.refuel_data(lid, gb)
            else:
                getattr(tools, name)(lid)
        except ToolError:
            pass
    db = tools.db
    for lid, line in db["lines"].items():
        assert line["status"] in ("active", "suspended") and line["apn"] in (db0["lines"][lid]["apn"], "internet")
        if db0["lines"][lid]["status"] == "suspended" and line["status"] == "active":
            assert not [b for b in db["bills"].values() if b["customer_id"] == line["customer_id"]
                        and b["status"] == "overdue"]
        refuels = [b for b in db["bills"].values() if b["description"].startswith("Data refuel")
                   and b["bill_id"] not in db0["bills"] and b["customer_id"] == line["customer_id"]]
        price = db["plans"][line["plan_id"]]["refuel_price_per_gb"]
        if len(db["customers"][line["customer_id"]]["line_ids"]) == 1:
            assert sum(b["amount"] for b in refuels) == pytest.approx(line["data_refuelled_gb"] * price)
        assert line["data_refuelled_gb"] <= 2.0  # refuels only happen at 0 GB left, so at most one fits the cap
    assert set(db0["bills"]) <= set(db["bills"])
