"""A telecom-like troubleshooting desk (OOD benchmark ``telecom``), generated from the world seed.

A customer reports a problem with a mobile line; the agent identifies the line by its phone number,
diagnoses it with read tools and fixes it with write tools under a short policy. Each task carries its
own small database (2-3 customers, 1-2 lines each)::

    customers: {customer_id: {customer_id, name, line_ids, payment_method}}
    lines:     {line_id: {line_id, customer_id, phone_number, plan_id, status: active|suspended,
                          roaming_enabled, apn, area, data_used_gb, data_refuelled_gb}}
    plans:     {plan_id: {plan_id, name, data_limit_gb, monthly_price, refuel_price_per_gb}}
    bills:     {bill_id: {bill_id, customer_id, amount, status: paid|pending|overdue, description}}
    outages:   {area: {area, issue, expected_fix}}

Problems (task kinds) and their fixes: no data abroad -> ``enable_roaming``; no data at home with data
left -> ``reset_apn``; data used up -> ``refuel_data`` (price = GB x the plan's price per GB, told to
the user); slow data -> an outage in the line's area, whose expected fix time must be told, nothing
changed; suspended line -> ``pay_bill`` every overdue bill, then ``resume_line`` (total told); number
porting -> ``transfer_to_human_agents``.

Reward (1.0 or 0.0): the final database equals the gold-action replay AND every ``communicate_info``
string was said by the agent (AND, for the transfer task, the transfer was made). A do-nothing agent
scores 0 on every kind: each task either changes the database or has information to communicate.
Episodes, gold replay and scoring are the generic desk of ``desk.py`` (``DeskEpisode`` with
``ReplayDesk(TelecomTools)``); this module holds the telecom database, tools, tasks, policy and expert.

The paper profile (``worlds.data_dir`` set) plays tau2-bench's real telecom tasks instead (``TelecomEnv.real``:
``tau2_telecom.py`` and the customer's phone in ``tau2_phone.py``).
"""

from __future__ import annotations

import copy
import logging
import random
from pathlib import Path

from acl_lib.chat import format_tool_call
from acl_lib.config import UserSimConfig
from acl_lib.envs.base import Environment, Task, ToolError, function_schema
from acl_lib.envs.desk import (
    CLOSING,
    TRANSFER_SCHEMA,
    DeskEpisode,
    ReplayDesk,
    Toolkit,
    ask_auth,
    ask_detail,
    compact_schemas,
    planned_turn,
    replay_actions,
)
from acl_lib.envs.tau2_telecom import Tau2Telecom, expert_plan

log = logging.getLogger(__name__)

DEFAULT_APN = "internet"
MAX_REFUEL_GB = 2.0

_LINE = {"line_id": {"type": "string", "description": "The line id, e.g. L2001."}}

TELECOM_TOOLS = [
    function_schema(
        "get_customer_by_phone",
        "Find the customer owning a phone number. Returns the customer and the matching line id.",
        {"phone_number": {"type": "string", "description": "The phone number, e.g. 555-1234."}},
    ),
    function_schema("get_line_details", "Status, plan, roaming, APN and area of a line.", dict(_LINE)),
    function_schema("get_data_usage", "Data used, data limit (plan + refuels) and data left, in GB.", dict(_LINE)),
    function_schema(
        "check_network_status",
        "Known network outages in an area.",
        {"area": {"type": "string", "description": "The area name, as in the line details."}},
    ),
    function_schema(
        "get_bills", "All bills of a customer.", {"customer_id": {"type": "string", "description": "The customer id."}}
    ),
    function_schema("enable_roaming", "Turn on roaming for a line.", dict(_LINE)),
    function_schema("reset_apn", "Reset a line's APN to the default settings.", dict(_LINE)),
    function_schema(
        "refuel_data",
        "Add data to a line whose data is used up; charged at the plan's price per GB (a new pending bill).",
        {**_LINE, "gb": {"type": "number", "description": "GB to add, more than 0 and at most 2."}},
    ),
    function_schema(
        "pay_bill",
        "Pay a pending or overdue bill with the customer's payment method on file.",
        {"bill_id": {"type": "string", "description": "The bill id, e.g. B3001."}},
    ),
    function_schema("resume_line", "Resume a suspended line (no overdue bills may remain).", dict(_LINE)),
    TRANSFER_SCHEMA,
]


# The mini worlds' short form of the same signatures (``compact_schemas``): each line also says which
# problem a fix is for, so that ``COMPACT_SYSTEM_PROMPT`` need not repeat it.
COMPACT_DESCRIPTIONS: dict[str, str] = {
    "get_customer_by_phone": "Customer and line id of a phone number.",
    "get_line_details": "Line status, plan, roaming, APN, area.",
    "get_data_usage": "Data used and left, in GB.",
    "check_network_status": "Outages in an area (for slow data).",
    "get_bills": "A customer's bills.",
    "enable_roaming": "Turn on roaming (for no data abroad).",
    "reset_apn": f"Reset APN to '{DEFAULT_APN}' (for no data at home, data left).",
    "refuel_data": f"Add gb (at most {MAX_REFUEL_GB:g}) to a used-up line, at the plan's price per GB.",
    "pay_bill": "Pay a bill.",
    "resume_line": "Resume a suspended line (pay overdue bills first).",
    "transfer_to_human_agents": "Hand over to a human (e.g. number porting), with a summary.",
}
TELECOM_TOOLS_COMPACT = compact_schemas(TELECOM_TOOLS, COMPACT_DESCRIPTIONS)


class TelecomTools(Toolkit):
    """The telecom desk's tools over its database."""

    TOOLS = TELECOM_TOOLS

    def _line(self, line_id: str) -> dict:
        if line_id not in self.db["lines"]:
            raise ToolError(f"Line {line_id} not found")
        return self.db["lines"][line_id]

    def _usage(self, line: dict) -> dict:
        plan = self.db["plans"][line["plan_id"]]
        limit = round(plan["data_limit_gb"] + line["data_refuelled_gb"], 2)
        return {"line_id": line["line_id"], "used_gb": line["data_used_gb"], "limit_gb": limit,
                "remaining_gb": round(max(0.0, limit - line["data_used_gb"]), 2)}

    # read tools
    def get_customer_by_phone(self, phone_number: str) -> dict:
        for line in self.db["lines"].values():
            if line["phone_number"] == phone_number.strip():
                return {**self.db["customers"][line["customer_id"]], "matched_line_id": line["line_id"]}
        raise ToolError(f"No customer with phone number {phone_number}")

    def get_line_details(self, line_id: str) -> dict:
        line = self._line(line_id)
        return {**line, "plan_name": self.db["plans"][line["plan_id"]]["name"]}

    def get_data_usage(self, line_id: str) -> dict:
        return self._usage(self._line(line_id))

    def check_network_status(self, area: str) -> dict:
        for name, outage in self.db["outages"].items():
            if name.lower() == area.strip().lower():
                return {"area": name, "status": "outage", **{k: outage[k] for k in ("issue", "expected_fix")}}
        return {"area": area, "status": "normal", "issue": None}

    def get_bills(self, customer_id: str) -> list[dict]:
        if customer_id not in self.db["customers"]:
            raise ToolError(f"Customer {customer_id} not found")
        return [b for b in self.db["bills"].values() if b["customer_id"] == customer_id]

    # write tools
    def enable_roaming(self, line_id: str) -> str:
        line = self._line(line_id)
        if line["status"] != "active":
            raise ToolError(f"Line {line_id} is {line['status']}")
        if line["roaming_enabled"]:
            raise ToolError(f"Roaming is already enabled on {line_id}")
        line["roaming_enabled"] = True
        return f"Roaming enabled on {line_id}"

    def reset_apn(self, line_id: str) -> str:
        line = self._line(line_id)
        if line["apn"] == DEFAULT_APN:
            raise ToolError(f"The APN of {line_id} is already the default '{DEFAULT_APN}'")
        line["apn"] = DEFAULT_APN
        return f"APN of {line_id} reset to '{DEFAULT_APN}'"

    def refuel_data(self, line_id: str, gb: float) -> dict:
        line = self._line(line_id)
        if line["status"] != "active":
            raise ToolError(f"Line {line_id} is {line['status']}")
        if not 0 < gb <= MAX_REFUEL_GB:
            raise ToolError(f"gb must be more than 0 and at most {MAX_REFUEL_GB}")
        left = self._usage(line)["remaining_gb"]
        if left > 0:
            raise ToolError(f"Data is not used up on {line_id}: {left} GB left")
        price = round(gb * self.db["plans"][line["plan_id"]]["refuel_price_per_gb"], 2)
        line["data_refuelled_gb"] = round(line["data_refuelled_gb"] + gb, 2)
        bill_id = f"B{3001 + len(self.db['bills'])}"
        self.db["bills"][bill_id] = {"bill_id": bill_id, "customer_id": line["customer_id"], "amount": price,
                                     "status": "pending", "description": f"Data refuel {gb:g} GB"}
        return {"line_id": line_id, "added_gb": gb, "charged": price, "bill_id": bill_id}

    def pay_bill(self, bill_id: str) -> dict:
        if bill_id not in self.db["bills"]:
            raise ToolError(f"Bill {bill_id} not found")
        bill = self.db["bills"][bill_id]
        if bill["status"] == "paid":
            raise ToolError(f"Bill {bill_id} is already paid")
        bill["status"] = "paid"
        return bill

    def resume_line(self, line_id: str) -> str:
        line = self._line(line_id)
        if line["status"] != "suspended":
            raise ToolError(f"Line {line_id} is not suspended")
        overdue = [b["bill_id"] for b in self.db["bills"].values()
                   if b["customer_id"] == line["customer_id"] and b["status"] == "overdue"]
        if overdue:
            raise ToolError(f"Overdue bills must be paid first: {', '.join(overdue)}")
        line["status"] = "active"
        return f"Line {line_id} resumed"


TELECOM_DESK = ReplayDesk(TelecomTools)


# (A backslash at a line's end continues the line: the policy's text has no line break there.)
POLICY = f"""# Mobile support policy
1. Identify the customer by the phone number of the line first.
2. Before any change or charge, say what you will do (and the price) and get an explicit yes.
3. No data abroad: enable roaming if it is off.
4. No data at home while data is left: reset the APN if it is not "{DEFAULT_APN}".
5. Data used up: refuel at most {MAX_REFUEL_GB:g} GB at a time, at the plan's price per GB; tell the price.
6. Slow data: check the network status of the line's area; if there is an outage, tell the expected fix time and \
change nothing.
7. A suspended line is resumed only after every overdue bill is paid; tell the amount paid.
8. Anything else (porting a number, contracts, refunds): transfer to a human agent."""

SYSTEM_PROMPT = (
    "You are a support agent of a mobile network. Help the customer with the tools, following the policy. "
    "Ask the customer for what you need; when the problem is solved, tell the customer.\n\n" + POLICY
)

# The mini worlds' system prompt: the policy's rules 3-8 are in COMPACT_DESCRIPTIONS.
COMPACT_SYSTEM_PROMPT = (
    "You are a mobile support agent. Identify the customer by phone number first. Before a change or charge, "
    "state it and its price and get a yes. Tell any price, fix time or amount paid."
)

# --- generator ------------------------------------------------------------------------------------

FIRST = ["Alba", "Bo", "Cyd", "Dara", "Emre", "Fenna", "Gil", "Hugo", "Iris", "Jon", "Kira", "Luis",
         "Maya", "Nils", "Olga", "Pavel", "Rhea", "Sven", "Tess", "Uma"]
LAST = ["Abe", "Brandt", "Costa", "Dunn", "Engel", "Fox", "Gray", "Holm", "Ivers", "Jones", "Kato", "Lowe",
        "Marsh", "Noor", "Olsen", "Pratt"]
AREAS = ["Northgate", "Riverside", "Oldtown", "Hillcrest", "Harbor", "Westfield", "Lakeview", "Eastbrook",
         "Maple Park", "Stonebridge", "Southend", "Cedar Hill"]
PLANS = [("P-basic", "Basic 5", 5, 15.0, 4.0), ("P-plus", "Plus 10", 10, 25.0, 3.0),
         ("P-max", "Max 20", 20, 40.0, 2.5)]
ISSUES = ["a damaged fiber link", "tower maintenance", "a power cut at a cell site"]
FIX_TIMES = ["18:00 today", "09:00 tomorrow", "noon tomorrow", "21:30 today"]
BAD_APNS = ["wap.old", "mms", "internet.test"]

TELECOM_KINDS = ["roaming", "apn", "refuel", "outage", "suspended", "port"]

REQUESTS = {
    "roaming": "I'm travelling abroad and my phone has no mobile data.",
    "apn": "I have no mobile data at home, though I should still have data left.",
    "refuel": "My mobile data has run out.",
    "outage": "My mobile data has been very slow since this morning.",
    "suspended": "My phone line has stopped working completely.",
    "port": "I want to move my phone number to another carrier.",
}


def _half(pool: list, split: str) -> list:
    """Test and train draw from disjoint halves of each pool, so their tasks never coincide."""
    return pool[1::2] if split == "test" else pool[0::2]


def _gen_db(rng: random.Random, split: str) -> dict:
    names = rng.sample([f"{f} {last}" for f in _half(FIRST, split) for last in _half(LAST, split)], rng.randint(2, 3))
    areas = _half(AREAS, split)
    phones = rng.sample(range(1000, 10000), 8)
    db: dict = {"customers": {}, "lines": {}, "bills": {}, "outages": {},
                "plans": {p: {"plan_id": p, "name": n, "data_limit_gb": lim, "monthly_price": mp,
                              "refuel_price_per_gb": rp} for p, n, lim, mp, rp in PLANS}}
    for ci, name in enumerate(names):
        cid = f"C{1001 + ci}"
        db["customers"][cid] = {"customer_id": cid, "name": name, "line_ids": [],
                                "payment_method": f"card ending {rng.randint(1000, 9999)}"}
        for _ in range(rng.randint(1, 2)):
            lid = f"L{2001 + len(db['lines'])}"
            plan = rng.choice(PLANS)
            db["lines"][lid] = {"line_id": lid, "customer_id": cid, "phone_number": f"555-{phones[len(db['lines'])]}",
                                "plan_id": plan[0], "status": "active", "roaming_enabled": rng.random() < 0.5,
                                "apn": DEFAULT_APN, "area": rng.choice(areas),
                                "data_used_gb": round(rng.uniform(0.1, plan[2] * 0.9), 1), "data_refuelled_gb": 0.0}
            db["customers"][cid]["line_ids"].append(lid)
        for m in range(rng.randint(1, 2)):  # past, paid monthly bills
            bid = f"B{3001 + len(db['bills'])}"
            db["bills"][bid] = {"bill_id": bid, "customer_id": cid, "amount": 25.0 + 5 * m, "status": "paid",
                                "description": f"Monthly bill {m + 1}"}
    for area in rng.sample(areas, 2):  # outages somewhere (maybe not where the customer is)
        db["outages"][area] = {"area": area, "issue": rng.choice(ISSUES), "expected_fix": rng.choice(FIX_TIMES)}
    return db


def _gen_task(rng: random.Random, kind: str, split: str) -> tuple[dict, list[dict], list[str], dict, dict]:
    """One task: (db, gold actions, communicate_info, scenario details, meta)."""
    db = _gen_db(rng, split)
    lid = rng.choice(sorted(db["lines"]))
    line = db["lines"][lid]
    cid = line["customer_id"]
    plan = db["plans"][line["plan_id"]]
    # the target line shows exactly one problem: the one the kind is about
    line["roaming_enabled"] = kind != "roaming" and line["roaming_enabled"]
    quiet = [a for a in _half(AREAS, split) if a not in db["outages"]]
    if kind == "outage":
        line["area"] = rng.choice(sorted(db["outages"]))
    else:
        line["area"] = rng.choice(quiet)
    details, info, actions = {}, [], []
    if kind == "roaming":
        actions = [{"name": "enable_roaming", "arguments": {"line_id": lid}}]
    elif kind == "apn":
        line["apn"] = rng.choice(BAD_APNS)
        actions = [{"name": "reset_apn", "arguments": {"line_id": lid}}]
    elif kind == "refuel":
        line["data_used_gb"] = float(plan["data_limit_gb"])
        gb = rng.choice([0.5, 1.0, 1.5, 2.0])
        details = {"gb": f"{gb:g} GB please."}
        actions = [{"name": "refuel_data", "arguments": {"line_id": lid, "gb": gb}}]
        info = [f"${gb * plan['refuel_price_per_gb']:.2f}"]
    elif kind == "outage":
        info = [db["outages"][line["area"]]["expected_fix"]]
    elif kind == "suspended":
        line["status"] = "suspended"
        total = 0.0
        for _ in range(rng.randint(1, 2)):
            bid = f"B{3001 + len(db['bills'])}"
            amount = float(rng.choice([19.0, 25.0, 32.5, 40.0]))
            db["bills"][bid] = {"bill_id": bid, "customer_id": cid, "amount": amount, "status": "overdue",
                                "description": "Monthly bill (overdue)"}
            actions.append({"name": "pay_bill", "arguments": {"bill_id": bid}})
            total += amount
        actions.append({"name": "resume_line", "arguments": {"line_id": lid}})
        info = [f"${total:.2f}"]
    elif kind == "port":
        actions = [{"name": "transfer_to_human_agents",
                    "arguments": {"summary": f"Customer {cid} wants to port {line['phone_number']} to another "
                                             "carrier."},
                    "compare_args": []}]
    else:
        raise ValueError(f"unknown telecom task kind {kind!r}")
    return db, actions, info, details, {"kind": kind, "line_id": lid, "customer_id": cid}


# --- environment ----------------------------------------------------------------------------------


class TelecomEnv(Environment):
    """The telecom troubleshooting desk (OOD).

    Mini worlds (``worlds.data_dir`` empty): the generated desk of this module, showing the agent
    ``COMPACT_SYSTEM_PROMPT`` and ``TELECOM_TOOLS_COMPACT`` (``full_prompt=True``: the full ``SYSTEM_PROMPT`` and
    ``TELECOM_TOOLS``, the same tools, tasks and rewards). The paper profile (``worlds.data_dir`` set): tau2-bench's
    real telecom domain from ``<data_dir>/telecom`` (``tau2_telecom.py``: the carrier's database and the agent's 13
    tools, the customer's phone and its tools, played by the LLM user simulator ``worlds.user_sim``).
    """

    name = "telecom"
    # The most tasks a split is drawn with. The generator knows six problems, each solved by one fixed plan; past
    # 100 tasks per problem a larger set repeats them with other names and numbers, which adds compute (a million
    # episodes for ``worlds.n_ood: 1000000``) and no information: a pass rate on 600 tasks is +-2 points at most.
    MAX_TASKS = 600

    def __init__(self, worlds=None, seed: int = 0, full_prompt: bool = False):
        self.worlds = worlds
        self.seed = seed
        self.splits: dict[str, str | None] = {"test": "telecom", "train": None}
        self.data_dir = str(getattr(worlds, "data_dir", "") or "")
        self._real = None  # the tau2 data, read at the first use (a run that scores no telecom never needs it)
        self.system_prompt = SYSTEM_PROMPT if full_prompt else COMPACT_SYSTEM_PROMPT
        self.tool_schemas = TELECOM_TOOLS if full_prompt else TELECOM_TOOLS_COMPACT

    @property
    def real(self):
        """The real tau2 telecom data (``tau2_telecom.Tau2Telecom``) under ``worlds.data_dir``."""
        if self._real is None:
            self._real = Tau2Telecom(Path(self.data_dir) / "telecom")
        return self._real

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        if split not in self.splits:
            raise ValueError(f"telecom has splits {sorted(self.splits)}, not {split!r}")
        if self.data_dir:  # a real set: tau2's split of that name, scored whole unless n is smaller
            return self.real.tasks(split, n, seed=seed)
        if n > self.MAX_TASKS:
            log.warning("telecom: %d tasks asked, drawing %d (TelecomEnv.MAX_TASKS: beyond it the generated tasks "
                        "only repeat its %d problems)", n, self.MAX_TASKS, len(TELECOM_KINDS))
            n = self.MAX_TASKS
        out = []
        for i in range(n):
            rng = random.Random(f"telecom|{self.seed}|{split}|{seed}|{i}")
            kind = TELECOM_KINDS[(i + seed) % len(TELECOM_KINDS)]
            db, actions, info, details, meta = _gen_task(rng, kind, split)
            replay_actions(TelecomTools, db, actions)  # a broken generator fails here, not in an episode
            phone = db["lines"][meta["line_id"]]["phone_number"]
            scenario = {"request": REQUESTS[kind], "auth": {"phone number": phone}, "details": details,
                        "confirm": "yes", "max_turns": 8}
            basis = ["DB", "COMMUNICATE"] + (["ACTION"] if kind == "port" else [])
            answer = {"db": db, "actions": actions, "scenario": scenario, "communicate_info": info,
                      "env_assertions": [], "reward_basis": basis}
            out.append(Task(id=f"telecom-{split}-w{self.seed}-s{seed}-{i}", domain="telecom", benchmark="telecom",
                            system_prompt=self.system_prompt, user_prompt=scenario["request"],
                            tools=copy.deepcopy(self.tool_schemas), answer=answer,
                            meta={**meta, "source": "generated"}))
        return out

    def start(self, task: Task, max_turns: int = 16) -> DeskEpisode:
        if (task.meta or {}).get("source") == "tau2":  # its customer is the LLM user simulator, with a phone
            return self.real.start(task, getattr(self.worlds, "user_sim", None) or UserSimConfig(), max_turns=max_turns)
        return DeskEpisode(task, TELECOM_DESK, max_turns=max_turns)


# --- scripted expert ------------------------------------------------------------------------------


def _confirm(text: str) -> str:
    return f"{text} Shall I proceed? (yes/no)"


def _telecom_plan(task: Task) -> list[str]:
    ans, meta = task.answer, task.meta
    kind, lid, cid = meta["kind"], meta["line_id"], meta["customer_id"]
    db = ans["db"]
    line = db["lines"][lid]
    actions = ans["actions"]
    call = format_tool_call
    if kind == "port":
        return ["Porting a number is handled by our human agents; I am transferring you now.\n"
                + call("transfer_to_human_agents", actions[0]["arguments"])]
    plan = [ask_auth(ans["scenario"]["auth"]), call("get_customer_by_phone", {"phone_number": line["phone_number"]}),
            call("get_line_details", {"line_id": lid})]
    if kind == "roaming":
        plan += [_confirm(f"Roaming is off on {line['phone_number']}; I can enable it."),
                 call("enable_roaming", {"line_id": lid}),
                 f"Roaming is now enabled on {line['phone_number']}; data should work abroad in a minute. {CLOSING}"]
    elif kind == "apn":
        plan += [call("get_data_usage", {"line_id": lid}),
                 _confirm(f"You still have data left, but your APN is '{line['apn']}'. I can reset it to "
                          f"'{DEFAULT_APN}'."),
                 call("reset_apn", {"line_id": lid}),
                 f"Your APN is reset to '{DEFAULT_APN}'; please restart your phone. {CLOSING}"]
    elif kind == "refuel":
        gb = actions[0]["arguments"]["gb"]
        price = ans["communicate_info"][0]
        plan += [call("get_data_usage", {"line_id": lid}),
                 "Your data is used up. " + ask_detail("number of GB you want to add (at most 2 GB)"),
                 _confirm(f"Adding {gb:g} GB costs {price}."),
                 call("refuel_data", {"line_id": lid, "gb": gb}),
                 f"I added {gb:g} GB to your line; {price} will be on your next bill. {CLOSING}"]
    elif kind == "outage":
        outage = db["outages"][line["area"]]
        plan += [call("check_network_status", {"area": line["area"]}),
                 f"There is a network outage in {line['area']} ({outage['issue']}); it is expected to be fixed by "
                 f"{outage['expected_fix']}. Nothing needs to change on your line. {CLOSING}"]
    elif kind == "suspended":
        pays = [a for a in actions if a["name"] == "pay_bill"]
        total = ans["communicate_info"][0]
        ids = ", ".join(a["arguments"]["bill_id"] for a in pays)
        plan += [call("get_bills", {"customer_id": cid}),
                 _confirm(f"Your line is suspended because of overdue bills ({ids}, {total} in total). I can pay "
                          f"them with your {db['customers'][cid]['payment_method']} and resume the line."),
                 "\n".join(call("pay_bill", a["arguments"]) for a in pays),  # one turn, several calls
                 call("resume_line", {"line_id": lid}),
                 f"I paid {total} and your line is active again. {CLOSING}"]
    return plan


def scripted_expert(task: Task, messages: list[dict]) -> str:
    """The next assistant turn of an agent that knows the task's gold actions (reward 1.0 on every generated task;
    on a real tau2 task, ``tau2_telecom.expert_plan``: the customer must still do its part on its phone)."""
    if (task.meta or {}).get("source") == "tau2":
        return planned_turn(expert_plan(task), messages)
    return planned_turn(_telecom_plan(task), messages)
