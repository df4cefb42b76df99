"""The customer-service desk shared by the tool-use domains ``mock``, ``telecom`` and ``retail``.

One episode loop (``DeskEpisode``) for all three: assistant tool calls run on the episode's own copy of
the task's database (bad calls and broken preconditions become ``Error: ...`` observations, see
``base.ToolEpisode``), a turn without tool calls goes to the rule-based simulated user
(``usersim.RuleUser``), and the episode ends when the user says ``###STOP###``, after a successful
``transfer_to_human_agents``, or at the turn limit. A domain plugs in a ``Desk``: the toolkit an
episode starts with and the check of the final state. Also here: the ``Toolkit`` base (tool registry
and schemas), ``compact_schemas``, the gold-action replay (``replay_actions``) and database comparison
(``db_diff``) of ``ReplayDesk`` (tau2's evaluator, used by mock and telecom; retail has its own
``RetailDesk``), and the scripted experts' helpers (``planned_turn``, ``ask_auth``, ...).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from acl_lib.envs.base import (
    Task,
    ToolEpisode,
    ToolError,
    function_schema,
    validate_arguments,
)
from acl_lib.envs.usersim import STOP, RuleUser

# --- toolkit, schemas, replay, comparison ---------------------------------------------------------


class Toolkit:
    """Tools over one database, mutated in place (a JSON dict for mock and telecom, a ``RetailDB``).

    Subclasses list their OpenAI schemas in ``TOOLS`` (the registry: ``functions()`` maps each name to
    the method of that name, which takes the schema's arguments as keyword arguments); a failed
    precondition raises ``ToolError``. Methods named ``assert_*`` are env assertions (never exposed to
    the agent).
    """

    TOOLS: ClassVar[list[dict]] = []

    def __init__(self, db: Any):
        self.db = db
        self.transferred = False  # set by transfer_to_human_agents: the conversation ends

    def functions(self) -> dict[str, Callable[..., Any]]:
        return {s["function"]["name"]: getattr(self, s["function"]["name"]) for s in self.TOOLS}

    def transfer_to_human_agents(self, summary: str) -> str:
        self.transferred = True
        return "Transfer successful"


TRANSFER_SCHEMA = function_schema(
    "transfer_to_human_agents",
    "Transfer the user to a human agent with a summary of the issue. Only when the user asks for a human "
    "or the request cannot be handled with the policy and tools.",
    {"summary": {"type": "string", "description": "A summary of the user's issue."}},
)


def compact_schemas(schemas: list[dict], descriptions: dict[str, str]) -> list[dict]:
    """Copies of ``schemas`` with the same signatures (names, parameter names, types, enums, required
    lists) but ``descriptions[name]`` as each function's description and no parameter descriptions.

    For the mini worlds: their small models see every schema in every prompt, so prose is kept short.
    """
    out = copy.deepcopy(schemas)
    for schema in out:
        fn = schema["function"]
        fn["description"] = descriptions[fn["name"]]
        for prop in fn["parameters"]["properties"].values():
            prop.pop("description", None)
    return out


def replay_actions(toolkit_cls: type[Toolkit], db: dict, actions: list[dict]) -> dict:
    """Run ``actions`` (``{"name", "arguments"}``) on a deep copy of ``db``; return the final database.

    A gold action that fails (bad arguments, broken precondition) raises ``ValueError``: the task is broken.
    """
    tk = toolkit_cls(copy.deepcopy(db))
    fns = tk.functions()
    schemas = {s["function"]["name"]: s for s in toolkit_cls.TOOLS}
    for a in actions:
        name, args = a["name"], a.get("arguments", {})
        if name not in fns:
            raise ValueError(f"gold action uses unknown tool '{name}'")
        bad = validate_arguments(schemas[name], args)
        if bad:
            raise ValueError(f"gold action {name}: {bad}")
        try:
            fns[name](**args)
        except ToolError as exc:
            raise ValueError(f"gold action {name}({args}) fails: {exc}") from exc
    return tk.db


def db_diff(expected: Any, actual: Any, path: str = "db") -> str | None:
    """The first path where two JSON values differ (``"db.tasks.task_2.status"``), or None if equal."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for k in sorted(set(expected) | set(actual), key=str):
            if k not in expected or k not in actual:
                return f"{path}.{k} ({'missing' if k not in actual else 'unexpected'})"
            d = db_diff(expected[k], actual[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(expected, list) and isinstance(actual, list):
        if len(expected) != len(actual):
            return f"{path} (length {len(actual)}, expected {len(expected)})"
        for i, (e, a) in enumerate(zip(expected, actual)):
            d = db_diff(e, a, f"{path}[{i}]")
            if d:
                return d
        return None
    if type(expected) is not type(actual) and not (
        isinstance(expected, (int, float)) and isinstance(actual, (int, float))
        and not isinstance(expected, bool) and not isinstance(actual, bool)
    ):
        return f"{path} ({actual!r}, expected {expected!r})"
    return None if expected == actual else f"{path} ({actual!r}, expected {expected!r})"


def db_equal(a: Any, b: Any) -> bool:
    return db_diff(a, b) is None


def _norm_info(s: str) -> str:
    return str(s).lower().replace(",", "")


def info_said(info: str, texts: list[str]) -> bool:
    """tau2's communicate check: ``info`` (lower-cased, commas dropped) is a substring of some message."""
    want = _norm_info(info)
    return any(want in _norm_info(t) for t in texts)


def _args_match(gold: dict, call_args: dict, compare: list[str] | None) -> bool:
    keys = list(gold) if compare is None else compare
    return all(k in call_args and call_args[k] == gold.get(k) for k in keys)


# --- the episode ----------------------------------------------------------------------------------


class Desk(ABC):
    """A domain's part of a desk episode: the toolkit it starts with and the check of how it ended."""

    @abstractmethod
    def new_toolkit(self, task: Task) -> Toolkit:
        """A toolkit over a fresh copy of ``task``'s initial database."""

    @abstractmethod
    def check(self, episode: DeskEpisode) -> str | None:
        """Why the finished ``episode`` fails (the ``failure`` text), or None if its reward is 1."""

    def user_tools(self, toolkit: Toolkit) -> tuple[list[dict], Callable[[str, dict], str]] | None:
        """The customer's own tools in an episode over ``toolkit``: (their OpenAI schemas, a function running one
        call ``(name, arguments) -> result text``), or None: the customer only talks (mock, retail, the mini desks).
        tau2's telecom customer has a phone (``tau2_telecom.TelecomDesk``)."""
        return None


class ReplayDesk(Desk):
    """tau2's evaluator over a JSON database, for ``toolkit_cls`` (mock, telecom).

    ``task.answer`` holds ``db`` (initial database), ``actions`` (gold ``{"name", "arguments",
    "compare_args"?}``), ``scenario`` (for ``RuleUser``), optional ``communicate_info``,
    ``env_assertions`` (``{"func_name", "arguments", "assert_value"?}``) and ``reward_basis``
    (default ``["DB", "COMMUNICATE"]``); every check the basis names must hold.
    """

    def __init__(self, toolkit_cls: type[Toolkit]):
        self.toolkit_cls = toolkit_cls

    def new_toolkit(self, task: Task) -> Toolkit:
        ans = task.answer if isinstance(task.answer, dict) else {}
        return self.toolkit_cls(copy.deepcopy(ans.get("db") or {}))

    def check(self, episode: DeskEpisode) -> str | None:
        ans = episode.answer
        toolkit = episode.toolkit
        basis = ans.get("reward_basis") or ["DB", "COMMUNICATE"]
        actions = ans.get("actions") or []
        if "DB" in basis:
            try:
                expected = replay_actions(self.toolkit_cls, ans.get("db") or {}, actions)
            except (ValueError, TypeError, KeyError) as exc:
                return f"task error: {exc}"
            diff = db_diff(expected, toolkit.db)
            if diff:
                return f"database differs from the gold outcome at {diff}"
        if "ACTION" in basis:
            made = [c for c in episode.tool_log if c["ok"]]
            for a in actions:
                if not any(c["name"] == a["name"] and _args_match(a.get("arguments", {}), c["arguments"],
                                                                  a.get("compare_args")) for c in made):
                    return f"expected action {a['name']} was not taken"
        if "ENV_ASSERTION" in basis:
            for ea in ans.get("env_assertions") or []:
                fn = getattr(toolkit, ea["func_name"], None)
                if not ea["func_name"].startswith("assert_") or fn is None:
                    return f"task error: unknown assertion {ea['func_name']}"
                try:
                    ok = fn(**ea.get("arguments", {}))
                except ToolError:
                    ok = False
                if ok != ea.get("assert_value", True):
                    return f"env assertion {ea['func_name']}({ea.get('arguments')}) does not hold"
        if "COMMUNICATE" in basis:
            said = [m.get("content") or "" for m in episode.messages if m["role"] == "assistant"]
            for info in ans.get("communicate_info") or []:
                if not info_said(info, said):
                    return f"did not tell the user: {info}"
        return None


class DeskEpisode(ToolEpisode):
    """A customer-desk episode: ``desk``'s toolkit and a ``RuleUser`` playing ``task.answer["scenario"]``.

    A text turn goes to the user; the episode ends when the user says ``###STOP###``, after a
    successful transfer to a human (``transferred``), or at the turn limit. The reward is 1.0 when
    ``desk.check`` finds nothing wrong, else 0.0 with its reason as ``failure``.
    """

    def __init__(self, task: Task, desk: Desk, max_turns: int = 16):
        super().__init__(task, max_turns=max_turns)
        self.answer = task.answer if isinstance(task.answer, dict) else {}
        self.desk = desk
        self.toolkit = desk.new_toolkit(task)
        self.user = RuleUser(self.answer.get("scenario") or {"request": task.user_prompt})
        self.user.first_message()  # the task's user_prompt is this message
        self.transferred = False

    def tool_functions(self) -> dict[str, Callable[..., Any]]:
        return self.toolkit.functions()

    def _step(self, text: str) -> list[dict]:
        n_calls = len(self.tool_log)
        obs = super()._step(text)
        if any(c["ok"] and c["name"] == "transfer_to_human_agents" for c in self.tool_log[n_calls:]):
            self.transferred = True
            self.done = True  # tau2: a transfer hands the conversation over
        return obs

    def on_text(self, content: str) -> list[dict]:
        reply = self.user.reply(content)
        if STOP in reply:
            self.done = True
        return [{"role": "user", "content": reply}]

    def _score(self) -> float:
        why = self.desk.check(self)
        if why:
            self.failure = why
            return 0.0
        return 1.0


# --- scripted experts -----------------------------------------------------------------------------

CLOSING = "Is there anything else I can help you with?"


def planned_turn(plan: list[str], messages: list[dict], after: str = CLOSING) -> str:
    """The expert's next turn: ``plan[k]`` where ``k`` = assistant turns already taken; ``after`` once
    the plan is used up."""
    k = sum(1 for m in messages if m.get("role") == "assistant")
    return plan[k] if k < len(plan) else after


def ask_auth(auth: dict) -> str:
    """An identification question the rule-based user answers with its auth sentence."""
    what = " and ".join(k.replace("_", " ") for k in auth)
    return f"Could you please tell me your {what} so I can identify you?"


def ask_detail(key: str) -> str:
    return f"Could you tell me the {key.replace('_', ' ')}?"


def questions_for(scenario: dict) -> list[str]:
    """Questions an agent must ask: auth and details the opening request does not already contain."""
    req = scenario.get("request", "")
    qs = []
    auth = scenario.get("auth") or {}
    if auth and not all(str(v) in req for v in auth.values()):
        qs.append(ask_auth(auth))
    qs += [ask_detail(k) for k, v in (scenario.get("details") or {}).items() if str(v) not in req]
    return qs

