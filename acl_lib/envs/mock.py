"""The tau2-bench ``mock`` domain (OOD benchmark ``mock``): a tiny task-management desk.

Database (the tau2 schema)::

    {"tasks": {task_id: {"task_id", "title", "description", "status": "pending" | "completed"}},
     "users": {user_id: {"user_id", "name", "tasks": [task_id, ...]}}}

Tools (the four agent tools of tau2's mock domain, re-implemented here): ``create_task(user_id, title,
description?)`` (new id ``task_<number of tasks + 1>``), ``get_users()``, ``update_task_status(task_id,
status)``, ``transfer_to_human_agents(summary)`` (ends the conversation, as in tau2).

Tasks come from two sources:

- ``mini`` worlds (``worlds.data_dir`` empty): generated tasks, each with its own small generated database
  (create a task, by user id or by name; mark a task done/pending; both at once; a delete request that the
  policy says must go to a human). Train and test draw user names and task titles from disjoint halves
  of the word pools, so they never overlap. ``train`` exists for completeness: mock is OOD and never
  used in training.
- ``paper`` (``<data_dir>/mock/`` with tau2's ``db.json``, ``tasks.json``, ``policy.md``): the real tau2
  tasks. tau2's user is an LLM following free-text instructions; here the rule-based user needs a
  structured scenario, which ``tau2_task_to_task`` derives from the gold actions where that is faithful:
  ``create_task`` / ``update_task_status`` actions (or an ``assert_task_status`` env assertion) become an
  explicit request naming the ids; a ``transfer_to_human_agents`` task keeps the user's own instruction in
  the first person. The initial state (message-history tool calls, ``initialization_data``,
  assistant ``initialization_actions``) is applied to the database. Skipped, with the reason logged:
  tasks graded only by natural-language assertions (need an LLM judge) and tasks that need user-side
  tools (notifications). Of the 10 fixture tasks, 8 are playable. With an LLM user simulator configured
  (``worlds.user_sim``, ``llm_user.py``) the same 8 tasks are played by it from their own ``user_scenario``
  instead of the derived request, as tau2 plays them (a task's earlier ``message_history`` only changes the
  database; the conversation starts afresh).

Reward (all that the task's ``reward_basis`` names, default ``DB`` + ``COMMUNICATE``): the final database
equals the one produced by replaying the gold actions on a fresh copy (``DB``), every gold action was
called with its compared arguments (``ACTION``), the env assertions hold (``ENV_ASSERTION``), every
``communicate_info`` string appears in an assistant message (``COMMUNICATE``). 1.0 or 0.0.

Episodes, gold replay and scoring are the generic desk of ``desk.py`` (``DeskEpisode`` with
``ReplayDesk(MockTools)``); this module holds the mock database, tools, tasks, policy and expert.
"""

from __future__ import annotations

import copy
import json
import logging
import random
import re
from pathlib import Path

from acl_lib.chat import format_tool_call
from acl_lib.envs import llm_user
from acl_lib.envs.base import Environment, Task, ToolError, function_schema
from acl_lib.envs.desk import (
    CLOSING,
    TRANSFER_SCHEMA,
    DeskEpisode,
    ReplayDesk,
    Toolkit,
    planned_turn,
    questions_for,
    replay_actions,
)

log = logging.getLogger(__name__)

# --- database and tools ---------------------------------------------------------------------------

STATUSES = ["pending", "completed"]

MOCK_TOOLS = [
    function_schema(
        "create_task",
        "Create a new task for a user. Returns the created task.",
        {
            "user_id": {"type": "string", "description": "The id of the user the task is for."},
            "title": {"type": "string", "description": "The title of the task."},
            "description": {"type": "string", "description": "Optional description of the task."},
        },
        required=["user_id", "title"],
    ),
    function_schema("get_users", "Get all users (id, name, task ids).", {}),
    function_schema(
        "update_task_status",
        "Update the status of a task. Returns the updated task.",
        {
            "task_id": {"type": "string", "description": "The id of the task."},
            "status": {"type": "string", "enum": STATUSES, "description": "The new status."},
        },
    ),
    TRANSFER_SCHEMA,
]


class MockTools(Toolkit):
    """The mock domain's tools over its database."""

    TOOLS = MOCK_TOOLS

    def create_task(self, user_id: str, title: str, description: str | None = None) -> dict:
        if user_id not in self.db["users"]:
            raise ToolError(f"User {user_id} not found")
        if not title.strip():
            raise ToolError("a task must have a title")
        task_id = f"task_{len(self.db['tasks']) + 1}"
        task = {"task_id": task_id, "title": title, "description": description, "status": "pending"}
        self.db["tasks"][task_id] = task
        self.db["users"][user_id]["tasks"].append(task_id)
        return task

    def get_users(self) -> list[dict]:
        return list(self.db["users"].values())

    def update_task_status(self, task_id: str, status: str) -> dict:
        if task_id not in self.db["tasks"]:
            raise ToolError(f"Task {task_id} not found")
        self.db["tasks"][task_id]["status"] = status
        return self.db["tasks"][task_id]

    # env assertions (tau2's names and semantics)
    def assert_task_status(self, task_id: str, expected_status: str) -> bool:
        if task_id not in self.db["tasks"]:
            raise ToolError(f"Task {task_id} not found")
        return self.db["tasks"][task_id]["status"] == expected_status

    def assert_number_of_tasks(self, user_id: str, expected_number: int) -> bool:
        if user_id not in self.db["users"]:
            raise ToolError(f"User {user_id} not found")
        return len(self.db["users"][user_id]["tasks"]) == expected_number


MOCK_DESK = ReplayDesk(MockTools)


MINI_POLICY = """# Task desk policy
1. Every task must have a title.
2. A task's status is either "pending" or "completed".
3. Only existing users can have tasks created for them: check the user exists first.
4. Tasks cannot be deleted: transfer the user to a human agent instead."""

PREAMBLE = (
    "You are a support agent of a task-management service. Help the user with the tools, following the "
    "policy. Ask the user for what you need; when the request is done, tell the user."
)


def system_prompt(policy: str) -> str:
    return f"{PREAMBLE}\n\n{policy.strip()}"


# --- mini generator -------------------------------------------------------------------------------

FIRST = ["Ann", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "June", "Kai", "Lena",
         "Milo", "Nia", "Omar", "Pia", "Quin", "Rosa", "Sam", "Tara", "Ugo", "Vera", "Wes", "Yara"]
LAST = ["Lee", "Park", "Silva", "Novak", "Reyes", "Khan", "Moss", "Ito", "Berg", "Cole", "Diaz", "Frey",
        "Hale", "Iqbal", "Jung", "Kerr", "Lund", "Meyer", "Nash", "Ortiz"]
VERBS = ["Book", "Review", "Plan", "Prepare", "Email", "Call", "Update", "Draft", "Schedule", "Fix",
         "Order", "Check"]
OBJECTS = ["dentist visit", "quarterly report", "team lunch", "budget sheet", "client deck", "car service",
           "travel plan", "design review", "release notes", "office supplies", "vendor invoice",
           "onboarding guide", "garden tools", "sprint demo"]
DESCRIPTIONS = ["Before Friday", "High priority", "Ask Sam for input", "Needs two hours", "Bring the notes",
                "Follow up next week"]

MOCK_KINDS = ["create", "create_by_name", "update", "update_direct", "create_and_update", "delete"]


def _half(pool: list[str], split: str) -> list[str]:
    """Test and train draw from disjoint halves of each word pool, so their tasks never coincide."""
    return pool[1::2] if split == "test" else pool[0::2]


def _gen_mock_db(rng: random.Random, split: str) -> dict:
    firsts, lasts = _half(FIRST, split), _half(LAST, split)
    verbs, objs = _half(VERBS, split), _half(OBJECTS, split)
    n_users, n_tasks = rng.randint(2, 4), rng.randint(2, 6)
    names = rng.sample([f"{f} {last}" for f in firsts for last in lasts], n_users)
    users = {f"user_{i + 1}": {"user_id": f"user_{i + 1}", "name": names[i], "tasks": []} for i in range(n_users)}
    titles = rng.sample([f"{v} {o}" for v in verbs for o in objs], n_tasks)
    tasks = {}
    for i in range(n_tasks):
        tid = f"task_{i + 1}"  # contiguous ids: create_task numbers new tasks len(tasks) + 1
        tasks[tid] = {"task_id": tid, "title": titles[i], "description": rng.choice(DESCRIPTIONS),
                      "status": rng.choice(STATUSES)}
        users[rng.choice(sorted(users))]["tasks"].append(tid)
    return {"tasks": tasks, "users": users}


def _new_title(rng: random.Random, db: dict, split: str) -> str:
    used = {t["title"] for t in db["tasks"].values()}
    free = [f"{v} {o}" for v in _half(VERBS, split) for o in _half(OBJECTS, split) if f"{v} {o}" not in used]
    return rng.choice(free)


def _gen_mock_task(rng: random.Random, kind: str, split: str) -> tuple[dict, list[dict], dict]:
    """One generated task: (db, gold actions, scenario)."""
    db = _gen_mock_db(rng, split)
    uid = rng.choice(sorted(db["users"]))
    tid = rng.choice(sorted(db["tasks"]))
    flip = "completed" if db["tasks"][tid]["status"] == "pending" else "pending"  # a real change
    title = _new_title(rng, db, split)
    auth, details = {}, {}
    if kind == "create":
        args = {"user_id": uid, "title": title}
        details = {"title": title}
        if rng.random() < 0.5:
            args["description"] = details["description"] = rng.choice(DESCRIPTIONS)
        actions = [{"name": "create_task", "arguments": args}]
        request, auth = "I'd like to create a new task.", {"user_id": uid}
    elif kind == "create_by_name":
        actions = [{"name": "create_task", "arguments": {"user_id": uid, "title": title}}]
        request = f"Please create a task called '{title}' for {db['users'][uid]['name']}."
    elif kind == "update":
        actions = [{"name": "update_task_status", "arguments": {"task_id": tid, "status": flip}}]
        request, details = f"Please mark one of my tasks as {flip}.", {"task id": tid}
    elif kind == "update_direct":
        actions = [{"name": "update_task_status", "arguments": {"task_id": tid, "status": flip}}]
        request = f"Please mark {tid} as {flip}."
    elif kind == "create_and_update":
        actions = [{"name": "create_task", "arguments": {"user_id": uid, "title": title}},
                   {"name": "update_task_status", "arguments": {"task_id": tid, "status": flip}}]
        request = f"Please create a task called '{title}' for {uid}, and mark {tid} as {flip}."
    elif kind == "delete":
        what = rng.choice([f"task {tid}", "all my tasks"])
        actions = [{"name": "transfer_to_human_agents", "arguments": {"summary": f"User wants to delete {what}."},
                    "compare_args": []}]
        request = f"Please delete {what}."
    else:
        raise ValueError(f"unknown mock task kind {kind!r}")
    scenario = {"request": request, "auth": auth, "details": details, "confirm": "yes", "max_turns": 6}
    return db, actions, scenario


def make_task(task_id: str, benchmark: str, policy: str, db: dict, actions: list[dict], scenario: dict,
              meta: dict, reward_basis: list[str] | None = None, env_assertions: list[dict] | None = None) -> Task:
    """Assemble a mock Task (checks that the gold actions replay)."""
    replay_actions(MockTools, db, actions)
    if reward_basis is None:
        reward_basis = ["DB", "ACTION"] if any(a["name"] == "transfer_to_human_agents" for a in actions) else ["DB"]
    answer = {"db": db, "actions": actions, "scenario": scenario, "communicate_info": [],
              "env_assertions": env_assertions or [], "reward_basis": reward_basis}
    return Task(id=task_id, domain="mock", benchmark=benchmark, system_prompt=system_prompt(policy),
                user_prompt=scenario["request"], tools=copy.deepcopy(MOCK_TOOLS), answer=answer, meta=meta)


# --- real tau2 tasks ------------------------------------------------------------------------------


def _deep_merge(base: dict, upd: dict) -> None:
    """tau2's initialization_data update: dicts merge recursively, anything else is replaced."""
    for k, v in upd.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _deep_merge(base[k], v)
        else:
            base[k] = copy.deepcopy(v)


def _second_to_first_person(text: str) -> str:
    swaps = {"you": "I", "your": "my", "yours": "mine", "yourself": "myself"}
    return re.sub(r"\b(you|your|yours|yourself)\b",
                  lambda m: swaps[m.group(1).lower()] if m.start() else swaps[m.group(1).lower()].capitalize(),
                  text, flags=re.I).replace("I are", "I am")


def _request_for(action: dict) -> str:
    a = action["arguments"]
    if action["name"] == "create_task":
        extra = f" with the description '{a['description']}'" if a.get("description") else ""
        return f"please create a new task called '{a['title']}' for {a['user_id']}{extra}."
    if action["name"] == "update_task_status":
        return f"please mark {a['task_id']} as {a['status']}."
    raise ValueError(action["name"])


def tau2_task_to_task(raw: dict, db: dict, policy: str) -> tuple[Task | None, str | None]:
    """Convert one tau2 mock task. Returns (task, None) or (None, why it is skipped)."""
    crit = raw.get("evaluation_criteria") or {}
    actions = [{"name": a["name"], "arguments": a.get("arguments", {}), "compare_args": a.get("compare_args")}
               for a in crit.get("actions") or []]
    env_asserts = crit.get("env_assertions") or []
    init = raw.get("initial_state") or {}
    if any(e.get("env_type") == "user" for e in env_asserts + (init.get("initialization_actions") or [])):
        return None, "needs user-side tools (notifications) that the rule-based user does not have"
    if not actions and not env_asserts:
        return None, "graded by natural-language assertions only (needs an LLM judge)"
    basis = crit.get("reward_basis") or ["DB", "COMMUNICATE"]
    if "NL_ASSERTION" in basis:
        return None, "reward basis includes natural-language assertions (needs an LLM judge)"

    db = copy.deepcopy(db)
    tools = MockTools(db)
    for m in init.get("message_history") or []:  # past tool calls already changed the database
        for c in m.get("tool_calls") or []:
            getattr(tools, c["name"])(**c.get("arguments", {}))
    _deep_merge(db, (init.get("initialization_data") or {}).get("agent_data") or {})
    for ia in init.get("initialization_actions") or []:
        getattr(tools, ia["func_name"])(**ia.get("arguments", {}))

    writes = [a for a in actions if a["name"] in ("create_task", "update_task_status")]
    if not actions:  # graded by task-status assertions only: the request asks for that status
        writes = [{"name": "update_task_status",
                   "arguments": {"task_id": e["arguments"]["task_id"], "status": e["arguments"]["expected_status"]}}
                  for e in env_asserts if e["func_name"] == "assert_task_status"]
        if len(writes) != len(env_asserts):
            return None, "env assertions other than task status cannot be turned into a request"
    if writes:
        parts = [_request_for(a) for a in writes]
        request = " Also, ".join(parts)
        request = request[0].upper() + request[1:]
    elif all(a["name"] == "transfer_to_human_agents" for a in actions):
        request = _second_to_first_person(raw["user_scenario"]["instructions"].strip())
    else:
        return None, "gold actions the scenario derivation does not cover"
    scenario = {"request": request, "auth": {}, "details": {}, "confirm": "yes", "max_turns": 6}
    meta = {"source": "tau2", "kind": "tau2", "expert_writes": writes if not actions else [],
            "derived_request": True, "user_scenario": raw.get("user_scenario")}
    task = make_task(f"tau2-mock-{raw['id']}", "mock", policy, db, actions, scenario, meta,
                     reward_basis=basis, env_assertions=env_asserts)
    return task, None


def load_tau2_mock(mock_dir: str | Path) -> tuple[list[Task], dict[str, str]]:
    """All playable tasks of a tau2 mock directory, and {task id: reason} for the skipped ones."""
    d = Path(mock_dir)
    db = json.loads((d / "db.json").read_text())
    policy = (d / "policy.md").read_text()
    tasks, skipped = [], {}
    for raw in json.loads((d / "tasks.json").read_text()):
        task, why = tau2_task_to_task(raw, db, policy)
        if task is None:
            skipped[raw["id"]] = why
            log.info("mock: skipping tau2 task %s: %s", raw["id"], why)
        else:
            tasks.append(task)
    return tasks, skipped


# --- environment ----------------------------------------------------------------------------------


class MockEnv(Environment):
    """The tau2 ``mock`` task desk (OOD). ``worlds.data_dir`` set: real tau2 tasks from ``<data_dir>/mock``."""

    name = "mock"

    def __init__(self, worlds=None, seed: int = 0):
        self.worlds = worlds
        self.seed = seed
        self.splits: dict[str, str | None] = {"test": "mock", "train": None}
        self.data_dir = str(getattr(worlds, "data_dir", "") or "")
        self.skipped: dict[str, str] = {}

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        if split not in self.splits:
            raise ValueError(f"mock has splits {sorted(self.splits)}, not {split!r}")
        if split == "test" and self.data_dir:
            real, self.skipped = load_tau2_mock(Path(self.data_dir) / "mock")
            random.Random(f"mock|{self.seed}|{seed}").shuffle(real)
            if n > len(real):
                log.warning("mock: %d tasks asked, the tau2 set has %d playable", n, len(real))
            return real[:n]
        out = []
        for i in range(n):
            rng = random.Random(f"mock|{self.seed}|{split}|{seed}|{i}")
            kind = MOCK_KINDS[(i + seed) % len(MOCK_KINDS)]
            db, actions, scenario = _gen_mock_task(rng, kind, split)
            out.append(make_task(f"mock-{split}-w{self.seed}-s{seed}-{i}", "mock", MINI_POLICY, db, actions,
                                 scenario, {"source": "generated", "kind": kind}))
        return out

    def start(self, task: Task, max_turns: int = 16) -> DeskEpisode:
        user_sim = getattr(self.worlds, "user_sim", None)
        if user_sim is not None and user_sim.backend != "none" and (task.meta or {}).get("user_scenario"):
            # a real tau2 task, played by its own user_scenario
            return llm_user.start_episode(task, MOCK_DESK, user_sim, max_turns=max_turns)
        return DeskEpisode(task, MOCK_DESK, max_turns=max_turns)


# --- scripted expert ------------------------------------------------------------------------------


def _mock_plan(task: Task) -> list[str]:
    ans = task.answer
    actions = ans["actions"]
    writes = [a for a in actions if a["name"] != "transfer_to_human_agents"] or task.meta.get("expert_writes") or []
    if any(a["name"] == "transfer_to_human_agents" for a in actions):
        call = next(a for a in actions if a["name"] == "transfer_to_human_agents")
        summary = call["arguments"].get("summary") or f"User asks: {task.user_prompt}"
        return ["Deleting tasks is not something I can do; I am transferring you to a human agent.\n"
                + format_tool_call("transfer_to_human_agents", {"summary": summary})]
    plan = questions_for(ans["scenario"])
    if any(a["name"] == "create_task" for a in writes):
        plan.append(format_tool_call("get_users", {}))  # policy: only existing users get tasks
    tools = MockTools(copy.deepcopy(ans["db"]))
    done = []
    for a in writes:
        plan.append(format_tool_call(a["name"], a["arguments"]))
        out = getattr(tools, a["name"])(**a["arguments"])
        if a["name"] == "create_task":
            done.append(f"I created {out['task_id']} '{out['title']}' for {a['arguments']['user_id']}.")
        else:
            done.append(f"{out['task_id']} is now {out['status']}.")
    plan.append(" ".join(done) + " " + CLOSING)
    return plan


def scripted_expert(task: Task, messages: list[dict]) -> str:
    """The next assistant turn of an agent that knows the task's gold actions (reward 1.0 on every task)."""
    return planned_turn(_mock_plan(task), messages)
