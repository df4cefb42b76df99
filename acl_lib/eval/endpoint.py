"""An agent served by an OpenAI-compatible endpoint, behind the evaluator's policy interface.

    policy = EndpointPolicy("http://127.0.0.1:8000/v1", "Qwen/Qwen3-8B", temperature=1.0, max_new_tokens=8192)
    texts = policy([(task, messages), ...])       # raw assistant turns, as a local model would write them

The client is the user simulator's (``acl_lib.envs.llm_user.OpenAIChat``: retries, API key from an environment
variable); this class only turns the agent's side of an episode into requests and the replies back into turns.
A request carries the episode's messages (tool calls with ids, tool results answering them) and the task's tool
schemas; a reply's structured ``tool_calls`` become ``<tool_call>`` blocks in the Qwen3 convention, so the
environment parses them exactly as it parses a local model's (a call the endpoint returned unreadable becomes a
malformed block: a protocol error). A request that fails after the client's retries ends its episode with the
reason (``policies.FailedTurn``), never the run. Up to ``concurrency`` requests are in flight at once.

Used for the cold start's teacher (``sft.teacher`` with ``sft.teacher_url``, ``acl_lib.train.stage``).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from acl_lib.chat import TOOL_CALL_CLOSE, TOOL_CALL_OPEN, ToolCall, format_tool_call
from acl_lib.envs.base import Task
from acl_lib.envs.llm_user import OpenAIChat, UserSimError
from acl_lib.eval.policies import FailedTurn

# What an agent's message may carry to the endpoint (episodes also keep notes for the record: malformed_calls).
_MESSAGE_KEYS = ("role", "content", "tool_calls", "name")


def reply_turn(reply: str | dict) -> str:
    """An endpoint's reply (text, or ``{"content", "tool_calls"}`` with ``ToolCall`` / ``ToolCallError`` values) as
    the raw assistant turn a local model would have written."""
    if isinstance(reply, str):
        return reply
    parts = [reply.get("content") or ""]
    for call in reply.get("tool_calls") or []:
        if isinstance(call, ToolCall):
            parts.append(format_tool_call(call.name, call.arguments))
        else:  # unreadable: handed to the environment as written, which records a protocol error
            parts.append(f"{TOOL_CALL_OPEN}\n{call.raw}\n{TOOL_CALL_CLOSE}")
    return "\n".join(p for p in parts if p)


class EndpointPolicy:
    """A batch of (task, messages) -> assistant turns from a served model (see the module docstring)."""

    def __init__(self, url: str, model: str, api_key_env: str = "", temperature: float = 1.0, top_p: float = 1.0,
                 max_new_tokens: int = 256, timeout_s: float = 600.0, retries: int = 2, concurrency: int = 8,
                 key_setting: str = "sft.teacher_api_key_env"):
        self.chat = OpenAIChat(url, model, api_key_env, temperature, max_new_tokens, timeout_s, retries, concurrency,
                               top_p=top_p, key_setting=key_setting, rate_setting="")
        self.name = self.chat.name
        self.concurrency = concurrency
        self.failed_requests = 0

    def turn(self, task: Task, messages: list[dict]) -> str:
        msgs = [{k: m[k] for k in _MESSAGE_KEYS if k in m} for m in messages]
        try:
            return reply_turn(self.chat(msgs, tools=task.tools or None))
        except UserSimError as exc:  # the client's failure type, whoever it serves
            self.failed_requests += 1
            return FailedTurn(f"teacher endpoint failed: {exc}")

    def __call__(self, batch):
        if len(batch) <= 1 or self.concurrency <= 1:
            return [self.turn(t, m) for t, m in batch]
        with ThreadPoolExecutor(min(self.concurrency, len(batch))) as pool:
            return list(pool.map(lambda item: self.turn(*item), batch))
