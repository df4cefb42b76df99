"""The retail desk: schema round trip, each tool's preconditions and effects (on the real tau2 data),
the mini world and its tasks, episodes driven by the scripted expert and by bad agents, the paper profile,
and random inputs (hypothesis)."""

import copy
import json
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from acl_lib.chat import format_tool_call
from acl_lib.config import ConfigError, WorldsConfig
from acl_lib.envs.base import Task, ToolError
from acl_lib.envs.retail import (
    KINDS,
    RetailEnv,
    generate_tasks,
    generate_world,
    scripted_expert,
)
from acl_lib.envs.retail_db import (
    COMPACT_DESCRIPTIONS,
    TOOL_NAMES,
    TOOL_SCHEMAS,
    WRITE_TOOLS,
    RetailDB,
    RetailTools,
    run_actions,
    tool_schemas,
)
from acl_lib.model.chat_template import render_chat

FIXTURE = Path(__file__).parent / "data" / "tau2"


@pytest.fixture(scope="module")
def db_dict():
    return json.loads((FIXTURE / "retail" / "db.json").read_text())


@pytest.fixture
def tools(db_dict):
    return RetailTools(RetailDB.load(db_dict))


def err(fn, *args, **kwargs) -> str:
    with pytest.raises(ToolError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def orders_with(db, status, pred=lambda o, u: True):
    return [o for o in db["orders"].values() if o["status"] == status and pred(o, db["users"][o["user_id"]])]


def gift_card(user):
    return next((p for p in user["payment_methods"].values() if p["source"] == "gift_card"), None)


# --- schema ---------------------------------------------------------------------------------------


def test_db_round_trip_is_exact(db_dict):
    text = (FIXTURE / "retail" / "db.json").read_text()
    out = RetailDB.load(db_dict).dump()
    assert out == db_dict
    assert json.dumps(out, indent=4) == text  # byte for byte, key order and float formatting included
    bad = copy.deepcopy(db_dict)
    next(iter(bad["orders"].values()))["surprise"] = 1
    with pytest.raises(ValidationError):
        RetailDB.load(bad)


def test_tool_schemas():
    assert len(TOOL_SCHEMAS) == 16 and len(set(TOOL_NAMES)) == 16
    assert "get_item_details" in TOOL_NAMES and len(WRITE_TOOLS) == 7 and WRITE_TOOLS <= set(TOOL_NAMES)
    for s in TOOL_SCHEMAS:
        fn = s["function"]
        assert s["type"] == "function" and fn["description"]
        assert fn["parameters"]["required"] == list(fn["parameters"]["properties"])
        assert all(p["description"] for p in fn["parameters"]["properties"].values())
        assert hasattr(RetailTools, fn["name"])


def signature(schema: dict) -> tuple:
    """What a call must match: name, parameter names with their types (descriptions left out), required."""
    fn = schema["function"]
    props = {k: {kk: vv for kk, vv in v.items() if kk != "description"}
             for k, v in fn["parameters"]["properties"].items()}
    return fn["name"], json.dumps(props, sort_keys=True), tuple(fn["parameters"]["required"])


def test_compact_schemas_keep_the_signatures_and_shrink_the_prose():
    full, compact = tool_schemas(compact=False), tool_schemas(compact=True)
    assert full == TOOL_SCHEMAS and full is not TOOL_SCHEMAS  # a copy: callers may not corrupt the reference
    assert [signature(s) for s in compact] == [signature(s) for s in TOOL_SCHEMAS]
    assert set(COMPACT_DESCRIPTIONS) == set(TOOL_NAMES)
    for c in compact:
        assert c["function"]["description"] == COMPACT_DESCRIPTIONS[c["function"]["name"]]
        assert "\n" not in c["function"]["description"] and len(c["function"]["description"]) <= 140  # one line
        assert not any("description" in p for p in c["function"]["parameters"]["properties"].values())
    assert len(json.dumps(compact)) < len(json.dumps(TOOL_SCHEMAS)) / 2


def test_mini_prompt_is_compact_and_paper_prompt_is_the_reference():
    mini = RetailEnv(seed=0).tasks("test", 3)
    paper = RetailEnv(WorldsConfig(data_dir=str(FIXTURE))).tasks("test", 3)
    assert all(t.tools == tool_schemas(compact=True) for t in mini)
    assert all(t.tools == TOOL_SCHEMAS for t in paper)
    sizes = [len(render_chat(t.initial_messages(), tools=t.tools, add_generation_prompt=True)) for t in mini]
    # 16 signatures alone render to ~4.7k characters; the full schemas and policy to ~13k
    assert max(sizes) < 7000, sizes
    full = render_chat(mini[0].initial_messages(), tools=TOOL_SCHEMAS, add_generation_prompt=True)
    assert len(full) > 12000


# --- read tools -----------------------------------------------------------------------------------


def test_read_and_generic_tools(tools, db_dict):
    assert tools.calculate("(2 + 3) * 4 / 3") == "6.67"
    assert tools.calculate("100 - 0.456") == "99.54"
    assert err(tools.calculate, "2 ^ 3") == "Invalid characters in expression"
    assert err(tools.calculate, "import os") == "Invalid characters in expression"
    assert "Invalid expression" in err(tools.calculate, "1 / 0")
    t0 = time.time()
    err(tools.calculate, "9**9**9")  # the reference would hang here
    assert time.time() - t0 < 1
    assert tools.transfer_to_human_agents("help") == "Transfer successful"
    user = db_dict["users"]["noah_brown_6181"]
    assert tools.find_user_id_by_email(user["email"].upper()) == "noah_brown_6181"
    assert tools.find_user_id_by_name_zip("noah", "BROWN", user["address"]["zip"]) == "noah_brown_6181"
    assert err(tools.find_user_id_by_name_zip, "Noah", "Brown", "00000") == "User not found"
    assert err(tools.find_user_id_by_email, "nobody@example.com") == "User not found"
    assert json.loads(tools.get_order_details("#W2611340")) == db_dict["orders"]["#W2611340"]
    assert err(tools.get_order_details, "W2611340") == "Order not found"
    assert json.loads(tools.get_user_details("noah_brown_6181")) == user
    assert err(tools.get_product_details, "6086499569") == "Product not found"
    variant = db_dict["products"]["9523456873"]["variants"]["9612497925"]
    assert json.loads(tools.get_item_details("9612497925")) == variant
    assert err(tools.get_item_details, "9523456873") == "Item not found"  # a product id is not an item id
    types = json.loads(tools.list_all_product_types())
    assert len(types) == 50 and list(types) == sorted(types) and types["T-Shirt"] == "9523456873"


# --- write tools ----------------------------------------------------------------------------------


def test_cancel(tools, db_dict):
    processed = orders_with(db_dict, "processed")[0]["order_id"]
    assert err(tools.cancel_pending_order, processed, "no longer needed") == "Non-pending order cannot be cancelled"
    pending = orders_with(db_dict, "pending",
                          lambda o, u: o["payment_history"][0]["payment_method_id"].startswith("credit"))[0]
    assert err(tools.cancel_pending_order, pending["order_id"], "too expensive") == "Invalid reason"
    assert tools.db.dump() == db_dict  # failures changed nothing
    out = json.loads(tools.cancel_pending_order(pending["order_id"], "ordered by mistake"))
    assert out["status"] == "cancelled" and out["cancel_reason"] == "ordered by mistake"
    paid = pending["payment_history"][0]
    assert out["payment_history"] == [paid, dict(paid, transaction_type="refund")]
    assert tools.db.users[pending["user_id"]].model_dump(exclude_none=True) == db_dict["users"][pending["user_id"]]


def test_exchange_preconditions(tools, db_dict):
    pending = orders_with(db_dict, "pending")[0]["order_id"]
    order = orders_with(db_dict, "delivered", lambda o, u: gift_card(u) is not None)[0]
    oid, item = order["order_id"], order["items"][0]
    pm = order["payment_history"][0]["payment_method_id"]
    variants = db_dict["products"][item["product_id"]]["variants"]
    other_product_item = next(i for p, prod in db_dict["products"].items() if p != item["product_id"]
                              for i in prod["variants"])
    ex = tools.exchange_delivered_order_items
    assert err(ex, pending, [], [], pm) == "Non-delivered order cannot be exchanged"
    assert err(ex, oid, ["123"], ["456"], pm) == "Number of 123 not found."
    assert err(ex, oid, [item["item_id"]] * 5, ["1"] * 5, pm) == f"Number of {item['item_id']} not found."
    assert err(ex, oid, [item["item_id"]], [], pm) == "The number of items to be exchanged should match."
    assert err(ex, oid, [item["item_id"]], [other_product_item], pm) == "Variant not found"
    unavailable = [k for k, v in variants.items() if not v["available"]]
    if unavailable:
        msg = f"New item {unavailable[0]} not found or available"
        assert err(ex, oid, [item["item_id"]], [unavailable[0]], pm) == msg
    assert err(ex, oid, [item["item_id"]], [item["item_id"]], "paypal_0") == "Payment method not found"
    assert tools.db.dump() == db_dict
    # exchanging to the same variant is allowed by the reference (difference 0)
    out = json.loads(ex(oid, [item["item_id"]], [item["item_id"]], pm))
    assert out["status"] == "exchange requested" and out["exchange_price_difference"] == 0
    assert out["payment_history"] == order["payment_history"]


def test_exchange_gift_card_must_cover_difference(tools, db_dict):
    # #W4316152: two tea kettles at 94.80 -> 101.12 + 109.58 = +21.10 on a gift card holding 17.00
    msg = err(tools.exchange_delivered_order_items, "#W4316152", ["7292993796", "7292993796"],
              ["3761330360", "9647374798"], "gift_card_7245904")
    assert msg == "Insufficient gift card balance to pay for the price difference"
    out = json.loads(tools.exchange_delivered_order_items("#W4316152", ["7292993796"], ["3761330360"],
                                                          "gift_card_7245904"))
    assert out["exchange_price_difference"] == 6.32
    assert tools.db.users[out["user_id"]].payment_methods["gift_card_7245904"].balance == 17.0  # no money moves yet


def test_return(tools, db_dict):
    def other_method(o, u):
        return any(p["source"] != "gift_card" and k != o["payment_history"][0]["payment_method_id"]
                   for k, p in u["payment_methods"].items())

    order = orders_with(db_dict, "delivered", other_method)[0]
    oid, user = order["order_id"], db_dict["users"][order["user_id"]]
    original = order["payment_history"][0]["payment_method_id"]
    wrong = next(k for k, p in user["payment_methods"].items() if p["source"] != "gift_card" and k != original)
    ids = [i["item_id"] for i in order["items"]]
    ret = tools.return_delivered_order_items
    pending_id = orders_with(db_dict, "pending")[0]["order_id"]
    assert err(ret, pending_id, ids, original) == "Non-delivered order cannot be returned"
    assert err(ret, oid, ids, wrong) == "Payment method should be the original payment method"
    assert err(ret, oid, ids + ids, original) == "Some item not found"
    out = json.loads(ret(oid, list(reversed(ids)), original))
    assert out["status"] == "return requested" and out["return_items"] == sorted(ids)
    assert out["return_payment_method_id"] == original and out["payment_history"] == order["payment_history"]


def test_modify_items_and_address(tools, db_dict):
    def has_alt(i):  # another variant of the item's product is available
        variants = db_dict["products"][i["product_id"]]["variants"]
        return any(v["available"] and k != i["item_id"] for k, v in variants.items())

    def has_gift_and_alt(o, u):
        g = gift_card(u)
        return g is not None and 0 < g["balance"] < 5000 and any(has_alt(i) for i in o["items"])

    order = orders_with(db_dict, "pending", has_gift_and_alt)[0]
    oid, user = order["order_id"], db_dict["users"][order["user_id"]]
    gift = gift_card(user)
    item = next(i for i in order["items"] if has_alt(i))
    new = next(v for k, v in db_dict["products"][item["product_id"]]["variants"].items()
               if v["available"] and k != item["item_id"])
    mod = tools.modify_pending_order_items
    assert (err(mod, oid, [item["item_id"]], [item["item_id"]], gift["id"])
            == "The new item id should be different from the old item id")
    assert err(mod, oid, ["42"], [new["item_id"]], gift["id"]) == "42 not found"
    assert err(mod, oid, [item["item_id"]], [], gift["id"]) == "The number of items to be exchanged should match"
    diff = new["price"] - item["price"]
    if diff > gift["balance"]:
        assert (err(mod, oid, [item["item_id"]], [new["item_id"]], gift["id"])
                == "Insufficient gift card balance to pay for the new item")
        return
    out = json.loads(mod(oid, [item["item_id"]], [new["item_id"]], gift["id"]))
    assert out["status"] == "pending (item modified)"
    assert out["payment_history"][-1] == {"transaction_type": "payment" if diff > 0 else "refund",
                                          "amount": abs(diff), "payment_method_id": gift["id"]}
    assert tools.db.users[user["user_id"]].payment_methods[gift["id"]].balance == round(gift["balance"] - diff, 2)
    changed = next(i for i in out["items"] if i["item_id"] == new["item_id"])
    assert changed["price"] == new["price"] and changed["options"] == new["options"]
    # only exactly-"pending" orders can change items or be cancelled; the address only needs "pending" in it
    assert err(mod, oid, [new["item_id"]], [item["item_id"]], gift["id"]) == "Non-pending order cannot be modified"
    assert err(tools.cancel_pending_order, oid, "no longer needed") == "Non-pending order cannot be cancelled"
    addr = dict(address1="1 Main St", address2="", city="Austin", state="TX", country="USA", zip="73301")
    out = json.loads(tools.modify_pending_order_address(oid, **addr))
    assert out["address"] == {k: addr[k] for k in ("address1", "address2", "city", "country", "state", "zip")}
    delivered = orders_with(db_dict, "delivered")[0]["order_id"]
    assert err(tools.modify_pending_order_address, delivered, **addr) == "Non-pending order cannot be modified"


def test_modify_payment(tools, db_dict):
    def two_methods(o, u):
        g = gift_card(u)
        return (g is not None and o["payment_history"][0]["payment_method_id"] != g["id"]
                and g["balance"] >= o["payment_history"][0]["amount"])

    order = orders_with(db_dict, "pending", two_methods)[0]
    oid, user = order["order_id"], db_dict["users"][order["user_id"]]
    old = order["payment_history"][0]
    gift = gift_card(user)
    pay = tools.modify_pending_order_payment
    assert err(pay, oid, old["payment_method_id"]) == "The new payment method should be different from the current one"
    assert err(pay, oid, "gift_card_0") == "Payment method not found"
    out = json.loads(pay(oid, gift["id"]))
    assert out["payment_history"] == [old, dict(old, payment_method_id=gift["id"]),
                                      dict(old, transaction_type="refund")]
    balance = tools.db.users[user["user_id"]].payment_methods[gift["id"]].balance
    assert balance == round(gift["balance"] - old["amount"], 2)
    assert err(pay, oid, old["payment_method_id"]) == "There should be exactly one payment for a pending order"
    # a gift card too poor for the order
    def too_poor(o, u):
        g, paid = gift_card(u), o["payment_history"][0]
        return (g is not None and g["balance"] < paid["amount"] and paid["payment_method_id"] != g["id"]
                and len(o["payment_history"]) == 1)

    poor = orders_with(db_dict, "pending", too_poor)[0]
    poor_gift = gift_card(db_dict["users"][poor["user_id"]])["id"]
    assert err(pay, poor["order_id"], poor_gift) == "Insufficient gift card balance to pay for the order"


def test_modify_user_address(tools, db_dict):
    addr = dict(address1="2 Elm St", address2="Apt 4", city="Boise", state="ID", country="USA", zip="83701")
    out = json.loads(tools.modify_user_address("noah_brown_6181", **addr))
    before = dict(db_dict["users"]["noah_brown_6181"])
    fields = ("address1", "address2", "city", "country", "state", "zip")
    assert out == dict(before, address={k: addr[k] for k in fields})
    assert err(tools.modify_user_address, "nobody", **addr) == "User not found"
    assert tools.touched_users == {"noah_brown_6181"} and tools.touched_orders == set()


# --- mini world -----------------------------------------------------------------------------------


def test_world_is_deterministic_and_in_schema():
    w = generate_world(3)
    assert w == generate_world(3) and w != generate_world(4)
    assert 8 <= len(w["products"]) <= 15 and 40 <= len(w["users"]) <= 80
    assert RetailDB.load(w).dump() == w
    ids = {(u["name"]["first_name"], u["name"]["last_name"], u["address"]["zip"]) for u in w["users"].values()}
    assert len(ids) == len(w["users"]) == len({u["email"] for u in w["users"].values()})
    assert {o["status"] for o in w["orders"].values()} >= {"pending", "delivered"}


def test_tasks_deterministic_disjoint_serialisable():
    env = RetailEnv(seed=1)
    train, test = env.tasks("train", 120), env.tasks("test", 40)
    assert [t.to_dict() for t in train] == [t.to_dict() for t in RetailEnv(seed=1).tasks("train", 120)]
    assert [t.to_dict() for t in env.tasks("train", 10, seed=1)] != [t.to_dict() for t in train[:10]]
    assert [t.to_dict() for t in env.tasks("train", 10)] == [t.to_dict() for t in train[:10]]  # prefix-stable
    assert len({t.id for t in train + test}) == 160
    user_of = lambda t: t.answer["actions"][0]["arguments"]  # noqa: E731  the identifying look-up
    train_auth = {json.dumps(user_of(t), sort_keys=True) for t in train}
    assert not train_auth & {json.dumps(user_of(t), sort_keys=True) for t in test}
    assert {t.meta["kind"] for t in train} == set(KINDS)
    assert {t.meta["difficulty"] for t in train} == {1, 2, 3, 4, 5}
    for t in train + test:
        d = json.loads(json.dumps(t.to_dict()))
        assert Task.from_dict(d) == t
        assert t.tools == tool_schemas(compact=True) and t.system_prompt == env.policy and t.domain == "retail"
        assert t.benchmark == "retail"
        ins = t.meta["user_scenario"]["instructions"]
        assert {"task_instructions", "reason_for_call", "known_info", "unknown_info"} <= set(ins)
        assert t.user_prompt == t.answer["scenario"]["request"] == ins["reason_for_call"]


def test_mini_gold_actions_apply_cleanly():
    world = generate_world(0)
    for t in generate_tasks(world, 0, "train", 80) + generate_tasks(world, 0, "test", 20):
        actions = t["evaluation_criteria"]["actions"]
        tools, failures = run_actions(RetailDB.load(world), actions)
        assert failures == []
        writes = any(a["name"] in WRITE_TOOLS for a in actions)
        assert writes == bool(tools.touched_orders | tools.touched_users)
        assert writes or t["evaluation_criteria"]["communicate_info"]  # every task asks for something


def play(env, task, policy, max_turns=16):
    ep = env.start(Task.from_dict(task.to_dict()), max_turns=max_turns)
    while not ep.done:
        ep.step(policy(task, ep.messages))
    return ep


@pytest.mark.parametrize("world_seed", [0, 5])
def test_scripted_expert_solves_every_task_and_doing_nothing_solves_none(world_seed):
    env = RetailEnv(seed=world_seed)
    tasks = env.tasks("train", 30) + env.tasks("test", 15)
    for task in tasks:
        ep = play(env, task, scripted_expert)
        assert ep.reward() == 1.0, (task.id, ep.failure)
        assert not ep.protocol_errors and ep.messages[-1]["content"].endswith("###STOP###")
        nothing = play(env, task, lambda t, m: "Hello! How are you today?")
        assert nothing.reward() == 0.0 and nothing.failure


def test_episode_failures_are_explained():
    env = RetailEnv(seed=0)
    tasks = env.tasks("train", 60)
    cancel = next(t for t in tasks if t.meta["kind"] == "cancel")
    # a wrong reason: the write succeeds but the database differs from the gold one
    gold = cancel.answer["actions"][-1]["arguments"]
    wrong = "ordered by mistake" if gold["reason"] == "no longer needed" else "no longer needed"
    ep = env.start(cancel)
    ep.step(format_tool_call("cancel_pending_order", dict(gold, reason=wrong)))
    ep.step("Done.")
    assert ep.done and ep.reward() == 0.0
    assert ep.failure == f"database differs from gold: orders {gold['order_id']} differ"
    # an info task where the agent never says the answer
    info = next(t for t in tasks if t.meta["kind"] == "order_total")
    ep = env.start(info)
    ep.step("Your order looks fine.")
    assert ep.reward() == 0.0 and ep.failure == f"did not communicate {info.answer['communicate_info'][0]!r}"
    # turn limit, malformed calls, unknown tools
    ep = env.start(info, max_turns=2)
    out = ep.step("<tool_call>\n{not json\n</tool_call>")
    assert out[0]["role"] == "tool" and out[0]["content"].startswith("Error: malformed JSON")
    out = ep.step(format_tool_call("drop_database", {}))
    assert "unknown tool" in out[0]["content"] and ep.done
    assert ep.reward() == 0.0 and "turn limit (2) reached" in ep.failure and len(ep.protocol_errors) == 2
    # a tool error is an observation, not an exception
    ep = env.start(info)
    out = ep.step(format_tool_call("get_order_details", {"order_id": "#W0"}))
    assert out == [{"role": "tool", "name": "get_order_details", "content": "Error: Order not found"}]
    # transferring ends the conversation
    ep.step(format_tool_call("transfer_to_human_agents", {"summary": "x"}))
    assert ep.done and ep.transferred


# --- paper profile --------------------------------------------------------------------------------


def test_paper_profile_loads_real_tasks_and_refuses_to_play_them(tmp_path):
    env = RetailEnv(WorldsConfig(data_dir=str(FIXTURE)))
    test, train = env.tasks("test", 10**6), env.tasks("train", 10**6)
    assert (len(test), len(train)) == (40, 74) and not {t.id for t in test} & {t.id for t in train}
    sample = [t.id for t in env.tasks("test", 5, seed=2)]
    assert sample == [t.id for t in env.tasks("test", 5, seed=2)] != [t.id for t in env.tasks("test", 5, seed=3)]
    assert env.policy == (FIXTURE / "retail" / "policy.md").read_text() == test[0].system_prompt
    t = test[0]
    assert t.benchmark == "retail" and t.answer["scenario"] is None and t.answer["actions"]
    with pytest.raises(ConfigError, match="LLM user simulator"):
        env.start(Task.from_dict(t.to_dict()))
    with pytest.raises(ConfigError, match="missing"):
        RetailEnv(WorldsConfig(data_dir=str(tmp_path)))


# --- random inputs --------------------------------------------------------------------------------

_WORLD = generate_world(0)
_REAL = (list(_WORLD["orders"]) + list(_WORLD["users"]) + list(_WORLD["products"])
         + [i for p in _WORLD["products"].values() for i in p["variants"]]
         + [m for u in _WORLD["users"].values() for m in u["payment_methods"]])
_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20) | st.sampled_from(_REAL)
    | st.sampled_from(["no longer needed", "ordered by mistake", "1 + 2", "(3", "2**2000", ""]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@pytest.mark.slow
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(TOOL_NAMES), data=st.data())
def test_tools_raise_only_tool_errors(name, data):
    tools = RetailTools(RetailDB.load(_WORLD))
    params = next(s for s in TOOL_SCHEMAS if s["function"]["name"] == name)["function"]["parameters"]["properties"]
    args = {}
    for p, spec in params.items():
        if spec["type"] == "array":
            args[p] = data.draw(st.lists(st.sampled_from(_REAL) | st.text(max_size=5), max_size=3) | _values)
        else:
            args[p] = data.draw(_values)
    if data.draw(st.booleans()):
        args = data.draw(st.dictionaries(st.text(max_size=8), _values, max_size=3))
    try:
        out = tools.call(name, args)
    except ToolError:
        return
    assert isinstance(out, str)


_ENV = RetailEnv(seed=0)
_TASK = _ENV.tasks("test", 1)[0]


@settings(max_examples=40, deadline=None)
@given(texts=st.lists(st.text(max_size=60) | st.sampled_from([
    "<tool_call>", "<tool_call>{\"name\": 1}</tool_call>", "Shall I proceed (yes/no)?", "What is your email?",
    format_tool_call("cancel_pending_order", {"order_id": 5, "reason": []}),
    format_tool_call("calculate", {"expression": "9**9**9"}),
]), min_size=1, max_size=6))
def test_episode_never_raises_on_model_text(texts):
    ep = _ENV.start(_TASK, max_turns=5)
    for text in texts:
        if ep.done:
            break
        obs = ep.step(text)
        assert all(isinstance(m["content"], str) for m in obs)
    r = ep.reward()
    assert 0.0 <= r <= 1.0


def test_the_mini_world_can_be_restricted_to_some_task_kinds_and_email_identification():
    from acl_lib.config import ConfigError, load_config
    from acl_lib.envs.retail import RetailEnv

    cfg = load_config("mini", ["worlds.retail_kinds=[order_status,cancel]", "worlds.retail_auth=email"])
    env = RetailEnv(cfg.worlds, seed=0)
    tasks = env.tasks("test", 24, seed=0)
    assert {t.meta["kind"] for t in tasks} == {"order_status", "cancel"}
    assert all(t.answer["actions"][0]["name"] == "find_user_id_by_email" for t in tasks)
    # every task still passes with the expert, on the same 16 tools and database-equality reward
    from acl_lib.eval.harness import run_episodes
    from acl_lib.eval.policies import ExpertPolicy

    episodes = [env.start(t, max_turns=16) for t in tasks]
    run_episodes(ExpertPolicy(), episodes)
    assert [e.reward() for e in episodes] == [1.0] * len(tasks)
    assert len(tasks[0].tools) == 16
    default = RetailEnv(load_config("mini", []).worlds, seed=0).tasks("test", 24, seed=0)
    assert len({t.meta["kind"] for t in default}) > 2
    with pytest.raises(ConfigError, match="retail_kinds"):
        load_config("mini", ["worlds.retail_kinds=[refund_everything]"])


def test_episodes_fork_the_store_and_never_write_to_it():
    """Every episode's tools act on a fork of the environment's validated store: write tasks solved by the expert
    leave the shared store as it was, and the same task solved twice passes twice."""
    from acl_lib.envs import make_env, scripted_expert

    env = make_env("retail", None, seed=0)
    tasks = [t for t in env.tasks("train", 40) if t.meta["kind"] not in ("order_status", "order_total")][:6]
    assert tasks
    expert = scripted_expert("retail")
    for _ in range(2):
        for t in tasks:
            ep = env.start(t, max_turns=12)
            while not ep.done:
                ep.step(expert(t, ep.messages))
            assert ep.reward() == 1.0, ep.failure
            shared = next(iter(env._dbs.values()))
            assert ep.toolkit.db is not shared and ep.toolkit.touched_orders | ep.toolkit.touched_users
    assert shared.dump() == env.world()  # the generated world, as it was before any episode wrote
