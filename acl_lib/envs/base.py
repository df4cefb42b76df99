"""The one environment interface shared by every domain, at mini and paper scale.

- A ``Task`` is data: system prompt, user prompt, the tool schemas the agent may call (OpenAI function
  format) and whatever its verifier needs (``answer``, JSON-serialisable).
- An ``Environment`` makes tasks and starts ``Episode`` s.
- An ``Episode`` takes assistant turns (raw generated text) and returns observations (tool responses,
  simulated user replies) until it ends; ``reward()`` is a number in [0, 1] and ``failure`` says why a
  reward is below 1 (``None`` when it is 1).

Single-turn domains (math, IF) end after the first assistant turn. Tool domains subclass
``ToolEpisode``: a turn with tool calls runs them and returns ``tool`` messages; a turn without tool
calls is handed to ``on_text`` (the final answer for search, a message to the simulated user in the
desks of ``desk.py``: retail, telecom, mock).

Nothing here raises on model output: malformed calls, unknown tools, bad arguments become
``Error: ...`` observations, and limits end the episode with a recorded reason.
"""

from __future__ import annotations

import copy
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from acl_lib.chat import ToolCall, ToolCallError, parse_assistant


@dataclass
class Task:
    """One task of one benchmark. ``answer`` holds what the verifier needs (JSON-serialisable)."""

    id: str
    domain: str  # environment name: math, mcq, search, retail, mock, telecom, instruct
    benchmark: str  # key of paper_results.yaml: aime26, gpqa, nq, retail, ifeval, ...
    system_prompt: str
    user_prompt: str
    tools: list[dict] = field(default_factory=list)
    answer: Any = None
    meta: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Task:
        return cls(**d)

    def initial_messages(self) -> list[dict]:
        msgs = []
        if self.system_prompt:
            msgs.append({"role": "system", "content": self.system_prompt})
        msgs.append({"role": "user", "content": self.user_prompt})
        return msgs


class Episode(ABC):
    """A running interaction with one task. Drive it with ``step(text)`` until ``done``."""

    def __init__(self, task: Task, max_turns: int = 16):
        self.task = task
        self.max_turns = max_turns
        self.messages: list[dict] = task.initial_messages()
        self.turns = 0
        self.done = False
        self.failure: str | None = None  # why the reward is below 1 (set by the episode)
        self.protocol_errors: list[str] = []  # malformed / unknown / bad-argument tool calls
        self.end_reason: str | None = None  # why the episode was stopped from outside (limits)

    @abstractmethod
    def _step(self, text: str) -> list[dict]:
        """Consume one assistant turn; return the observation messages (maybe empty)."""

    @abstractmethod
    def _score(self) -> float:
        """Reward in [0, 1] of the finished episode; set ``self.failure`` when below 1."""

    def step(self, text: str) -> list[dict]:
        """Feed one assistant turn (raw generated text). Returns the new observation messages."""
        if self.done:
            raise RuntimeError("episode already finished")
        self.turns += 1
        obs = self._step(text if isinstance(text, str) else "")
        self.messages.extend(obs)
        if not self.done and self.turns >= self.max_turns:
            self.end(f"turn limit ({self.max_turns}) reached")
        return obs

    def end(self, reason: str | None = None) -> None:
        """Stop the episode (limits, truncation). ``reason`` is recorded as the failure if it fails."""
        if reason and self.end_reason is None:
            self.end_reason = reason
        self.done = True

    def reward(self) -> float:
        if not self.done:
            self.end("episode not finished")
        r = float(self._score())
        r = min(1.0, max(0.0, r))
        if r < 1.0:
            reasons = [x for x in (self.failure, self.end_reason) if x]
            if len(reasons) == 2 and reasons[1] in reasons[0]:  # the failure already names how it ended
                reasons = reasons[:1]
            self.failure = "; ".join(dict.fromkeys(reasons)) or "wrong answer"
        return r

    def record(self) -> dict:
        """A JSON-serialisable record of the episode (for per-task jsonl)."""
        r = self.reward()
        return {
            "id": self.task.id,
            "benchmark": self.task.benchmark,
            "reward": r,
            "failure": self.failure if r < 1.0 else None,
            "turns": self.turns,
            "protocol_errors": list(self.protocol_errors),
            "messages": copy.deepcopy(self.messages),
        }


def step_workers(episodes: Sequence[Episode]) -> int:
    """How many of ``episodes`` may be stepped at once: their smallest ``step_concurrency`` (> 1 only for episodes
    whose step waits on a remote user simulator, ``llm_user.LLMUserEpisode`` with an HTTP endpoint; a local
    model is not shared across threads), 1 for none."""
    return min((getattr(ep, "step_concurrency", 1) for ep in episodes), default=1)


def prefetch(episodes: Sequence[Episode], texts: Sequence[str | None]) -> None:
    """Before a round of turns is stepped: let the episodes whose steps look things up (a class with a static
    ``prefetch(episodes, texts)``, ``search.SearchEpisode``) fetch the round's lookups in one batch."""
    groups: dict[type, tuple[list, list]] = {}
    for ep, text in zip(episodes, texts):
        if isinstance(text, str) and hasattr(type(ep), "prefetch"):
            eps, txts = groups.setdefault(type(ep), ([], []))
            eps.append(ep)
            txts.append(text)
    for kind, (eps, txts) in groups.items():
        kind.prefetch(eps, txts)


def map_concurrently(fn: Callable[[Any], Any], items: Sequence, workers: int) -> list:
    """``[fn(x) for x in items]``, in ``workers`` threads when ``workers`` > 1 (results in order; the first
    exception is re-raised here)."""
    if workers > 1 and len(items) > 1:
        with ThreadPoolExecutor(min(workers, len(items))) as pool:
            return list(pool.map(fn, items))
    return [fn(x) for x in items]


class SingleTurnEpisode(Episode):
    """One answer, scored by ``score_fn(response, task) -> (reward, failure_or_None)``."""

    def __init__(self, task: Task, score_fn: Callable[[str, Task], tuple[float, str | None]], max_turns: int = 1):
        super().__init__(task, max_turns=1)
        self._score_fn = score_fn
        self.response: str | None = None

    def _step(self, text: str) -> list[dict]:
        self.response = text
        self.messages.append({"role": "assistant", "content": text})
        self.done = True
        return []

    def _score(self) -> float:
        if self.response is None:
            self.failure = self.end_reason or "no response"
            return 0.0
        try:
            r, why = self._score_fn(self.response, self.task)
        except Exception as exc:  # a verifier must never crash an evaluation
            r, why = 0.0, f"verifier error: {type(exc).__name__}: {exc}"
        if r < 1.0:
            self.failure = why or "wrong answer"
        return r


class ToolError(Exception):
    """Raised by a tool whose precondition fails; the agent sees ``Error: <message>``."""


# --- argument validation against OpenAI function schemas ------------------------------------------

_JSON_TYPES = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
}


def validate_arguments(schema: dict, args: dict) -> str | None:
    """Check ``args`` against one function schema. Returns an error message, or None if valid."""
    params = schema.get("function", schema).get("parameters", {}) or {}
    props: dict = params.get("properties", {}) or {}
    for name in params.get("required", []) or []:
        if name not in args:
            return f"missing required argument '{name}'"
    for name, value in args.items():
        if name not in props:
            return f"unexpected argument '{name}' (expected: {', '.join(props) or 'none'})"
        want = props[name].get("type")
        if want in _JSON_TYPES:
            ok = (isinstance(value, _JSON_TYPES[want])
                  and not (want in ("integer", "number") and isinstance(value, bool)))
            if not ok:
                return f"argument '{name}' must be of type {want}, got {type(value).__name__}"
            if want == "array" and "items" in props[name]:
                item_t = props[name]["items"].get("type")
                if item_t in _JSON_TYPES and not all(isinstance(v, _JSON_TYPES[item_t]) for v in value):
                    return f"argument '{name}' must be an array of {item_t}"
        if "enum" in props[name] and value not in props[name]["enum"]:
            return f"argument '{name}' must be one of {props[name]['enum']}"
    return None


def function_schema(name: str, description: str, properties: dict, required: list[str] | None = None) -> dict:
    """Build an OpenAI function schema: ``{"type": "function", "function": {...}}``."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": list(properties) if required is None else required,
            },
        },
    }


class ToolEpisode(Episode):
    """A multi-turn episode with tools.

    Subclasses provide ``tool_functions()`` (name -> callable taking the schema's arguments as keyword
    arguments and returning a string or JSON-able value, raising ``ToolError`` on a failed precondition)
    and ``on_text(content)`` for a turn without tool calls (returns observations; may set ``done``).
    """

    def __init__(self, task: Task, max_turns: int = 16):
        super().__init__(task, max_turns=max_turns)
        self.schemas = {s["function"]["name"]: s for s in task.tools}
        self.tool_log: list[dict] = []  # every call the agent made, with outcome

    @abstractmethod
    def tool_functions(self) -> dict[str, Callable[..., Any]]: ...

    @abstractmethod
    def on_text(self, content: str) -> list[dict]: ...

    def call_tool(self, call: ToolCall | ToolCallError) -> str:
        """Run one call; every failure becomes an ``Error: ...`` string (never an exception)."""
        if isinstance(call, ToolCallError):
            self.protocol_errors.append(call.reason)
            self.tool_log.append({"name": None, "arguments": None, "ok": False, "error": call.reason})
            return f"Error: {call.reason}"
        fns = self.tool_functions()
        if call.name not in self.schemas or call.name not in fns:
            msg = f"unknown tool '{call.name}' (available: {', '.join(sorted(self.schemas))})"
            self.protocol_errors.append(msg)
            self.tool_log.append({"name": call.name, "arguments": call.arguments, "ok": False, "error": msg})
            return f"Error: {msg}"
        bad = validate_arguments(self.schemas[call.name], call.arguments)
        if bad:
            self.protocol_errors.append(f"{call.name}: {bad}")
            self.tool_log.append({"name": call.name, "arguments": call.arguments, "ok": False, "error": bad})
            return f"Error: {bad}"
        try:
            out = fns[call.name](**call.arguments)
        except ToolError as exc:
            self.tool_log.append({"name": call.name, "arguments": call.arguments, "ok": False, "error": str(exc)})
            return f"Error: {exc}"
        except (TypeError, ValueError, KeyError) as exc:  # bad argument values the schema cannot express
            self.tool_log.append({"name": call.name, "arguments": call.arguments, "ok": False, "error": str(exc)})
            return f"Error: {exc}"
        self.tool_log.append({"name": call.name, "arguments": call.arguments, "ok": True, "error": None})
        return out if isinstance(out, str) else json.dumps(out)

    def _step(self, text: str) -> list[dict]:
        parsed = parse_assistant(text)
        msg: dict = {"role": "assistant", "content": parsed.content}
        good = [c for c in parsed.calls if isinstance(c, ToolCall)]
        if good:
            msg["tool_calls"] = [c.to_message() for c in good]
        bad = [c.raw for c in parsed.calls if isinstance(c, ToolCallError)]
        if bad:  # kept for the record (transcripts): what the model wrote; chat templates ignore the key
            msg["malformed_calls"] = bad
        self.messages.append(msg)
        if parsed.has_calls:
            obs = []
            for call in parsed.calls:
                result = self.call_tool(call)
                obs.append({"role": "tool", "name": getattr(call, "name", "invalid"), "content": result})
            return obs
        return self.on_text(parsed.content)


class Environment(ABC):
    """A domain: makes tasks and starts episodes. One module per domain under ``acl_lib/envs/``."""

    name: str = "base"

    @abstractmethod
    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        """``n`` tasks of ``split`` (``train``, ``test``, or an OOD split name) drawn with ``seed``."""

    @abstractmethod
    def start(self, task: Task, max_turns: int = 16) -> Episode:
        """A fresh episode for ``task``."""
