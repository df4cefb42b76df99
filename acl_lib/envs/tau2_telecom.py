"""tau2-bench's real telecom domain: the paper profile's ``telecom`` benchmark (``worlds.data_dir`` set).

The mini and smoke profiles keep the generated desk of ``telecom.py``; ``TelecomEnv`` hands its tasks and episodes
to this module when ``worlds.data_dir`` is set. Our implementation of the behaviour of tau2's
``src/tau2/domains/telecom`` (read from tau2-bench, not copied); the customer's phone is in ``tau2_phone.py``.

- **Data** (``<data_dir>/telecom/``, laid out by ``acl data prepare``): ``db.toml`` (the carrier's plans,
  customers, lines, bills and devices), ``user_db.toml`` (the customer's phone), ``tasks.json``,
  ``split_tasks.json`` (tau2's splits: ``small``, ``train``, ``test``, ``full``; the benchmark's ``test`` split is
  tau2's ``test`` split, and where the file has no such split every task of ``tasks.json`` is one),
  ``main_policy.md`` and ``tech_support_manual.md`` (together the agent's system prompt, ``agent_prompt``).
- **The agent's tools** (``AGENT_TOOLS``, ``AgentTools``): tau2's 13: look-ups of a customer by phone, id or name
  and date of birth; any record by id; suspend / resume a line; bills; a payment request; data usage; roaming on /
  off; a data refuel (charged on a draft bill); a transfer to a human. A failed precondition is an ``Error: ...``
  observation (``base.ToolEpisode``), never an exception.
- **One world per episode** (``TelecomWorld``): the agent's database and the customer's phone, kept in step after
  every tool call of either side as tau2's environment does (``sync``: whether the line is active, whether it may
  roam, whether its data is used up, a bill the customer has paid, a payment request the agent has sent).
  ``initial_world`` runs the task's ``initial_state`` (its ``initialization_data`` and ``initialization_actions``:
  calls on both sides that break the phone or the account before the conversation).
- **The customer** is the LLM user simulator (``llm_user.LLMUser``) with the phone's tools (``tau2_phone.PHONE_TOOLS``):
  it calls them, reads the results and then answers the agent; its calls and their results never reach the agent.
- **Reward** (``TelecomDesk.check``, tau2's evaluator): every check the task's ``reward_basis`` names must hold:
  ``ENV_ASSERTION`` (the ``env_assertions`` on the phone and on the account hold in the final state), ``ACTION``
  (every gold action was called by the agent or the customer, arguments compared as tau2 compares them), ``DB``
  (both databases equal those of the gold replay: initial state, then the gold actions), ``COMMUNICATE``
  (``communicate_info`` said by the agent). As for every real tau2 desk, a conversation must also end properly
  (the customer's signal or a transfer; ``llm_user.LLMUserEpisode``).
"""

from __future__ import annotations

import copy
import json
import random
import tomllib
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from acl_lib.chat import format_tool_call
from acl_lib.config import ConfigError
from acl_lib.envs import llm_user
from acl_lib.envs.base import Task, ToolError, function_schema, validate_arguments
from acl_lib.envs.desk import CLOSING, TRANSFER_SCHEMA, Desk, DeskEpisode, Toolkit, db_diff, info_said
from acl_lib.envs.tau2_phone import PHONE_TOOLS, PhoneTools, phone_db

TODAY = date(2025, 2, 25)  # tau2's telecom world is frozen on this day
FILES = ("db.toml", "user_db.toml", "tasks.json", "main_policy.md", "tech_support_manual.md")
BASIS = ("DB", "ENV_ASSERTION", "ACTION", "COMMUNICATE")

_CUSTOMER = {"customer_id": {"type": "string", "description": "The customer's id, e.g. C1001."}}
_LINE = {**_CUSTOMER,
         "line_id": {"type": "string", "description": "The line's id, e.g. L1002 (one of the customer's lines)."}}
AGENT_TOOLS: list[dict] = [
    function_schema("get_customer_by_phone", "Find the customer with this phone number (their contact number or the "
                    "number of one of their lines).",
                    {"phone_number": {"type": "string", "description": "The phone number, e.g. 555-123-2002."}}),
    function_schema("get_customer_by_id", "The customer with this id.", dict(_CUSTOMER)),
    function_schema("get_customer_by_name", "Customers with this full name and date of birth (a list, maybe empty).",
                    {"full_name": {"type": "string", "description": "The customer's full name."},
                     "dob": {"type": "string", "description": "Date of birth, YYYY-MM-DD."}}),
    function_schema("get_details_by_id", "The record of a customer (C...), line (L...), device (D...), bill (B...) "
                    "or plan (P...) by its id.", {"id": {"type": "string", "description": "The record's id."}}),
    function_schema("suspend_line", "Suspend an active line (at most 6 months; a $5/month holding fee applies).",
                    {**_LINE, "reason": {"type": "string", "description": "Why the line is suspended."}}),
    function_schema("resume_line", "Resume a suspended (or pending activation) line.", dict(_LINE)),
    function_schema("get_bills_for_customer", "A customer's bills, newest first.",
                    {**_CUSTOMER, "limit": {"type": "integer", "description": "At most this many bills (default 12)."}},
                    required=["customer_id"]),
    function_schema("send_payment_request", "Ask the customer to pay a bill (its status becomes Awaiting Payment); "
                    "only one bill of a customer may await payment. Check first that the bill is not paid.",
                    {**_CUSTOMER, "bill_id": {"type": "string", "description": "The bill's id, e.g. B1002."}}),
    function_schema("get_data_usage", "A line's data used this billing cycle, its plan's data limit, the data "
                    "refuelled and the cycle's end date.", dict(_LINE)),
    function_schema("enable_roaming", "Allow international roaming on a line.", dict(_LINE)),
    function_schema("disable_roaming", "Stop international roaming on a line.", dict(_LINE)),
    TRANSFER_SCHEMA,
    function_schema("refuel_data", "Add data to a line for this cycle, charged at its plan's refuelling price per GB "
                    "on the customer's next bill.",
                    {**_LINE, "gb_amount": {"type": "number", "description": "GB to add, more than 0."}}),
]


def _next_month(d: date) -> date:
    return (d.replace(day=1) + timedelta(days=32)).replace(day=1)


class AgentTools(Toolkit):
    """The agent's tools over the carrier's database (``db``: the JSON form of ``db.toml``, lists of records under
    ``plans``, ``customers``, ``lines``, ``bills``, ``devices``; mutated in place). Also the tasks' set-up functions
    (``set_data_usage``, ``suspend_line_for_overdue_bill``) and assertions, never offered to the agent."""

    TOOLS = AGENT_TOOLS

    def _find(self, table: str, key: str, value: Any, what: str) -> dict:
        for rec in self.db.get(table, []):
            if rec.get(key) == value:
                return rec
        raise ToolError(f"{what} {value} not found")

    def _line(self, line_id: str) -> dict:
        return self._find("lines", "line_id", line_id, "Line")

    def _plan(self, plan_id: str) -> dict:
        return self._find("plans", "plan_id", plan_id, "Plan")

    def _bill(self, bill_id: str) -> dict:
        return self._find("bills", "bill_id", bill_id, "Bill")

    def _customer_line(self, customer_id: str, line_id: str) -> dict:
        customer = self.get_customer_by_id(customer_id)
        if line_id not in customer.get("line_ids", []):
            raise ToolError(f"Line {line_id} not found for customer {customer_id}")
        return self._line(line_id)

    def line_by_phone(self, phone_number: str) -> dict:
        return self._find("lines", "phone_number", phone_number, "Line with phone number")

    def awaiting_payment(self, customer: dict) -> list[dict]:
        return [b for b in (self._bill(i) for i in customer.get("bill_ids", [])) if b["status"] == "Awaiting Payment"]

    def set_bill_paid(self, bill_id: str) -> None:
        self._bill(bill_id)["status"] = "Paid"

    # --- look-ups ---------------------------------------------------------------------------------------------------

    def get_customer_by_phone(self, phone_number: str) -> dict:
        for customer in self.db.get("customers", []):
            if customer.get("phone_number") == phone_number:
                return customer
            for line_id in customer.get("line_ids", []):
                line = next((ln for ln in self.db.get("lines", []) if ln.get("line_id") == line_id), None)
                if line and line.get("phone_number") == phone_number:
                    return customer
        raise ToolError(f"Customer with phone number {phone_number} not found")

    def get_customer_by_id(self, customer_id: str) -> dict:
        return self._find("customers", "customer_id", customer_id, "Customer with ID")

    def get_customer_by_name(self, full_name: str, dob: str) -> list[dict]:
        return [c for c in self.db.get("customers", [])
                if str(c.get("full_name", "")).lower() == full_name.lower() and c.get("date_of_birth") == dob]

    def get_details_by_id(self, id: str) -> dict:  # tau2's argument name
        tables = {"L": ("lines", "line_id", "Line"), "D": ("devices", "device_id", "Device"),
                  "B": ("bills", "bill_id", "Bill"), "C": ("customers", "customer_id", "Customer with ID"),
                  "P": ("plans", "plan_id", "Plan")}
        if id[:1] not in tables:
            raise ToolError(f"Unknown ID format or type: {id} (ids start with C, L, D, B or P)")
        return self._find(*tables[id[:1]][:2], id, tables[id[:1]][2])

    def get_bills_for_customer(self, customer_id: str, limit: int = 12) -> list[dict]:
        customer = self.get_customer_by_id(customer_id)
        bills = sorted((self._bill(i) for i in customer.get("bill_ids", [])), key=lambda b: str(b["issue_date"]),
                       reverse=True)
        return bills[:max(0, limit)]

    def get_data_usage(self, customer_id: str, line_id: str) -> dict:
        line = self._customer_line(customer_id, line_id)
        plan = self._plan(line["plan_id"])
        return {"line_id": line_id, "data_used_gb": line["data_used_gb"], "data_limit_gb": plan["data_limit_gb"],
                "data_refueling_gb": line["data_refueling_gb"],
                "cycle_end_date": (_next_month(TODAY) - timedelta(days=1)).isoformat()}

    # --- writes -----------------------------------------------------------------------------------------------------

    def suspend_line(self, customer_id: str, line_id: str, reason: str) -> dict:
        line = self._customer_line(customer_id, line_id)
        if line["status"] != "Active":
            raise ToolError("Line must be active to suspend")
        line.update(status="Suspended", suspension_start_date=TODAY.isoformat())
        return {"message": "Line suspended successfully. $5/month holding fee will apply.", "line": line}

    def resume_line(self, customer_id: str, line_id: str) -> dict:
        line = self._customer_line(customer_id, line_id)
        if line["status"] not in ("Suspended", "Pending Activation"):
            raise ToolError("Line must be suspended to resume")
        line.update(status="Active", suspension_start_date=None)
        return {"message": "Line resumed successfully", "line": line}

    def send_payment_request(self, customer_id: str, bill_id: str) -> str:
        customer = self.get_customer_by_id(customer_id)
        if self.awaiting_payment(customer):
            raise ToolError("A bill is already awaiting payment for this customer")
        if bill_id not in customer.get("bill_ids", []):
            raise ToolError(f"Bill {bill_id} not found for customer {customer_id}")
        self._bill(bill_id)["status"] = "Awaiting Payment"
        return f"Payment request sent to the customer for bill {bill_id}"

    def _set_roaming(self, customer_id: str, line_id: str, on: bool) -> str:
        line = self._customer_line(customer_id, line_id)
        word = "enabled" if on else "disabled"
        if bool(line["roaming_enabled"]) == on:
            return f"Roaming was already {word}"
        line["roaming_enabled"] = on
        return f"Roaming {word} successfully"

    def enable_roaming(self, customer_id: str, line_id: str) -> str:
        return self._set_roaming(customer_id, line_id, True)

    def disable_roaming(self, customer_id: str, line_id: str) -> str:
        return self._set_roaming(customer_id, line_id, False)

    def refuel_data(self, customer_id: str, line_id: str, gb_amount: float) -> dict:
        line = self._customer_line(customer_id, line_id)
        if gb_amount <= 0:
            raise ToolError("Refuel amount must be positive")
        price = self._plan(line["plan_id"])["data_refueling_price_per_gb"]
        charge = gb_amount * price
        line["data_refueling_gb"] += gb_amount
        self._charge(customer_id, charge, f"Data refueling: {gb_amount} GB at ${price}/GB")
        return {"message": f"Successfully added {gb_amount} GB of data for line {line_id} for ${charge:.2f}",
                "new_data_refueling_gb": line["data_refueling_gb"], "charge": charge}

    def _new_bill_id(self) -> str:
        """A bill id no bill has (tau2 draws a random one; a counter keeps episodes and their gold replay equal)."""
        taken = {b["bill_id"] for b in self.db.get("bills", [])}
        n = 1
        while f"B9{n:06d}" in taken:
            n += 1
        return f"B9{n:06d}"

    def _charge(self, customer_id: str, amount: float, description: str) -> None:
        """Add a line item to the customer's draft bill (next month's; created when there is none)."""
        customer = self.get_customer_by_id(customer_id)
        draft = next((b for b in (self._bill(i) for i in customer.get("bill_ids", [])) if b["status"] == "Draft"), None)
        if draft is None:
            start = _next_month(TODAY)
            draft = {"bill_id": self._new_bill_id(), "customer_id": customer_id, "period_start": start.isoformat(),
                     "period_end": (_next_month(start) - timedelta(days=1)).isoformat(),
                     "issue_date": start.isoformat(), "total_due": 0.0,
                     "due_date": (start + timedelta(days=14)).isoformat(), "status": "Draft", "line_items": []}
            self.db.setdefault("bills", []).append(draft)
            customer.setdefault("bill_ids", []).append(draft["bill_id"])
        draft.setdefault("line_items", []).append({"description": description, "amount": amount,
                                                   "date": TODAY.isoformat(),
                                                   "item_type": "Credit" if amount < 0 else "Charge"})
        draft["total_due"] += amount

    # --- the tasks' set-up functions --------------------------------------------------------------------------------

    def set_data_usage(self, customer_id: str, line_id: str, data_used_gb: float) -> str:
        self._customer_line(customer_id, line_id)["data_used_gb"] = data_used_gb
        return f"Data usage of {line_id} set to {data_used_gb} GB"

    def suspend_line_for_overdue_bill(self, customer_id: str, line_id: str, new_bill_id: str,
                                      contract_ended: bool) -> str:
        """Suspend ``line_id`` over a new overdue bill of last month's plan price (and end its contract)."""
        line = self._line(line_id)
        if line["status"] != "Active":
            raise ToolError("Line must be active to suspend for unpaid bill")
        price = self._plan(line["plan_id"])["price_per_month"]
        if price <= 0:
            raise ToolError("Amount must be positive for overdue bill")
        customer = self.get_customer_by_id(customer_id)
        if any(self._bill(i)["status"] == "Overdue" for i in customer.get("bill_ids", [])):
            raise ToolError("Customer already has an overdue bill")
        last_day = TODAY.replace(day=1) - timedelta(days=1)
        first_day = last_day.replace(day=1)
        self.db.setdefault("bills", []).append({
            "bill_id": new_bill_id, "customer_id": customer_id, "period_start": first_day.isoformat(),
            "period_end": last_day.isoformat(), "issue_date": first_day.isoformat(), "total_due": price,
            "due_date": (first_day + timedelta(days=14)).isoformat(), "status": "Overdue",
            "line_items": [{"description": f"Charge for line {line_id}", "amount": price, "date": TODAY.isoformat(),
                            "item_type": "Charge"}]})
        customer.setdefault("bill_ids", []).append(new_bill_id)
        line.update(status="Suspended", suspension_start_date=TODAY.isoformat())
        if contract_ended:
            line["contract_end_date"] = last_day.isoformat()
        return f"Line {line_id} suspended for unpaid bill {new_bill_id}"

    # --- assertions -------------------------------------------------------------------------------------------------

    def assert_data_refueling_amount(self, customer_id: str, line_id: str, expected_amount: float) -> bool:
        return abs(self._customer_line(customer_id, line_id)["data_refueling_gb"] - expected_amount) < 1e-6

    def assert_line_status(self, customer_id: str, line_id: str, expected_status: str) -> bool:
        return self._customer_line(customer_id, line_id)["status"] == expected_status

    def assert_overdue_bill_exists(self, customer_id: str, overdue_bill_id: str) -> bool:
        customer = self.get_customer_by_id(customer_id)
        return overdue_bill_id in customer.get("bill_ids", []) and self._bill(overdue_bill_id)["status"] == "Overdue"

    def assert_no_overdue_bill(self, overdue_bill_id: str) -> bool:
        """The bill is paid, or there is no such bill."""
        try:
            return self._bill(overdue_bill_id)["status"] == "Paid"
        except ToolError:
            return True


# --- the world of one episode -------------------------------------------------------------------------------------

_PHONE_SCHEMAS = {s["function"]["name"]: s for s in PHONE_TOOLS}


class TelecomWorld(Toolkit):
    """One episode's world: the carrier's database (``db``, with the agent's tools, ``agent``) and the customer's
    phone (``phone``), synced after every call of either side. It is the desk's toolkit: ``functions()`` are the
    agent's tools; ``run_user_tool`` is what the customer's tool calls go through (logged in ``user_log``)."""

    TOOLS = AGENT_TOOLS

    def __init__(self, db: dict, user_db: dict):
        super().__init__(db)
        self.agent = AgentTools(self.db)
        self.phone = PhoneTools(phone_db(user_db))
        self.user_log: list[dict] = []  # the customer's tool calls: name, arguments, ok, error, result

    def functions(self) -> dict[str, Callable[..., Any]]:
        def synced(fn):
            def call(**kwargs):
                out = fn(**kwargs)
                self.sync()
                return out
            return call
        return {name: synced(fn) for name, fn in self.agent.functions().items()}

    def run_user_tool(self, name: str, arguments: dict) -> str:
        """The customer's tool call ``name(**arguments)``: its result text, or ``Error: ...`` (an unknown tool, bad
        arguments, a failed precondition). Never raises."""
        entry = {"name": name, "arguments": arguments, "ok": False, "error": None, "result": None}
        self.user_log.append(entry)
        if name not in _PHONE_SCHEMAS:
            entry["error"] = f"unknown tool '{name}' (available: {', '.join(sorted(_PHONE_SCHEMAS))})"
        elif not isinstance(arguments, dict):
            entry["error"] = f"arguments must be an object, got {type(arguments).__name__}"
        else:
            entry["error"] = validate_arguments(_PHONE_SCHEMAS[name], arguments)
        if entry["error"] is None:
            try:
                entry["result"] = getattr(self.phone, name)(**arguments)
                entry["ok"] = True
            except (ToolError, TypeError, ValueError, KeyError) as exc:
                entry["error"] = str(exc)
            self.sync()
        return entry["result"] if entry["ok"] else f"Error: {entry['error']}"

    def call(self, env_type: str, func_name: str, arguments: dict | None = None) -> Any:
        """Any function of either side (set-up, tool, assertion) by tau2's ``env_type`` (``user`` / ``assistant``),
        then a sync. Raises ``ValueError`` naming an unknown side or function; the function's own errors pass."""
        side = {"user": self.phone, "assistant": self.agent}.get(env_type)
        if side is None:
            raise ValueError(f"unknown env_type {env_type!r} (expected user or assistant)")
        fn = getattr(side, func_name, None) if not func_name.startswith("_") else None
        if not callable(fn):
            raise ValueError(f"no function {func_name!r} on the {env_type} side")
        out = fn(**(arguments or {}))
        self.sync()
        return out

    def sync(self) -> None:
        """Carry the carrier's state to the customer's surroundings and back (tau2's ``sync_tools``): the line is
        active, may roam, has data left; a paid payment request marks its bill paid; a bill awaiting payment becomes
        the phone's payment request."""
        s = self.phone.surroundings
        if s["phone_number"] is None:
            return
        try:
            line = self.agent.line_by_phone(s["phone_number"])
            plan = self.agent._plan(line["plan_id"])
        except ToolError as exc:
            raise ValueError(f"task error: the customer's phone {s['phone_number']}: {exc}") from None
        s["line_active"] = line["status"] == "Active"
        s["roaming_allowed"] = bool(line["roaming_enabled"])
        s["mobile_data_usage_exceeded"] = line["data_used_gb"] >= plan["data_limit_gb"] + line["data_refueling_gb"]
        req = s["payment_request"]
        if req is not None and req.get("paid"):
            self.agent.set_bill_paid(req["bill_id"])
            s["payment_request"] = None
        if s["payment_request"] is None:
            waiting = self.agent.awaiting_payment(self.agent.get_customer_by_phone(s["phone_number"]))
            if waiting:
                s["payment_request"] = {"bill_id": waiting[0]["bill_id"], "amount_due": waiting[0]["total_due"],
                                        "paid": False}

    def assertion(self, assertion: dict) -> bool:
        """Whether a tau2 env assertion (``env_type``, ``func_name``, ``arguments``, ``assert_value``) holds; a
        function that fails (an unknown line, say) counts as not holding."""
        if not str(assertion.get("func_name", "")).startswith("assert_"):
            raise ValueError(f"not an assertion: {assertion.get('func_name')!r}")
        try:
            got = self.call(assertion.get("env_type", "user"), assertion["func_name"], assertion.get("arguments"))
        except (ToolError, TypeError, ValueError, KeyError):  # the task loader ran every assertion once: not a typo
            return False
        return got == assertion.get("assert_value", True)

    def state(self) -> dict:
        return {"agent": copy.deepcopy(self.db), "user": copy.deepcopy(self.phone.db)}


def _deep_update(base: dict, update: dict) -> None:
    for key, value in (update or {}).items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_update(base[key], value)
        else:
            base[key] = copy.deepcopy(value)


def initial_world(db: dict, user_db: dict, answer: dict) -> TelecomWorld:
    """A fresh world of a task: fresh copies of both databases, the task's ``initialization_data`` merged in, its
    ``initialization_actions`` run in order (each followed by a sync). A failing set-up raises ``ValueError``: the
    task is broken."""
    data = answer.get("initialization_data") or {}
    db, user_db = copy.deepcopy(db), copy.deepcopy(user_db)
    _deep_update(db, data.get("agent_data") or {})
    _deep_update(user_db, data.get("user_data") or {})
    world = TelecomWorld(db, user_db)
    world.sync()
    for a in answer.get("initialization_actions") or []:
        try:
            world.call(a["env_type"], a["func_name"], a.get("arguments"))
        except (ToolError, TypeError, ValueError, KeyError) as exc:
            raise ValueError(f"task error: initialization action {a.get('func_name')}({a.get('arguments')}) "
                             f"fails: {exc}") from None
    return world


def gold_world(db: dict, user_db: dict, answer: dict) -> TelecomWorld:
    """The initial world after the task's gold ``actions`` (by their ``requestor``); a failing gold action changes
    nothing (tau2 logs it and goes on)."""
    world = initial_world(db, user_db, answer)
    for a in answer.get("actions") or []:
        side = "user" if a.get("requestor") == "user" else "assistant"
        schemas = _PHONE_SCHEMAS if side == "user" else {s["function"]["name"]: s for s in AGENT_TOOLS}
        if a["name"] not in schemas:
            continue
        try:
            world.call(side, a["name"], a.get("arguments"))
        except (ToolError, TypeError, ValueError, KeyError):
            continue
    return world


def action_matches(gold: dict, call: dict) -> bool:
    """tau2's comparison of a gold action with a tool call: the same name, and equal values for the arguments of
    ``compare_args`` (when the gold action lists none: the arguments the call gave)."""
    if call.get("name") != gold["name"] or not isinstance(call.get("arguments"), dict):
        return False
    keys = gold.get("compare_args")
    keys = list(call["arguments"]) if keys is None else keys
    gold_args = gold.get("arguments") or {}
    return ({k: v for k, v in call["arguments"].items() if k in keys}
            == {k: v for k, v in gold_args.items() if k in keys})


class TelecomDesk(Desk):
    """The real telecom desk: each episode's ``TelecomWorld`` starts from the task's initial state; ``check`` is
    tau2's evaluator over the task's ``reward_basis``; the customer's tools are the phone's."""

    def __init__(self, db: dict, user_db: dict):
        self.db, self.user_db = db, user_db  # never mutated: every world gets copies

    def new_toolkit(self, task: Task) -> TelecomWorld:
        return initial_world(self.db, self.user_db, task.answer)

    def user_tools(self, toolkit: TelecomWorld) -> tuple[list[dict], Callable[[str, dict], str]]:
        return copy.deepcopy(PHONE_TOOLS), toolkit.run_user_tool

    def check(self, episode: DeskEpisode) -> str | None:
        ans, world = episode.answer, episode.toolkit
        basis = ans.get("reward_basis") or ["DB", "COMMUNICATE"]
        why = []
        if "DB" in basis:
            gold = gold_world(self.db, self.user_db, ans).state()
            mine = world.state()
            diff = db_diff(gold["agent"], mine["agent"], "db") or db_diff(gold["user"], mine["user"], "user_db")
            if diff:
                why.append(f"database differs from the gold outcome at {diff}")
        if "ACTION" in basis:
            calls = [c for c in episode.tool_log if c.get("name")] + world.user_log
            for gold in ans.get("actions") or []:
                if not any(action_matches(gold, c) for c in calls):
                    why.append(f"expected action {gold['name']}({json.dumps(gold.get('arguments') or {})}) was not "
                               "taken")
        if "ENV_ASSERTION" in basis:
            for ea in ans.get("env_assertions") or []:
                if not world.assertion(ea):
                    why.append(f"env assertion {ea['func_name']}({json.dumps(ea.get('arguments') or {})}) does not "
                               "hold")
        if "COMMUNICATE" in basis:
            said = [m.get("content") or "" for m in episode.messages if m["role"] == "assistant"]
            why += [f"did not tell the user: {info}" for info in ans.get("communicate_info") or []
                    if not info_said(info, said)]
        return "; ".join(why) or None


# --- scripted expert ------------------------------------------------------------------------------------------------


def expert_plan(task: Task) -> list[str]:
    """The turns of an agent that knows a real task's gold actions, in their order: its own as tool calls, the
    customer's as requests naming the tool ("Please run toggle_roaming on your phone."; with the arguments where
    there are any), then the closing question (none after a transfer, which ends the conversation)."""
    turns = []
    for a in task.answer.get("actions") or []:
        if a.get("requestor") == "user":
            args = a.get("arguments") or {}
            with_args = " with " + ", ".join(f"{k}={v}" for k, v in args.items()) if args else ""
            turns.append(f"Please run {a['name']} on your phone{with_args}.")
        else:
            turns.append(format_tool_call(a["name"], a.get("arguments") or {}))
    if not any(a["name"] == "transfer_to_human_agents" for a in task.answer.get("actions") or []):
        turns.append(CLOSING)
    return turns


# --- the real data ------------------------------------------------------------------------------------------------


def _jsonable(value: Any) -> Any:
    """TOML values as JSON ones: dates and times (unquoted TOML dates) as ISO strings."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value


def agent_prompt(main_policy: str, manual: str) -> str:
    """The agent's system prompt: the main policy, then the tech support manual (as tau2 joins them)."""
    return (f"<main_policy>\n{main_policy.strip()}\n</main_policy>\n"
            f"<tech_support_policy>\n{manual.strip()}\n</tech_support_policy>")


def to_task(raw: dict, system_prompt: str) -> Task:
    """One tau2 telecom task as a suite ``Task``: ``answer`` holds what the world and the check need."""
    criteria = raw.get("evaluation_criteria") or {}
    state = raw.get("initial_state") or {}
    instructions = (raw.get("user_scenario") or {}).get("instructions") or {}
    reason = instructions.get("reason_for_call", "") if isinstance(instructions, dict) else str(instructions)
    return Task(
        id=f"telecom-{raw['id']}", domain="telecom", benchmark="telecom", system_prompt=system_prompt,
        user_prompt=reason, tools=copy.deepcopy(AGENT_TOOLS),
        answer={"initialization_data": state.get("initialization_data"),
                "initialization_actions": state.get("initialization_actions") or [],
                "actions": criteria.get("actions") or [], "env_assertions": criteria.get("env_assertions") or [],
                "communicate_info": criteria.get("communicate_info") or [],
                "reward_basis": criteria.get("reward_basis") or ["DB", "COMMUNICATE"]},
        meta={"source": "tau2", "tau2_id": raw["id"], "user_scenario": raw.get("user_scenario"),
              "purpose": (raw.get("description") or {}).get("purpose")})


class Tau2Telecom:
    """tau2's telecom data under ``root`` (``<data_dir>/telecom``): tasks by split, and their episodes."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        missing = [f for f in FILES if not (self.root / f).is_file()]
        if missing:
            raise ConfigError(f"worlds.data_dir: {self.root} lacks {', '.join(missing)} (the tau2 telecom layout of "
                              "`acl data prepare`)")
        try:
            self.db = tomllib.loads((self.root / "db.toml").read_text())
            self.user_db = tomllib.loads((self.root / "user_db.toml").read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{self.root}: a database is not valid TOML ({exc})") from None
        missing = [t for t in ("plans", "customers", "lines", "bills") if not isinstance(self.db.get(t), list)]
        if missing:
            raise ConfigError(f"{self.root / 'db.toml'}: no list of {', '.join(missing)} (not tau2's telecom database)")
        self.db, self.user_db = _jsonable(self.db), _jsonable(self.user_db)  # tool results are JSON
        try:
            phone_db(self.user_db)
        except ValueError as exc:
            raise ConfigError(f"{self.root / 'user_db.toml'}: {exc}") from None
        self.raw = json.loads((self.root / "tasks.json").read_text())
        split_file = self.root / "split_tasks.json"
        self.splits = json.loads(split_file.read_text()) if split_file.is_file() else {}
        self.system_prompt = agent_prompt((self.root / "main_policy.md").read_text(),
                                          (self.root / "tech_support_manual.md").read_text())
        self.desk = TelecomDesk(self.db, self.user_db)
        self.skipped: dict[str, str] = {}  # task id -> why it cannot be played
        self._playable: dict[str, list[Task]] = {}  # split -> its tasks that can be played (checked once)

    def task_ids(self, split: str) -> list[str]:
        """tau2's split ``split`` where ``split_tasks.json`` has it, else every task of ``tasks.json``."""
        ids = [str(t["id"]) for t in self.raw]
        if split in self.splits:
            known = set(ids)
            return [str(i) for i in self.splits[split] if str(i) in known]
        return ids

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        """The tasks of ``split``; ``n`` fewer than there are: a seeded sample, kept in the split's order. A task
        whose set-up or one of whose assertions fails to run, or whose basis needs an LLM judge (``NL_ASSERTION``), is
        left out (``skipped`` says why)."""
        if split not in self._playable:
            self._playable[split] = self._load(split)
        out = list(self._playable[split])
        if n < len(out):
            chosen = set(random.Random(f"telecom-paper:{split}:{seed}").sample(range(len(out)), n))
            out = [t for k, t in enumerate(out) if k in chosen]
        return [copy.deepcopy(t) for t in out]

    def _load(self, split: str) -> list[Task]:
        by_id = {str(t["id"]): t for t in self.raw}
        out = []
        for i in self.task_ids(split):
            task = to_task(by_id[i], self.system_prompt)
            unknown = set(task.answer["reward_basis"]) - set(BASIS)
            if unknown:
                self.skipped[i] = f"reward basis {sorted(unknown)} is not scored by this desk"
                continue
            try:
                world = initial_world(self.db, self.user_db, task.answer)
                for ea in task.answer["env_assertions"]:  # each assertion runs (whatever it finds) on the set-up
                    world.call(ea.get("env_type", "user"), ea["func_name"], ea.get("arguments"))
            except (ToolError, TypeError, ValueError, KeyError) as exc:
                self.skipped[i] = str(exc)
                continue
            out.append(task)
        return out

    def start(self, task: Task, user_sim, max_turns: int = 16):
        return llm_user.start_episode(task, self.desk, user_sim, max_turns=max_turns)
