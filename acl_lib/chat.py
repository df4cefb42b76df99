"""Qwen3-convention tool-call parsing, shared by environments, the eval harness and trainers.

The model writes tool calls as

    <tool_call>
    {"name": "search", "arguments": {"query": "..."}}
    </tool_call>

possibly several per assistant turn, possibly after some free text. Model output is adversarial by
nature: nothing here ever raises on bad text. A call that cannot be read becomes a ``ToolCallError``
value that the environment turns into an error observation (and a failed protocol step).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

_CALL_RE = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)(?:" + re.escape(TOOL_CALL_CLOSE) + r"|$)", re.S)


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call: a tool name and a dict of arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def to_message(self) -> dict:
        """The OpenAI/transformers ``tool_calls`` entry (arguments kept as a JSON string)."""
        return {"type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


@dataclass(frozen=True)
class ToolCallError:
    """A ``<tool_call>`` block that could not be read; ``reason`` says why, ``raw`` is the block text."""

    reason: str
    raw: str


@dataclass(frozen=True)
class ParsedTurn:
    """An assistant turn split into free text and tool calls (well-formed or not)."""

    content: str
    calls: list[ToolCall | ToolCallError]

    @property
    def has_calls(self) -> bool:
        return bool(self.calls)

    @property
    def errors(self) -> list[ToolCallError]:
        return [c for c in self.calls if isinstance(c, ToolCallError)]


def strip_think(text: str) -> str:
    """Drop a ``<think>...</think>`` block (and a dangling ``</think>`` prefix) from a response."""
    if THINK_CLOSE in text:
        text = text.rsplit(THINK_CLOSE, 1)[1]
    return text.replace(THINK_OPEN, "").strip()


def parse_one_call(body: str) -> ToolCall | ToolCallError:
    """Parse the JSON body of one ``<tool_call>`` block. Never raises."""
    raw = body
    body = body.strip()
    if not body:
        return ToolCallError("empty tool call", raw)
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, RecursionError, ValueError) as exc:
        return ToolCallError(f"malformed JSON in tool call: {exc}", raw)
    if not isinstance(obj, dict):
        return ToolCallError(f"tool call must be a JSON object, got {type(obj).__name__}", raw)
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCallError("tool call has no 'name' string", raw)
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models double-encode the arguments
        try:
            args = json.loads(args) if args.strip() else {}
        except (json.JSONDecodeError, RecursionError, ValueError) as exc:
            return ToolCallError(f"malformed JSON in tool call arguments: {exc}", raw)
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ToolCallError(f"tool call 'arguments' must be an object, got {type(args).__name__}", raw)
    return ToolCall(name, args)


def parse_assistant(text: str) -> ParsedTurn:
    """Split an assistant turn into its free text and its tool calls. Never raises.

    An unterminated final ``<tool_call>`` block (generation cut off) is parsed as far as it goes.
    """
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    calls: list[ToolCall | ToolCallError] = [parse_one_call(m.group(1)) for m in _CALL_RE.finditer(text)]
    content = _CALL_RE.sub("", text)
    content = strip_think(content).replace(TOOL_CALL_CLOSE, "").strip()
    return ParsedTurn(content=content, calls=calls)


def format_tool_call(name: str, arguments: dict) -> str:
    """Render one call the way the chat template renders it (what a model should generate)."""
    # ensure_ascii=False: the chat template's ``tojson`` keeps non-ASCII characters as they are
    return (f"{TOOL_CALL_OPEN}\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
            + f"\n{TOOL_CALL_CLOSE}")
