"""E-commerce: the tau2-bench retail desk's environment, task generators, scripted expert and replay CLI.
Its database and tools are in ``retail_db.py``, the episode loop in ``desk.py``.

Mini worlds (``worlds.data_dir`` empty): a generated store in the tau2 schema (8-15 products with
variants, 40-80 users with payment methods, 1-3 orders each), deterministic from the world seed, and
generated tasks in the tau2 task schema. Each task also carries a *structured* user scenario that the
rule-based simulator (``usersim.RuleUser``) plays: it identifies itself when asked, states its request,
answers detail questions, says "yes" to a confirmation and ends with ``###STOP###``. Task kinds:
order status / order total (read-only, scored by ``communicate_info``), cancel, modify order address,
modify user address, modify payment, modify items, return, exchange. Difficulty 1-5 grows with the kind,
identification by name + zip instead of email, and details the user only gives when asked. Train and
test tasks concern disjoint sets of users, so they never overlap. The agent sees a short policy
(``MINI_POLICY``) and the compact tool schemas (``retail_db.tool_schemas(compact=True)``: the same 16
signatures, one-line descriptions), so the prompt fits a small model's context.

Paper profile (``worlds.data_dir`` set): ``<data_dir>/retail/{db.json,tasks.json,split_tasks.json,policy.md}``
(the layout of the tau2-bench data, as in ``tests/data/tau2``); the agent sees the real ``policy.md`` and the
reference's full tool schemas. The real tasks describe their user in prose (``user_scenario``): their customer is
the LLM user simulator of ``llm_user.py`` (``worlds.user_sim``; ``start()`` raises ``ConfigError`` naming the key
when none is set). Their gold replay (``replay`` / ``replay_cli``) needs no simulator.

Reward (both scales): the episode's final database must equal the one obtained by replaying the task's
gold actions on a fresh copy of the world database (failed gold actions are skipped: they change
nothing), and every ``communicate_info`` string must occur in some assistant message (case-insensitive,
commas removed from the message, as tau2's evaluator does). Any miss gives 0 with ``failure`` saying why.
(tau2 itself checks ``communicate_info`` only when a task's ``reward_basis`` lists ``COMMUNICATE``, which
none of the 114 real retail tasks does; here it is always checked where a task lists it. The mini tasks
list ``["DB", "COMMUNICATE"]``.) Episodes are ``desk.DeskEpisode`` s with a ``RetailDesk``, which
compares only the records a write touched with the task's ``gold_state``.

CLI: ``python -m acl_lib.envs.retail replay --db DB.json --tasks TASKS.json --out OUT.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

from acl_lib.atomic import atomic_write_text
from acl_lib.chat import format_tool_call
from acl_lib.config import RETAIL_KINDS, ConfigError, WorldsConfig
from acl_lib.envs import llm_user
from acl_lib.envs.base import Environment, Task
from acl_lib.envs.desk import CLOSING, Desk, DeskEpisode, ask_detail, planned_turn
from acl_lib.envs.retail_db import (
    WRITE_TOOLS,
    RetailDB,
    RetailTools,
    record,
    replay,
    run_actions,
    tool_schemas,
)
from acl_lib.envs.usersim import RuleUser

# The mini worlds' policy: what the compact tool descriptions (retail_db.COMPACT_DESCRIPTIONS) do not say.
# (A backslash at a line's end continues the line: the policy's text has no line break there.)
MINI_POLICY = """# Retail agent policy

You are a customer service agent of an online store. You help the user with their own profile, orders and products.

- First authenticate the user: find their user id by email, or by name and zip code, even if they give a user id.
- Help only that user, with their own orders.
- Before any change to the database, state its details and get an explicit "yes".
- At most one tool call per turn, with no reply to the user in that turn.
- Use the tools; never make up information. Deny requests against this policy.
- Only pending orders can be cancelled or modified; only delivered orders can be returned or exchanged. A gift card \
must have enough balance to pay."""

# --- mini world generation ------------------------------------------------------------------------

# name, base price (dollars), option -> values
CATALOG: list[tuple[str, float, dict[str, list[str]]]] = [
    ("T-Shirt", 25.0, {"color": ["red", "blue", "black", "white"], "size": ["S", "M", "L", "XL"]}),
    ("Water Bottle", 20.0, {"capacity": ["500ml", "750ml", "1000ml"], "material": ["glass", "plastic", "steel"]}),
    ("Desk Lamp", 45.0, {"color": ["black", "white", "silver"], "brightness": ["low", "medium", "high"]}),
    ("Headphones", 120.0, {"type": ["over-ear", "on-ear", "in-ear"], "color": ["black", "white", "blue"]}),
    ("Running Shoes", 90.0, {"size": ["8", "9", "10", "11"], "color": ["grey", "black", "red"]}),
    ("Backpack", 60.0, {"color": ["green", "black", "navy"], "size": ["small", "medium", "large"]}),
    ("Coffee Maker", 80.0, {"color": ["black", "stainless"], "capacity": ["4 cups", "8 cups", "12 cups"]}),
    ("Keyboard", 70.0, {"switch type": ["linear", "tactile", "clicky"], "layout": ["compact", "full size"]}),
    ("Office Chair", 200.0, {"material": ["mesh", "leather", "fabric"], "color": ["black", "grey"]}),
    ("Yoga Mat", 30.0, {"thickness": ["4mm", "6mm", "8mm"], "color": ["purple", "blue", "pink"]}),
    ("Sunglasses", 55.0, {"frame color": ["black", "brown", "gold"], "lens color": ["green", "grey", "blue"]}),
    ("Wall Clock", 35.0, {"style": ["modern", "classic"], "diameter": ["20cm", "30cm", "40cm"]}),
    ("Tea Kettle", 40.0, {"material": ["glass", "steel", "ceramic"], "capacity": ["1L", "1.5L"]}),
    ("Smart Watch", 250.0, {"band": ["silicone", "leather", "metal"], "color": ["black", "silver", "gold"]}),
    ("Bluetooth Speaker", 75.0, {"color": ["red", "blue", "black"], "battery": ["10h", "20h"]}),
    ("Notebook", 8.0, {"paper": ["lined", "grid", "blank"], "size": ["A5", "A4"]}),
]
FIRST_NAMES = ["Ava", "Liam", "Mia", "Noah", "Zoe", "Omar", "Lena", "Ravi", "Ines", "Kofi", "Yara", "Tomas",
               "Aiko", "Hugo", "Nora", "Iker", "Sana", "Eli", "Maya", "Jonas", "Leila", "Arun", "Clara", "Dmitri"]
LAST_NAMES = ["Moreno", "Okafor", "Lindqvist", "Tanaka", "Haddad", "Kowalski", "Brennan", "Varga", "Achebe",
              "Novak", "Castillo", "Petrov", "Sato", "Quinn", "Duarte", "Mbeki", "Farrow", "Ibsen", "Kaur", "Vance"]
STREETS = ["Maple Avenue", "Cedar Lane", "Hillcrest Road", "Lakeview Drive", "Elm Street", "Willow Way",
           "Harbor Street", "Orchard Road", "Sunset Boulevard", "Birch Court", "Park Place", "River Road"]
CITIES = [("Springfield", "IL", "627"), ("Riverton", "WY", "825"), ("Fairview", "OR", "970"),
          ("Greenville", "SC", "296"), ("Madison", "WI", "537"), ("Clayton", "MO", "631"),
          ("Ashland", "KY", "411"), ("Burlington", "VT", "054"), ("Dayton", "OH", "454"), ("Salem", "MA", "019")]
CARD_BRANDS = ["visa", "mastercard", "amex"]
STATUS_WEIGHTS = {"pending": 0.4, "delivered": 0.35, "processed": 0.15, "cancelled": 0.1}


def _digits(rng: random.Random, n: int, used: set[str]) -> str:
    while True:
        s = str(rng.randint(10 ** (n - 1), 10**n - 1))
        if s not in used:
            used.add(s)
            return s


def random_address(rng: random.Random) -> dict:
    """An invented US address in the tau2 field order."""
    city, state, zip3 = rng.choice(CITIES)
    return {
        "address1": f"{rng.randint(10, 999)} {rng.choice(STREETS)}",
        "address2": rng.choice(["", f"Apt {rng.randint(1, 40)}", f"Suite {rng.randint(100, 900)}"]),
        "city": city,
        "country": "USA",
        "state": state,
        "zip": f"{zip3}{rng.randint(10, 99)}",
    }


def generate_world(seed: int, n_products: tuple[int, int] = (8, 15), n_users: tuple[int, int] = (40, 80)) -> dict:
    """A mini store in the tau2 ``db.json`` schema, deterministic in ``seed``.

    Every user has distinct (first name, last name, zip) and email, and at most one payment method of
    each kind (so "my PayPal account" / "my gift card" / "my visa card" name one method).
    """
    rng = random.Random(f"retail-world:{seed}")
    used: set[str] = set()
    products: dict[str, dict] = {}
    for name, base, options in rng.sample(CATALOG, rng.randint(*n_products)):
        combos = [{}]
        for opt, values in options.items():
            combos = [dict(c, **{opt: v}) for c in combos for v in values]
        variants = {}
        for combo in rng.sample(combos, min(len(combos), rng.randint(3, 6))):
            item_id = _digits(rng, 10, used)
            price = round(base * rng.uniform(0.8, 1.25), 2)
            variants[item_id] = {"item_id": item_id, "options": combo, "available": rng.random() < 0.8, "price": price}
        pid = _digits(rng, 10, used)
        products[pid] = {"name": name, "product_id": pid, "variants": variants}

    users: dict[str, dict] = {}
    orders: dict[str, dict] = {}
    identities: set[tuple[str, str, str]] = set()
    for _ in range(rng.randint(*n_users)):
        while True:
            first, last, address = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES), random_address(rng)
            if (first, last, address["zip"]) not in identities:
                identities.add((first, last, address["zip"]))
                break
        suffix = _digits(rng, 4, used)
        user_id = f"{first.lower()}_{last.lower()}_{suffix}"
        methods: dict[str, dict] = {}
        for source in rng.sample(["credit_card", "paypal", "gift_card"], rng.randint(1, 3)):
            pm_id = f"{source}_{_digits(rng, 7, used)}"
            if source == "credit_card":
                methods[pm_id] = {"source": source, "id": pm_id, "brand": rng.choice(CARD_BRANDS),
                                  "last_four": f"{rng.randint(0, 9999):04d}"}
            elif source == "gift_card":
                methods[pm_id] = {"source": source, "id": pm_id, "balance": float(rng.randint(0, 400))}
            else:
                methods[pm_id] = {"source": source, "id": pm_id}
        user = {"user_id": user_id, "name": {"first_name": first, "last_name": last}, "address": address,
                "email": f"{first.lower()}.{last.lower()}{suffix}@example.com", "payment_methods": methods,
                "orders": []}
        for _ in range(rng.randint(1, 3)):
            order_id = f"#W{_digits(rng, 7, used)}"
            items = []
            for pid in rng.sample(sorted(products), rng.randint(1, 3)):
                v = products[pid]["variants"][rng.choice(sorted(products[pid]["variants"]))]
                items.append({"name": products[pid]["name"], "product_id": pid, "item_id": v["item_id"],
                              "price": v["price"], "options": dict(v["options"])})
            status = rng.choices(list(STATUS_WEIGHTS), weights=list(STATUS_WEIGHTS.values()))[0]
            fulfillments = []
            if status in ("processed", "delivered"):
                fulfillments = [{"tracking_id": [_digits(rng, 12, used)], "item_ids": [i["item_id"] for i in items]}]
            pm_id = rng.choice(sorted(methods))
            total = round(sum(i["price"] for i in items), 2)
            history = [{"transaction_type": "payment", "amount": total, "payment_method_id": pm_id}]
            if status == "cancelled":
                history.append({"transaction_type": "refund", "amount": total, "payment_method_id": pm_id})
            orders[order_id] = {"order_id": order_id, "user_id": user_id, "address": dict(address), "items": items,
                                "status": status, "fulfillments": fulfillments, "payment_history": history}
            user["orders"].append(order_id)
        users[user_id] = user
    return {"products": products, "users": users, "orders": orders}


# --- mini task generation -------------------------------------------------------------------------

KINDS = list(RETAIL_KINDS)  # order status / total, cancel, modify order address, modify user address, ...
BASE_DIFFICULTY = {"order_status": 1, "order_total": 1, "cancel": 2, "modify_order_address": 2,
                   "modify_user_address": 2, "modify_payment": 3, "return": 3, "modify_items": 4, "exchange": 4}
REASON_PHRASES = {"no longer needed": "I no longer need it", "ordered by mistake": "I ordered it by mistake"}
AUTH_QUESTION = "Could you please give me your email, or your name and zip code, to verify your identity?"


def describe_payment(pm: dict) -> str:
    """How a user names one of their payment methods."""
    if pm["source"] == "credit_card":
        return f"{pm['brand']} credit card ending in {pm['last_four']}"
    return "PayPal account" if pm["source"] == "paypal" else "gift card"


def address_text(a: dict) -> str:
    parts = [a["address1"], a["address2"], a["city"], f"{a['state']} {a['zip']}", a["country"]]
    return ", ".join(p for p in parts if p)


def options_text(options: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in options.items())


def _action(name: str, **arguments: Any) -> dict:
    return {"name": name, "arguments": arguments}


def _alternative(rng: random.Random, db: dict, item: dict, exclude: set[str] = frozenset()) -> dict | None:
    """An available variant of ``item``'s product with another item id (None if there is none)."""
    variants = db["products"][item["product_id"]]["variants"]
    choices = [v for k, v in sorted(variants.items()) if v["available"] and k != item["item_id"] and k not in exclude]
    return rng.choice(choices) if choices else None


def _pay_choice(rng: random.Random, user: dict, amount: float, exclude: str | None = None) -> dict | None:
    """A payment method of ``user`` able to pay ``amount`` (a gift card needs the balance)."""
    ok = [pm for pid, pm in sorted(user["payment_methods"].items())
          if pid != exclude and (pm["source"] != "gift_card" or pm["balance"] >= amount)]
    return rng.choice(ok) if ok else None


def make_task(db: dict, user_id: str, kind: str, rng: random.Random, auth: str = "any") -> dict | None:
    """One task in the tau2 task schema plus a ``scenario`` for ``RuleUser`` (None if ``user_id`` has
    no order that fits ``kind``). ``auth``: "any" (e-mail or name + zip) or "email". Gold actions carry no
    ``action_id`` yet."""
    user = db["users"][user_id]
    first, last = user["name"]["first_name"], user["name"]["last_name"]
    by_email = rng.random() < 0.5 or auth == "email"  # the draw is made either way: the rest of the task is the same
    auth = {"email": user["email"]} if by_email else {"name": f"{first} {last}", "zip": user["address"]["zip"]}
    find = (_action("find_user_id_by_email", email=user["email"]) if by_email else
            _action("find_user_id_by_name_zip", first_name=first, last_name=last, zip=user["address"]["zip"]))
    orders = [db["orders"][o] for o in user["orders"]]
    want_status = {"cancel": "pending", "modify_order_address": "pending", "modify_payment": "pending",
                   "modify_items": "pending", "return": "delivered", "exchange": "delivered"}.get(kind)
    candidates = [o for o in orders if want_status is None or o["status"] == want_status]
    if kind == "order_total":
        candidates = [o for o in candidates if o["status"] != "cancelled"]
    if not candidates and kind != "modify_user_address":
        return None
    order = rng.choice(candidates) if candidates else None
    oid = order["order_id"] if order else None
    details: dict[str, str] = {}
    withhold = rng.random() < 0.35  # the user gives one detail only when asked for it
    communicate: list[str] = []
    get_order = _action("get_order_details", order_id=oid)
    get_user = _action("get_user_details", user_id=user_id)
    order_ref = "one of my orders" if withhold else f"my order {oid}"
    if withhold and oid:
        details["order id"] = oid

    if kind == "order_status":
        request = f"Hi, what is the status of {order_ref}?"
        actions = [find, get_order]
        communicate = [order["status"]]
    elif kind == "order_total":
        request = f"Hi, how much did I pay in total for {order_ref}?"
        actions = [find, get_order]
        communicate = [f"{order['payment_history'][0]['amount']:.2f}"]
    elif kind == "cancel":
        reason = rng.choice(sorted(REASON_PHRASES))
        if withhold:  # here the withheld detail is the reason, not the order
            details = {"reason": reason}
            request = f"I want to cancel my order {oid}."
        else:
            request = f"I want to cancel my order {oid} because {REASON_PHRASES[reason]}."
        actions = [find, get_order, _action("cancel_pending_order", order_id=oid, reason=reason)]
    elif kind == "modify_order_address":
        new = random_address(rng)
        request = f"Please ship {order_ref} to {address_text(new)} instead."
        actions = [find, get_order, _action("modify_pending_order_address", order_id=oid, **new)]
    elif kind == "modify_user_address":
        new = random_address(rng)
        details = {}
        request = f"I moved. Please change my default address to {address_text(new)}."
        actions = [find, get_user, _action("modify_user_address", user_id=user_id, **new)]
    elif kind == "modify_payment":
        if len(order["payment_history"]) != 1:
            return None
        current = order["payment_history"][0]
        pm = _pay_choice(rng, user, current["amount"], exclude=current["payment_method_id"])
        if pm is None:
            return None
        request = f"For {order_ref}, I'd like to pay with my {describe_payment(pm)} instead."
        actions = [find, get_user, get_order,
                   _action("modify_pending_order_payment", order_id=oid, payment_method_id=pm["id"])]
    elif kind in ("modify_items", "exchange"):
        pairs = [(item, alt) for item in order["items"] if (alt := _alternative(rng, db, item))]
        if not pairs:
            return None
        rng.shuffle(pairs)
        pairs = pairs[: 2 if kind == "modify_items" and len(pairs) > 1 and rng.random() < 0.3 else 1]
        diff = sum(alt["price"] - item["price"] for item, alt in pairs)
        pm = _pay_choice(rng, user, diff)
        if pm is None:
            return None
        wishes = " and ".join(f"the {item['name']} ({options_text(item['options'])}) for the one with "
                              f"{options_text(alt['options'])}" for item, alt in pairs)
        verb = "change" if kind == "modify_items" else "exchange"
        request = (f"In {order_ref}, I want to {verb} {wishes}. Please use my {describe_payment(pm)} for the price "
                   "difference.")
        tool = "modify_pending_order_items" if kind == "modify_items" else "exchange_delivered_order_items"
        actions = [find, get_order] + [_action("get_product_details", product_id=item["product_id"])
                                       for item, _ in pairs]
        actions.append(_action(tool, order_id=oid, item_ids=[i["item_id"] for i, _ in pairs],
                               new_item_ids=[a["item_id"] for _, a in pairs], payment_method_id=pm["id"]))
    elif kind == "return":
        items = rng.sample(order["items"], rng.randint(1, len(order["items"])))
        original = order["payment_history"][0]["payment_method_id"]
        gift = [p for p in user["payment_methods"].values() if p["source"] == "gift_card"]
        pm = gift[0] if gift and rng.random() < 0.5 else user["payment_methods"][original]
        where = "the original payment method" if pm["id"] == original else f"my {describe_payment(pm)}"
        names = " and ".join(f"the {i['name']} ({options_text(i['options'])})" for i in items)
        request = f"I want to return {names} from {order_ref}. Please refund {where}."
        actions = [find, get_order, _action("return_delivered_order_items", order_id=oid,
                                            item_ids=[i["item_id"] for i in items], payment_method_id=pm["id"])]
    else:
        raise ValueError(f"unknown task kind {kind!r}")

    difficulty = min(5, BASE_DIFFICULTY[kind] + (0 if by_email else 1) + (1 if details else 0))
    known = f"You are {first} {last}, zip code {user['address']['zip']}, email {user['email']}."
    return {
        "description": {"purpose": kind, "relevant_policies": None, "notes": f"difficulty {difficulty}"},
        "user_scenario": {"persona": None, "instructions": {
            "task_instructions": "Answer the agent's questions briefly; confirm with 'yes' when asked.",
            "domain": "retail", "reason_for_call": request, "known_info": known,
            "unknown_info": None if by_email else "You do not remember your email address."}},
        "initial_state": None,
        "evaluation_criteria": {"actions": actions, "communicate_info": communicate, "nl_assertions": None,
                                "reward_basis": ["DB", "COMMUNICATE"]},
        "scenario": {"request": request, "auth": auth, "details": details, "confirm": "yes", "max_turns": 10},
        "difficulty": difficulty,
    }


def _split_users(db: dict, world_seed: int) -> dict[str, list[str]]:
    """Users partitioned into train (75%) and test (25%): tasks of the two splits never share a user."""
    ids = sorted(db["users"])
    random.Random(f"retail-split:{world_seed}").shuffle(ids)
    n_test = max(1, len(ids) // 4)
    return {"test": sorted(ids[:n_test]), "train": sorted(ids[n_test:])}


def generate_tasks(db: dict, world_seed: int, split: str, n: int, seed: int = 0, kinds: list[str] | None = None,
                   auth: str = "any") -> list[dict]:
    """``n`` distinct mini tasks of ``split`` (tau2 schema + ``scenario``), deterministic in every argument.

    Task ``i`` depends on (world_seed, split, seed, i) and the tasks before it only through de-duplication.
    ``kinds``: the task kinds to draw from (default: all of ``KINDS``); ``auth``: see ``make_task``.
    """
    kinds = list(kinds or KINDS)
    users = _split_users(db, world_seed)[split]
    out, seen = [], set()
    for i in range(n):
        rng = random.Random(f"retail-task:{world_seed}:{split}:{seed}:{i}")
        task = None
        for _ in range(200):
            cand = make_task(db, rng.choice(users), rng.choice(kinds), rng, auth)
            if cand is None:
                continue
            key = json.dumps([cand["scenario"], cand["evaluation_criteria"]["actions"]], sort_keys=True)
            if key not in seen:
                seen.add(key)
                task = cand
                break
        if task is None:  # the split is exhausted: keep going with repeats rather than return fewer
            while task is None:
                task = make_task(db, rng.choice(users), rng.choice(kinds), rng, auth)
        tid = f"mini{world_seed}-{split}-{seed}-{i}"
        task["id"] = tid
        for j, a in enumerate(task["evaluation_criteria"]["actions"]):
            a["action_id"] = f"{tid}_{j}"
            a["info"] = None
        out.append(task)
    return out


# --- environment ----------------------------------------------------------------------------------


def to_task(t: dict, benchmark: str | None, system_prompt: str, world_seed: int | None, source: str,
            tools: list[dict]) -> Task:
    """Our ``Task`` from a tau2 task dict. The verifier's data go to ``answer``, the rest to ``meta``;
    ``tools`` are the schemas the agent sees (``retail_db.tool_schemas``)."""
    criteria = t.get("evaluation_criteria") or {}
    scenario = t.get("scenario")
    instructions = (t.get("user_scenario") or {}).get("instructions") or {}
    if scenario:
        user_prompt = RuleUser(scenario).first_message()
    else:  # paper tasks: what the LLM user simulator would be told (it is not the user's first line)
        user_prompt = instructions.get("reason_for_call", "") if isinstance(instructions, dict) else str(instructions)
    return Task(
        id=f"retail-{t['id']}" if source == "tau2" else str(t["id"]),
        domain="retail",
        benchmark=benchmark or "retail",
        system_prompt=system_prompt,
        user_prompt=user_prompt,
        tools=tools,
        answer={"actions": criteria.get("actions") or [], "communicate_info": criteria.get("communicate_info") or [],
                "reward_basis": criteria.get("reward_basis"), "scenario": scenario},
        meta={"source": source, "world_seed": world_seed, "tau2_id": t["id"],
              "kind": (t.get("description") or {}).get("purpose"), "difficulty": t.get("difficulty"),
              "user_scenario": t.get("user_scenario")},
    )


class RetailEnv(Environment):
    """The retail desk: mini worlds by default, the tau2 retail data when ``worlds.data_dir`` is set."""

    name = "retail"
    splits: dict[str, str | None] = {"train": None, "test": "retail"}

    def __init__(self, worlds: WorldsConfig | None = None, seed: int = 0):
        self.worlds = worlds or WorldsConfig()
        self.seed = seed
        self._worlds: dict[int, dict] = {}  # world seed -> db dict (mini) ; -1 -> the real db (paper)
        self._dbs: dict[int, RetailDB] = {}  # same keys: each world validated once; episodes get forks of it
        self._gold: dict[str, dict] = {}  # (world, gold actions) -> gold_state
        self.data_dir = self.worlds.data_dir
        if self.data_dir:
            root = Path(self.data_dir) / "retail"
            for f in ("db.json", "tasks.json", "split_tasks.json", "policy.md"):
                if not (root / f).is_file():
                    raise ConfigError(f"worlds.data_dir={self.data_dir!r}: missing {root / f} (tau2 retail layout)")
            self._worlds[-1] = json.loads((root / "db.json").read_text())
            self._paper_tasks = {t["id"]: t for t in json.loads((root / "tasks.json").read_text())}
            self._paper_splits = json.loads((root / "split_tasks.json").read_text())
            self.policy = (root / "policy.md").read_text()
        else:
            self.policy = MINI_POLICY
        # Same signatures at both scales; the mini worlds' small models get the short descriptions.
        self.tool_schemas = tool_schemas(compact=not self.data_dir)

    def _world_key(self, world_seed: int | None) -> int:
        return -1 if self.data_dir else (self.seed if world_seed is None else int(world_seed))

    def world(self, world_seed: int | None = None) -> dict:
        """The database dict (tau2 schema) of a world: the real one in the paper profile."""
        key = self._world_key(world_seed)
        if key not in self._worlds:
            self._worlds[key] = generate_world(key, n_users=tuple(self.worlds.retail_users))
        return self._worlds[key]

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        if split not in self.splits:
            raise ValueError(f"retail has splits {sorted(self.splits)}, got {split!r}")
        bench = self.splits[split]
        if self.data_dir:
            ids = list(self._paper_splits[split])
            if n < len(ids):  # a seeded sample, kept in the split file's order
                chosen = set(random.Random(f"retail-paper:{split}:{seed}").sample(ids, n))
                ids = [i for i in ids if i in chosen]
            return [to_task(self._paper_tasks[i], bench, self.policy, None, "tau2", self.tool_schemas) for i in ids]
        raw = generate_tasks(self.world(), self.seed, split, n, seed, kinds=self.worlds.retail_kinds,
                             auth=self.worlds.retail_auth)
        return [to_task(t, bench, self.policy, self.seed, "mini", self.tool_schemas) for t in raw]

    def start(self, task: Task, max_turns: int = 16) -> DeskEpisode:
        scenario = (task.answer or {}).get("scenario")
        if not scenario:  # a real tau2 task: its customer is the LLM user simulator (fails fast if none is set)
            llm_user.simulator_for(self.worlds.user_sim)
        seed = (task.meta or {}).get("world_seed")
        wkey = self._world_key(seed)
        if wkey not in self._dbs:
            self._dbs[wkey] = RetailDB.load(self.world(seed))
        key = json.dumps([seed, task.answer.get("actions")], sort_keys=True)
        if key not in self._gold:  # the gold end state of a task is computed once per environment
            self._gold[key] = gold_state(self._dbs[wkey], task.answer.get("actions") or [])
        desk = RetailDesk(self._dbs[wkey], self._gold[key])
        if not scenario:
            return llm_user.start_episode(task, desk, self.worlds.user_sim, max_turns=max_turns)
        return DeskEpisode(task, desk, max_turns=max_turns)


def gold_state(world: dict | RetailDB, actions: list[dict]) -> dict:
    """The records the gold ``actions`` touch, after replaying them on a fresh copy of ``world`` (a db dict, or a
    validated ``RetailDB``, forked): ``{"orders": {order_id: record}, "users": {user_id: record}}`` (tau2 JSON
    records)."""
    db = world.fork() if isinstance(world, RetailDB) else RetailDB.load(world)
    tools, _ = run_actions(db, actions)
    return {"orders": {i: record(tools.db.orders[i]) for i in sorted(tools.touched_orders)},
            "users": {i: record(tools.db.users[i]) for i in sorted(tools.touched_users)}}


class RetailDesk(Desk):
    """Retail's part of a desk episode (``desk.DeskEpisode``): the agent's tools act on the episode's own
    copy of the world database; the score compares the records a write touched with ``gold``."""

    def __init__(self, world: dict | RetailDB, gold: dict):
        self.world = world  # shared, never mutated: a db dict, or a validated RetailDB that episodes fork
        self.gold = gold  # gold_state(world, the task's gold actions)

    def new_toolkit(self, task: Task) -> RetailTools:
        if isinstance(self.world, RetailDB):
            return RetailTools(self.world.fork())
        return RetailTools(RetailDB.load(self.world))

    def _original(self, kind: str, i: str) -> dict:
        if isinstance(self.world, RetailDB):
            return record(getattr(self.world, kind)[i])
        return self.world[kind][i]

    def check(self, episode: DeskEpisode) -> str | None:
        tools = episode.toolkit
        why = []
        for kind in ("orders", "users"):
            # only records a write touched can differ: compare those, gold-touched or agent-touched
            gold, mine = self.gold[kind], getattr(tools.db, kind)
            ids = sorted(set(gold) | getattr(tools, f"touched_{kind}"))
            bad = [i for i in ids if record(mine[i]) != (gold[i] if i in gold else self._original(kind, i))]
            if bad:
                why.append(f"database differs from gold: {kind} {', '.join(bad)} differ")
        said = [m["content"].lower().replace(",", "") for m in episode.messages
                if m["role"] == "assistant" and isinstance(m.get("content"), str) and m["content"]]
        for info in episode.task.answer.get("communicate_info") or []:
            if not any(str(info).lower() in s for s in said):
                why.append(f"did not communicate {info!r}")
        return "; ".join(why) or None


# --- scripted expert ------------------------------------------------------------------------------


def _confirm_text(action: dict) -> str:
    a = action["arguments"]
    name = action["name"]
    if name == "cancel_pending_order":
        what = f"cancel order {a['order_id']} (reason: {a['reason']})"
    elif name == "modify_pending_order_address":
        what = f"change the shipping address of order {a['order_id']} to {address_text(a)}"
    elif name == "modify_user_address":
        what = f"change your default address to {address_text(a)}"
    elif name == "modify_pending_order_payment":
        what = f"pay order {a['order_id']} with {a['payment_method_id']} instead"
    elif name == "return_delivered_order_items":
        what = (f"return items {', '.join(a['item_ids'])} of order {a['order_id']} with the refund to "
                f"{a['payment_method_id']}")
    else:  # modify items / exchange
        verb = "modify" if name == "modify_pending_order_items" else "exchange"
        what = (f"{verb} items {', '.join(a['item_ids'])} of order {a['order_id']} to {', '.join(a['new_item_ids'])}, "
                f"with the price difference on {a['payment_method_id']}")
    return f"I will {what}. Do you confirm (yes/no)?"


def _closing_text(task: Task) -> str:
    answer = task.answer or {}
    actions = answer.get("actions") or []
    info = answer.get("communicate_info") or []
    oid = next((a["arguments"].get("order_id") for a in actions if "order_id" in a["arguments"]), "")
    kind = (task.meta or {}).get("kind")
    if kind == "order_status" and info:
        return f"The status of your order {oid} is: {info[0]}. {CLOSING}"
    if kind == "order_total" and info:
        return f"The total you paid for order {oid} is ${info[0]}. {CLOSING}"
    if info:
        return f"Here is what you asked for: {', '.join(map(str, info))}. {CLOSING}"
    return f"Your request has been completed. {CLOSING}"


def expert_plan(task: Task) -> list[str]:
    """The expert's assistant turns for a mini task, in order (one tool call or one message each)."""
    answer = task.answer or {}
    actions = answer.get("actions") or []
    details = ((answer.get("scenario") or {}).get("details")) or {}
    turns = [AUTH_QUESTION]
    if actions:
        turns.append(format_tool_call(actions[0]["name"], actions[0]["arguments"]))
    turns += [ask_detail(key) for key in details]
    rest = actions[1:]
    first_write = next((i for i, a in enumerate(rest) if a["name"] in WRITE_TOOLS), len(rest))
    turns += [format_tool_call(a["name"], a["arguments"]) for a in rest[:first_write]]
    for a in rest[first_write:]:
        if a["name"] in WRITE_TOOLS:
            turns.append(_confirm_text(a))
        turns.append(format_tool_call(a["name"], a["arguments"]))
    turns.append(_closing_text(task))
    return turns


def scripted_expert(task: Task, messages: list[dict]) -> str:
    """The next assistant turn of the expert: the ``k``-th turn of ``expert_plan`` after ``k`` assistant turns.

    It authenticates, asks for withheld details, makes the gold look-ups, asks for confirmation before
    each write, makes the write, then says the requested information and asks whether anything else is
    needed (the simulated user then ends the conversation).
    """
    plan = expert_plan(task)
    return planned_turn(plan, messages, after=plan[-1])


# --- gold replay CLI ------------------------------------------------------------------------------


def replay_cli(args: argparse.Namespace) -> int:
    """``acl env retail replay --db DB --tasks TASKS --out OUT.jsonl``: one replay record per task.

    Each line: ``{"id", "failing_actions", "errors", "orders", "users"}`` (see ``retail_db.replay``); every
    task is replayed on a fresh copy of the database. Every task gets its line, in task order, whatever its
    actions hold; the file is written whole (temp file + rename). Returns 0; 1 when a task could not be
    replayed at all (its line has an ``"error"``); 2, with a message and no output, when the database or the
    tasks file cannot be read or ``--out`` cannot be written.
    """
    from tqdm.auto import tqdm

    def usage(msg: str) -> int:
        print(f"acl env retail replay: error: {msg}", file=sys.stderr)
        return 2

    data = {}
    for what, path in (("--db", args.db), ("--tasks", args.tasks)):
        try:
            data[what] = json.loads(Path(path).read_text())
        except FileNotFoundError:
            return usage(f"{what} {path}: no such file")
        except (OSError, UnicodeDecodeError) as exc:
            return usage(f"{what} {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})")
        except ValueError as exc:
            return usage(f"{what} {path}: not valid JSON ({exc})")
    db, tasks = data["--db"], data["--tasks"]
    if not isinstance(tasks, list):
        return usage(f"--tasks {args.tasks}: expected a JSON list of tasks, got {type(tasks).__name__}")
    try:
        RetailDB.load(db)
    except Exception as exc:  # pydantic's error, cut to its first problem
        errors = exc.errors() if hasattr(exc, "errors") else []
        if errors:
            where = ".".join(str(p) for p in errors[0]["loc"]) or "top level"
            why = f"{where}: {errors[0]['msg']}" + (f"; {len(errors) - 1} more problem(s)" if len(errors) > 1 else "")
        else:
            why = f"{type(exc).__name__}: {str(exc)[:200]}"
        return usage(f"--db {args.db}: not a tau2 retail database ({why})")
    out = Path(args.out)
    for d in (out.parent, *out.parent.parents):
        if d.exists():
            if not d.is_dir():
                return usage(f"--out {out}: {d} is a file, not a directory")
            break
    if out.is_dir():
        return usage(f"--out {out}: a directory, not a file")

    lines, broken = [], 0
    for t in tqdm(tasks, desc="retail replay", disable=not sys.stderr.isatty()):
        try:
            rec = replay(db, t)
        except Exception as exc:  # one broken task never costs the others their lines
            rec = {"id": t.get("id") if isinstance(t, dict) else None, "failing_actions": [], "errors": {},
                   "orders": {}, "users": {}, "error": f"{type(exc).__name__}: {exc}"}
        broken += "error" in rec
        lines.append(json.dumps(rec) + "\n")
    try:
        atomic_write_text(out, "".join(lines))
    except OSError as exc:
        return usage(f"--out {out}: cannot write it ({exc.strerror or exc})")
    if broken:
        print(f"acl env retail replay: {broken} of {len(tasks)} task(s) could not be replayed; their lines in {out} "
              f"say why (\"error\")", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m acl_lib.envs.retail", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rp = sub.add_parser("replay", help="replay every task's gold actions on a fresh copy of the database")
    rp.add_argument("--db", required=True, help="tau2 retail db.json")
    rp.add_argument("--tasks", required=True, help="tau2 retail tasks.json")
    rp.add_argument("--out", required=True, help="output .jsonl, one record per task")
    args = parser.parse_args(argv)
    return replay_cli(args)


if __name__ == "__main__":
    sys.exit(main())
