"""An LLM user simulator for the real tau2 tasks (retail, mock, telecom), following tau2-bench's protocol.

The mini worlds' tasks carry a structured scenario that the rule-based ``usersim.RuleUser`` plays. The real tau2
tasks describe their customer in prose (``user_scenario``: an optional ``persona`` and ``instructions``, either a
string or the fields ``domain``, ``reason_for_call``, ``known_info``, ``unknown_info``, ``task_instructions``), for a
language model to play. This module is that player:

- **Instructions.** The simulator's system prompt is our guidelines for playing a customer (one message at a
  time, follow the scenario, never invent facts, disclose information only when asked) followed by the scenario
  rendered field by field inside ``<scenario>`` tags (``system_prompt``), as tau2 builds it.
- **Conversation.** tau2's agent opens with a fixed greeting (``GREETING``); the simulator answers it with the
  customer's first message. The simulator sees the conversation with the roles flipped (the agent's text turns
  as ``user`` messages, its own as ``assistant``); the agent's tool calls and tool results are not shown to it.
  The agent's transcript starts at the customer's first message: the greeting is shown to the simulator only
  (so the agent's prompt has the shape of every other task's).
- **Ending.** The customer ends the conversation with ``###STOP###`` (request done), ``###TRANSFER###`` (handed
  to another agent) or ``###OUT-OF-SCOPE###`` (the scenario does not say how to go on); the agent ends it with a
  successful ``transfer_to_human_agents``. After ``max_turns`` customer messages the conversation is cut off.
- **Reward** (``LLMUserEpisode``), as tau2 scores a simulation: a conversation that ended by one of those signals is
  scored by the desk's own check (the final database equals the gold replay's, plus what the task's reward basis
  names); one that ended any other way (a turn limit, a context limit, a failed simulator turn) scores 0, and
  ``failure`` says which.
- **The customer's own tools** (tau2's telecom customer has a phone, ``tau2_phone.PHONE_TOOLS``). Where the desk
  gives the customer tools (``desk.Desk.user_tools``), the simulator is offered them with every turn: a reply that
  calls tools has them run (``run_tool``) and their results appended, and the simulator is asked again, until it
  answers in text (at most ``max_tool_calls`` calls per message). The simulator sees its calls and their results
  (as ``assistant`` messages with ``tool_calls`` and ``tool`` messages); the agent never does: only the text goes
  back to the agent's transcript. The ``openai`` backend sends the schemas as the request's ``tools`` and reads
  ``tool_calls``; ``hf`` / ``vllm`` render them through the chat template and the calls are read from the
  ``<tool_call>`` markup. A customer without tools is the text-only player above (tool-call markup is garbled).
- **Failed turns.** A simulator turn fails when its backend raises (an HTTP error: ``transformers serve`` answers
  500, or 400 for tool-call arguments that are not JSON, when it cannot parse a response with the tokenizer's
  response template; a timeout; a context overflow) or when its reply is garbled: empty once ``<think>`` blocks are
  removed, or holding tool-call markup when the customer has no tools (or more than ``max_tool_calls`` calls before
  a message when it has). The episode then ends at once with ``failure = "user simulator failed: ..."``, never a
  crash.

The simulating model (``worlds.user_sim``, ``config.UserSimConfig``) is any policy the suite has, or an endpoint:

- ``hf``: ``eval.policies.HFPolicy`` on a local model directory or hub id;
- ``vllm``: ``eval.policies.VLLMPolicy`` (GPU machines);

  both handed down by the evaluation layer (``use_local_policy``), which this module, below it, never imports;
- ``openai``: ``OpenAIChat``, a client of an OpenAI-compatible ``POST {url}/chat/completions`` (the OpenAI API,
  ``vllm serve``, ``transformers serve``); the API key is read from the environment variable named by
  ``api_key_env``. Serving one of our models with ``transformers serve`` for this: ``serving_copy`` writes a
  copy of the model directory whose tokenizer parses responses as plain text (see its docstring).

One simulator per configuration is built per process (``simulator_for``) and shared by every episode. A local
model generates one conversation's turn at a time (the ``Episode.step`` interface answers one episode per call);
with an endpoint the evaluator steps up to ``concurrency`` episodes at once, in threads (``harness._step_all``).
Training rollouts (``train/trl_env.rollout_episodes``) step their episodes one by one.
"""

from __future__ import annotations

import email.utils
import json
import os
import random
import re
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from acl_lib.chat import ToolCall, ToolCallError, parse_assistant
from acl_lib.config import ConfigError, UserSimConfig, project_root
from acl_lib.envs.base import Task
from acl_lib.envs.desk import Desk, DeskEpisode

STOP = "###STOP###"
TRANSFER = "###TRANSFER###"
OUT_OF_SCOPE = "###OUT-OF-SCOPE###"
SIGNALS = {STOP: "stop", TRANSFER: "transfer", OUT_OF_SCOPE: "out_of_scope"}
GREETING = "Hi! How can I help you today?"  # tau2's opening agent message

# Our wording of what tau2's guidelines ask of the simulated customer.
# (A backslash at a line's end continues the line: the prompt's text has no line break there.)
GUIDELINES = f"""You are role-playing a customer who contacts a customer service agent. The scenario below says \
who you are and what you want.

Rules:
- Write only the customer's next message, one message at a time, as a real customer would in a chat.
- Follow the scenario. Do not invent any fact it does not give you (names, numbers, ids, addresses): what it does \
not say, you do not know.
- Share information a piece at a time, when the agent asks for it; do not recite the scenario.
- Keep going until what the scenario asks for is done. Then write {STOP} to end the conversation.
- If the agent transfers you to another agent, write {TRANSFER}.
- If the scenario does not tell you enough to go on, write {OUT_OF_SCOPE}."""

# Added to the guidelines of a customer with tools (tau2's telecom customer and their phone).
TOOL_GUIDELINES = """You have tools: they are your own phone. When the agent asks you to look at something on your \
phone or to change a setting, call the tool that does it, read its result, then tell the agent what you saw, in your \
own words. Never claim a result that no tool call gave you. Do one thing the agent asked at a time."""


class UserSimError(RuntimeError):
    """A failed simulator turn (backend error, context limit, garbled reply): ends the episode, never a run."""


class SimulatorUnavailable(RuntimeError):
    """The endpoint fails too often (``OpenAIChat``'s failure rate): stops the run. Not a ``UserSimError``, so no
    episode swallows it."""


# --- instructions ----------------------------------------------------------------------------------------


def _indent(text: str) -> str:
    return "\n".join("\t" + line for line in str(text).splitlines() or [""])


def scenario_text(user_scenario: dict | str) -> str:
    """A tau2 ``user_scenario`` rendered for the simulator: ``Persona:`` (when given) and ``Instructions:``, the
    structured instructions one field per heading (domain, reason for call, known info, unknown info, task
    instructions; absent fields left out), free-text instructions as they are."""
    if isinstance(user_scenario, str):
        user_scenario = {"instructions": user_scenario}
    if not isinstance(user_scenario, dict) or not user_scenario.get("instructions"):
        raise ValueError(f"a tau2 user_scenario needs 'instructions', got {user_scenario!r:.200}")
    lines = []
    if user_scenario.get("persona"):
        lines += ["Persona:", _indent(user_scenario["persona"])]
    ins = user_scenario["instructions"]
    if isinstance(ins, dict):
        fields = [("Domain", "domain"), ("Reason for call", "reason_for_call"), ("Known info", "known_info"),
                  ("Unknown info", "unknown_info"), ("Task instructions", "task_instructions")]
        body = []
        for title, key in fields:
            value = ins.get(key)
            if not value:
                continue
            body += [f"Domain: {value}"] if key == "domain" else [f"{title}:", _indent(value)]
        if not any(ins.get(k) for k in ("reason_for_call", "task_instructions")):
            raise ValueError("structured tau2 instructions need reason_for_call or task_instructions")
        text = "\n".join(body)
    else:
        text = str(ins)
    lines += ["Instructions:", _indent(text)]
    return "\n".join(lines)


def system_prompt(user_scenario: dict | str) -> str:
    """The simulator's system prompt: the guidelines, then the scenario inside ``<scenario>`` tags."""
    return f"{GUIDELINES}\n\n<scenario>\n{scenario_text(user_scenario)}\n</scenario>"


def flipped_messages(transcript: list[dict]) -> list[dict]:
    """The conversation as the simulating model sees it: the agent's turns (``agent``) as ``user`` messages,
    the customer's own (``user``) as ``assistant`` messages (with their ``tool_calls`` where the customer called its
    tools), the results of those calls as ``tool`` messages."""
    out = []
    for m in transcript:
        if m["role"] == "tool":
            out.append({"role": "tool", "name": m["name"], "content": m["content"]})
        elif "tool_calls" in m:
            out.append({"role": "assistant", "content": m["content"], **({"tool_calls": m["tool_calls"]}
                                                                         if m["tool_calls"] else {})})
        else:
            out.append({"role": "user" if m["role"] == "agent" else "assistant", "content": m["content"]})
    return out


_THINK = re.compile(r"<think>.*?(</think>|$)", re.S)
_TOOL_MARKUP = re.compile(r"</?tool_call>|</?tool_response>")


def clean_reply(text: str | None) -> str:
    """The customer's message from a raw generation: ``<think>`` blocks removed, whitespace stripped. Raises
    ``UserSimError`` when nothing is left or the reply holds tool-call markup."""
    if not isinstance(text, str):
        raise UserSimError(f"no text in the simulator's reply ({type(text).__name__})")
    out = _THINK.sub("", text)
    if "</think>" in out:  # the chat template opened the think block in the prompt: only its end was generated
        out = out.rsplit("</think>", 1)[1]
    out = out.strip()
    if not out:
        raise UserSimError("empty reply")
    if _TOOL_MARKUP.search(out):
        raise UserSimError(f"the reply holds tool-call markup (the customer has no tools): {out[:120]!r}")
    return out


def read_tool_reply(reply: Any) -> tuple[str, list[ToolCall | ToolCallError]]:
    """A reply to a prompt that offered tools: (its text, its tool calls). ``reply`` is raw generated text (tool calls
    as ``<tool_call>`` markup: the hf / vllm backends) or a dict ``{"content", "tool_calls"}`` (the ``openai``
    backend: ``ToolCall`` s, or ``{"name", "arguments"}`` dicts). The text keeps ``<think>`` blocks for
    ``clean_reply`` when there are no calls."""
    if isinstance(reply, dict):
        calls = []
        for c in reply.get("tool_calls") or []:
            if isinstance(c, (ToolCall, ToolCallError)):
                calls.append(c)
            elif isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("arguments", {}), dict):
                calls.append(ToolCall(c["name"], dict(c.get("arguments") or {})))
            else:
                calls.append(ToolCallError(f"unreadable tool call {str(c)[:120]!r}", str(c)))
        content = reply.get("content") or ""
        return (parse_assistant(content).content if calls else content), calls
    if not isinstance(reply, str):
        raise UserSimError(f"no text in the simulator's reply ({type(reply).__name__})")
    parsed = parse_assistant(reply)
    return (parsed.content if parsed.calls else reply), list(parsed.calls)


# --- backends: messages in, text out -------------------------------------------------------------------------


class Chat(Protocol):
    """A simulating model: chat messages (system, user, assistant, and for a customer with tools assistant
    ``tool_calls`` and ``tool`` results) in, the next assistant reply out: its text, or with ``tools`` (OpenAI
    schemas) text that may call them, or ``{"content", "tool_calls"}``. Raises ``UserSimError`` on failure. A chat
    is called with ``tools`` only when the customer has tools."""

    def __call__(self, messages: list[dict], tools: list[dict] | None = None) -> str | dict: ...


class PolicyChat:
    """One of the suite's policies (``HFPolicy``, ``VLLMPolicy``) as a simulator backend: the conversation goes
    through the policy's chat template as a task without tools; ``max_new_tokens`` tokens per message."""

    def __init__(self, policy, max_new_tokens: int = 256):
        self.policy = policy
        self.max_new_tokens = max_new_tokens
        self.name = f"policy:{getattr(policy, 'name', type(policy).__name__)}"
        self._task = Task(id="user-simulator", domain="user_sim", benchmark="user_sim", system_prompt="",
                          user_prompt="")

    def __call__(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        if hasattr(self.policy, "max_new_tokens"):
            self.policy.max_new_tokens = self.max_new_tokens
        msgs = list(messages)
        # With tools: the chat template renders their schemas, the reply's calls come back as <tool_call> markup.
        task = self._task if not tools else Task(id="user-simulator-tools", domain="user_sim", benchmark="user_sim",
                                                  system_prompt="", user_prompt="", tools=list(tools))
        try:
            with outside_zero3():  # a local model, whole on this rank: generate() must not sync with other ranks
                (text,) = self.policy([(task, msgs)])
        finally:
            if hasattr(self.policy, "forget"):
                self.policy.forget(task, msgs)
        if text is None:  # HFPolicy's context guard
            raise UserSimError("context limit: the conversation no longer fits the simulating model's context")
        return text


class OpenAIChat:
    """A client of an OpenAI-compatible ``POST {url}/chat/completions`` (non-streaming), standard library only.

    A connection error, a timeout, 429 and 502-504 are retried ``retries`` times with exponential backoff
    (``backoff_s``, twice that, ... up to ``max_backoff_s``, each with up to 50% jitter so concurrent episodes do not
    retry in step), or after the server's ``Retry-After`` where it sends one (seconds or an HTTP date; at most
    ``max_backoff_s``). Any other non-200 answer fails the turn at once: a 500 from ``transformers serve`` means it
    could not parse the response, and the same greedy request would fail again. A failed request (``UserSimError``)
    ends its episode with reward 0, which a run can afford now and then, not as a habit: when more than
    ``max_failure_rate`` of the last ``FAILURE_WINDOW`` requests (after ``FAILURE_MIN_REQUESTS``) failed, the
    call raises ``SimulatorUnavailable`` instead, which stops the run (training on zero rewards that are the
    endpoint's fault, or scoring them, would spoil it). The key, when ``api_key_env`` names a variable, goes in
    ``Authorization: Bearer``.
    """

    RETRY_STATUS = {429, 502, 503, 504}
    FAILURE_WINDOW = 50  # the requests the failure rate is measured over
    FAILURE_MIN_REQUESTS = 20  # before which no rate is judged

    def __init__(self, url: str, model: str, api_key_env: str = "", temperature: float = 0.0,
                 max_new_tokens: int = 256, timeout_s: float = 120.0, retries: int = 2, concurrency: int = 1,
                 top_p: float | None = None, key_setting: str = "worlds.user_sim.api_key_env",
                 backoff_s: float = 1.0, max_backoff_s: float = 60.0, max_failure_rate: float = 0.2,
                 rate_setting: str = "worlds.user_sim.max_failure_rate"):
        # top_p: sent when given (a sampling teacher: sft.teacher_top_p); key_setting / rate_setting: the config keys
        # an error about a missing API key / a failing endpoint names
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_failure_rate = max_failure_rate
        self.rate_setting = rate_setting
        self._outcomes: deque[bool] = deque(maxlen=self.FAILURE_WINDOW)  # True = the request failed
        self._lock = threading.Lock()
        self.url = url.rstrip("/") + "/chat/completions"
        self.top_p = top_p
        self.concurrency = concurrency  # requests it may have in flight (each call is independent: thread-safe)
        self.model = model
        self.name = f"openai:{model}@{url}"
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.timeout_s = timeout_s
        self.retries = retries
        self.api_key = None
        if api_key_env:
            self.api_key = os.environ.get(api_key_env)
            if not self.api_key:
                raise ConfigError(f"{key_setting}={api_key_env!r}: the environment variable "
                                  f"{api_key_env} is not set (it must hold the API key of {url})")

    def _post(self, body: bytes) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            return json.loads(resp.read().decode("utf-8"))

    def __call__(self, messages: list[dict], tools: list[dict] | None = None) -> str | dict:
        request = {"model": self.model, "messages": openai_messages(messages), "temperature": self.temperature,
                   "max_tokens": self.max_new_tokens, "stream": False}
        if self.top_p is not None:
            request["top_p"] = self.top_p
        if tools:
            request["tools"] = tools
        body = json.dumps(request).encode()
        try:
            reply = self._request(body, tools)
        except UserSimError as exc:
            self._record(failed=True, error=str(exc))
            raise
        self._record(failed=False)
        return reply

    def backoff(self, attempt: int, retry_after: str | None = None) -> float:
        """Seconds to wait before try ``attempt`` (1, 2, ...): the server's ``Retry-After`` where it gives one,
        else ``backoff_s * 2**(attempt-1)`` with up to 50% jitter; never more than ``max_backoff_s``."""
        wait = _retry_after_seconds(retry_after)
        if wait is None:
            wait = self.backoff_s * 2 ** (attempt - 1) * (0.5 + random.random() / 2)
        return max(0.0, min(wait, self.max_backoff_s))

    def _request(self, body: bytes, tools: list[dict] | None) -> str | dict:
        last, retry_after = "", None
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff(attempt, retry_after))
            retry_after = None
            try:
                out = self._post(body)
            except urllib.error.HTTPError as exc:
                detail = exc.read(300).decode("utf-8", "replace").strip()
                last = f"HTTP {exc.code} from {self.url}" + (f": {detail}" if detail else "")
                if exc.code in self.RETRY_STATUS:
                    retry_after = exc.headers.get("Retry-After") if exc.headers else None
                    continue
                raise UserSimError(last) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
                last = f"cannot reach {self.url} ({getattr(exc, 'reason', None) or exc})"
                continue
            except ValueError as exc:
                raise UserSimError(f"{self.url} answered with something that is not JSON ({exc})") from None
            try:
                msg = out["choices"][0]["message"]
            except (KeyError, IndexError, TypeError):
                raise UserSimError(f"{self.url} answered without choices[0].message: {str(out)[:200]}") from None
            if tools:
                return {"content": msg.get("content") or "", "tool_calls": [_openai_call(c) for c in
                                                                            msg.get("tool_calls") or []]}
            if msg.get("tool_calls") and not msg.get("content"):
                raise UserSimError("the reply is a tool call (the customer has no tools)")
            return msg.get("content") or ""
        raise UserSimError(last + f" (after {self.retries + 1} tries)")

    def _record(self, failed: bool, error: str = "") -> None:
        """Count a request's outcome; raise ``SimulatorUnavailable`` when the recent failure rate is too high."""
        with self._lock:
            self._outcomes.append(failed)
            n, bad = len(self._outcomes), sum(self._outcomes)
        if failed and n >= self.FAILURE_MIN_REQUESTS and bad / n > self.max_failure_rate:
            where = f", {self.rate_setting}" if self.rate_setting else ""
            raise SimulatorUnavailable(
                f"{self.name}: {bad} of the last {n} requests failed (more than {self.max_failure_rate:.0%}{where}); "
                f"the last: {error}. The run stops here rather than train on, or score, "
                "episodes that failed for the endpoint's sake. Check the endpoint and its rate limits (more "
                "retries: worlds.user_sim.retries / max_backoff_s), then run the same command again: it resumes.")


def _retry_after_seconds(value: str | None) -> float | None:
    """A ``Retry-After`` header as seconds from now (it is either a number of seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return when.timestamp() - time.time() if when is not None else None


def openai_messages(messages: list[dict]) -> list[dict]:
    """Messages in the OpenAI chat format: an assistant's ``tool_calls`` get ids (``call_0``, ``call_1``, ... in
    order) and each ``tool`` result the ``tool_call_id`` of the call it answers (results follow their calls in
    order). Messages without tool traffic pass unchanged."""
    out, pending, n = [], [], 0
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                calls.append({"id": f"call_{n}", "type": "function", "function": dict(c["function"])})
                pending.append(f"call_{n}")
                n += 1
            out.append({"role": "assistant", "content": m.get("content") or None, "tool_calls": calls})
        elif m.get("role") == "tool":
            out.append({"role": "tool", "tool_call_id": pending.pop(0) if pending else f"call_{n}",
                        "content": m.get("content") or ""})
        else:
            out.append(m)
    return out


def _openai_call(c: Any) -> ToolCall | ToolCallError:
    """One ``tool_calls`` entry of an OpenAI reply (arguments a JSON string) as a ``ToolCall``."""
    try:
        fn = c["function"]
        args = fn.get("arguments") or "{}"
        args = json.loads(args) if isinstance(args, str) else args
        if not isinstance(fn["name"], str) or not isinstance(args, dict):
            raise ValueError("name must be a string and arguments an object")
        return ToolCall(fn["name"], args)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return ToolCallError(f"unreadable tool call ({exc})", str(c)[:300])


_SIMULATORS: dict[str, Chat] = {}

# How a local simulating model (backends hf, vllm) is loaded: ``factory(cfg, model) -> policy``, a policy of the
# evaluation layer (a batch of (task, messages) -> texts). That layer is above this one, so it hands its factory
# down (``acl_lib.eval.policies`` does when it is imported, as the harness does) instead of being imported here.
LocalPolicy = Callable[[UserSimConfig, str], Any]
_LOCAL_POLICY: LocalPolicy | None = None


def use_local_policy(factory: LocalPolicy | None) -> None:
    """Set how this process loads the simulating model of the local backends (``hf``, ``vllm``): ``factory(cfg,
    model)`` returns a policy for ``model`` (a directory or hub id) with ``cfg``'s settings (``None``: unset)."""
    global _LOCAL_POLICY
    _LOCAL_POLICY = factory


@contextmanager
def outside_zero3():
    """Load and run a model as a plain local model, in a DeepSpeed ZeRO-3 training process too (the simulated
    customer here; MMOPD's frozen teachers, ``consolidate.mmopd.teachers.TeacherPool``). Under
    ZeRO-3 (a GRPO job of the paper profile, whose rollouts play the customer) transformers' ``from_pretrained``
    partitions every model it loads across the ranks, so the simulator's weights were empty placeholders ("'weight'
    must be 2-D" at its first turn), and ``generate`` all-reduces after every token (``synced_gpus``), so a rank
    whose customer spoke while the other rank's did not waited forever. The customer is no part of the trained
    model: every rank keeps its own full copy and generates alone. Both found by the hostfile rehearsal."""
    try:
        from transformers.integrations import deepspeed as hf_ds
    except ImportError:  # pragma: no cover - transformers is a dependency
        yield
        return
    ref = hf_ds._hf_deepspeed_config_weak_ref
    hf_ds._hf_deepspeed_config_weak_ref = None
    try:
        yield
    finally:
        hf_ds._hf_deepspeed_config_weak_ref = ref


def simulator_for(cfg: UserSimConfig, local_policy: LocalPolicy | None = None) -> Chat:
    """The simulating model of ``cfg``, built once per process (a local model is loaded once and shared).

    ``local_policy``: how to load a local model (backends hf, vllm), in place of the one set by ``use_local_policy``."""
    if cfg.backend == "none":
        raise ConfigError(
            "an episode without a structured user scenario (a real tau2 retail, telecom or mock episode) needs the LLM "
            "user simulator. Set worlds.user_sim.backend (hf, vllm or openai) and worlds.user_sim.model (and, for "
            "openai, worlds.user_sim.url and api_key_env); see acl_lib/envs/llm_user.py")
    key = json.dumps(cfg.model_dump(mode="json", exclude={"max_turns"}), sort_keys=True)  # max_turns: per episode
    if key not in _SIMULATORS:
        if cfg.backend == "openai":
            chat: Chat = OpenAIChat(cfg.url, cfg.model, cfg.api_key_env, cfg.temperature, cfg.max_new_tokens,
                                    cfg.timeout_s, cfg.retries, cfg.concurrency, backoff_s=cfg.backoff_s,
                                    max_backoff_s=cfg.max_backoff_s, max_failure_rate=cfg.max_failure_rate)
        else:
            factory = local_policy or _LOCAL_POLICY
            if factory is None:
                raise RuntimeError(
                    f"worlds.user_sim.backend={cfg.backend} plays the customer with one of the suite's policies, and "
                    "none was handed to this process (acl_lib.envs.llm_user.use_local_policy; importing "
                    "acl_lib.eval.policies or acl_lib.eval.harness hands it its own)")
            # a relative directory is the checkout's (acl_lib/data/mini_base), wherever the process runs (notebooks/)
            local = project_root() / cfg.model
            model = str(local) if not Path(cfg.model).is_absolute() and local.is_dir() else cfg.model
            with outside_zero3():
                policy = factory(cfg, model)
            chat = PolicyChat(policy, cfg.max_new_tokens)
        _SIMULATORS[key] = chat
    return _SIMULATORS[key]


# --- the simulated customer ---------------------------------------------------------------------------------


class LLMUser:
    """The customer of one conversation, played by ``chat`` following ``user_scenario`` (tau2 schema).

    ``first_message()`` answers the greeting; ``reply(agent_text)`` answers an agent message. Neither raises: a
    failed turn sets ``error`` and returns ``""``; a message with a signal sets ``signal`` (``stop``,
    ``transfer``, ``out_of_scope``); the ``max_turns``-th message sets ``cut_off``. ``transcript`` holds the
    exchange (``{"role": "user"|"agent", "content"}``), the greeting first; with tools (``attach_tools``) also the
    customer's calls (``{"role": "user", "content", "tool_calls"}``) and their results (``{"role": "tool", "name",
    "content"}``), which only the simulator sees. ``tool_calls`` lists every call with its result (the record).
    """

    def __init__(self, user_scenario: dict | str, chat: Chat | Callable[[list[dict]], str], max_turns: int = 30,
                 max_tool_calls: int = 10):
        self.system_prompt = system_prompt(user_scenario)
        self.chat = chat
        self.max_turns = max_turns
        self.max_tool_calls = max_tool_calls  # per message to the agent
        self.tools: list[dict] = []
        self.run_tool: Callable[[str, dict], str] | None = None
        self.tool_calls: list[dict] = []
        self.transcript: list[dict] = [{"role": "agent", "content": GREETING}]
        self.signal: str | None = None
        self.error: str | None = None
        self.cut_off = False

    def attach_tools(self, tools: list[dict], run_tool: Callable[[str, dict], str]) -> None:
        """Give the customer tools (OpenAI schemas) and the function running one call (``(name, arguments) ->
        result text``, never raising); the guidelines then say how to use them. Before the first message."""
        self.tools, self.run_tool = list(tools), run_tool
        self.system_prompt = self.system_prompt.replace(GUIDELINES, f"{GUIDELINES}\n\n{TOOL_GUIDELINES}", 1)

    @property
    def said(self) -> list[str]:
        return [m["content"] for m in self.transcript if m["role"] == "user" and "tool_calls" not in m]

    @property
    def done(self) -> bool:
        return bool(self.signal or self.error or self.cut_off)

    def prompt(self) -> list[dict]:
        """The messages the simulating model is given for its next turn."""
        return [{"role": "system", "content": self.system_prompt}] + flipped_messages(self.transcript)

    def _reply_text(self) -> str:
        """The customer's next message to the agent; with tools, after running the calls it makes first."""
        if not self.tools:
            return clean_reply(self.chat(self.prompt()))
        made = 0
        while True:
            content, calls = read_tool_reply(self.chat(self.prompt(), tools=self.tools))
            if not calls:
                return clean_reply(content)
            made += len(calls)
            if made > self.max_tool_calls:
                raise UserSimError(f"more than {self.max_tool_calls} tool calls before one message to the agent")
            good = [c for c in calls if isinstance(c, ToolCall)]
            # the key marks a tool step (even when every call was malformed): never a message to the agent
            self.transcript.append({"role": "user", "content": content, "tool_calls": [c.to_message() for c in good]})
            for c in calls:
                if isinstance(c, ToolCall):
                    result = self.run_tool(c.name, c.arguments)
                    name = c.name
                else:  # the simulator reads why, as the agent does from its own malformed calls
                    result, name = f"Error: {c.reason}", "invalid"
                self.transcript.append({"role": "tool", "name": name, "content": result})
                self.tool_calls.append({"name": name, "arguments": getattr(c, "arguments", None), "result": result})

    def _turn(self) -> str:
        if self.done:
            return ""
        try:
            text = self._reply_text()
        except UserSimError as exc:
            self.error = str(exc)
            return ""
        self.transcript.append({"role": "user", "content": text})
        self.signal = next((name for token, name in SIGNALS.items() if token in text), None)
        if not self.signal and len(self.said) >= self.max_turns:
            self.cut_off = True
        return text

    def first_message(self) -> str:
        """The customer's opening message (the answer to ``GREETING``); idempotent."""
        return self.said[0] if self.said else self._turn()

    def reply(self, agent_text: str) -> str:
        """The customer's answer to ``agent_text`` (``""`` once the conversation is over or the turn failed)."""
        if self.done:
            return ""
        self.transcript.append({"role": "agent", "content": agent_text if isinstance(agent_text, str) else ""})
        return self._turn()


class LLMUserEpisode(DeskEpisode):
    """A desk episode (``desk.DeskEpisode``: the domain's tools and check) whose customer is an ``LLMUser``.

    The customer's first message replaces the task's ``user_prompt`` (which, for real tasks, is only the reason
    for the call). Scored as tau2 does: the desk's check when the conversation ended by a customer signal or a
    successful transfer by the agent, else 0 (see the module docstring). Where the desk gives the customer tools
    (``Desk.user_tools``), the customer gets them over this episode's toolkit before its first message; their
    traffic stays in ``user.transcript`` (and the record's ``user_sim.tool_calls``), never in ``messages``.
    """

    def __init__(self, task: Task, desk: Desk, user: LLMUser, max_turns: int = 16):
        super().__init__(task, desk, max_turns=max_turns)
        self.user = user  # replaces the rule-based user DeskEpisode made
        box = desk.user_tools(self.toolkit)
        if box is not None:
            user.attach_tools(*box)
        # > 1: the evaluator may step this many such episodes at once (their simulator is a remote endpoint)
        self.step_concurrency = int(getattr(user.chat, "concurrency", 1))
        first = user.first_message()
        self.messages[-1] = {"role": "user", "content": first}
        if user.done:  # failed, signalled or cut off at the first message
            self.done = True

    def on_text(self, content: str) -> list[dict]:
        reply = self.user.reply(content)
        if self.user.done:
            self.done = True
        return [{"role": "user", "content": reply}] if reply else []

    def _score(self) -> float:
        if self.user.error:
            self.failure = f"user simulator failed: {self.user.error}"
            return 0.0
        if not (self.user.signal or self.transferred):
            why = (f"user turn limit ({self.user.max_turns} messages) reached" if self.user.cut_off
                   else self.end_reason or "the conversation did not end")
            self.failure = f"ended before the customer finished: {why}"
            return 0.0
        return super()._score()

    def record(self) -> dict:
        rec = super().record()
        rec["user_sim"] = {"signal": self.user.signal, "error": self.user.error, "cut_off": self.user.cut_off,
                           "model": getattr(self.user.chat, "name", type(self.user.chat).__name__)}
        if self.user.tools:  # what the customer did on its own side (the agent saw none of it)
            rec["user_sim"]["tool_calls"] = list(self.user.tool_calls)
        return rec


def preflight(worlds, envs: set[str]) -> None:
    """Build the simulator the real desk tasks of ``envs`` will need (``worlds.data_dir`` set; retail and telecom
    always need one, mock only when one is configured), so a missing simulator or API key fails before any scoring."""
    if not getattr(worlds, "data_dir", "") or not {"retail", "mock", "telecom"} & set(envs):
        return
    if worlds.user_sim.backend != "none" or {"retail", "telecom"} & set(envs):
        simulator_for(worlds.user_sim)


def start_episode(task: Task, desk: Desk, cfg: UserSimConfig, max_turns: int = 16) -> LLMUserEpisode:
    """An ``LLMUserEpisode`` for a real tau2 ``task`` (its ``meta["user_scenario"]``) with ``cfg``'s simulator."""
    scenario = (task.meta or {}).get("user_scenario")
    if not scenario:
        raise ConfigError(f"task {task.id} has neither a structured scenario nor a tau2 user_scenario to play")
    user = LLMUser(scenario, simulator_for(cfg), max_turns=cfg.max_turns)
    return LLMUserEpisode(task, desk, user, max_turns=max_turns)


# --- serving one of our models as a simulator --------------------------------------------------------------

# A response template that reads the whole reply as text: no tool-call field to fail parsing on.
TEXT_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "fields": {"content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"}},
    "start_anchor": "<|im_start|>assistant\n",
}


def serving_copy(model_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """A copy of ``model_dir`` for ``transformers serve`` as a user simulator; returns ``out_dir``.

    ``transformers serve`` parses every response with the tokenizer's ``response_template`` and answers HTTP 500
    (400 when the arguments are not JSON) when a response holds a malformed tool call (docs/stack-notes.md).
    Dropping the template does not help with a Qwen3 model: serve then falls back to its built-in Qwen3 template,
    tool calls included. So the copy's ``tokenizer_config.json`` carries ``TEXT_RESPONSE_TEMPLATE`` (content only).
    Weights are linked, not copied.
    """
    src, dst = Path(model_dir), Path(out_dir)
    if not (src / "tokenizer_config.json").is_file() or not (src / "config.json").is_file():
        raise FileNotFoundError(f"{src} is not a model directory (needs config.json and tokenizer_config.json)")
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name != "tokenizer_config.json" and not (dst / f.name).exists():
            (dst / f.name).symlink_to(f.resolve())
    conf: dict[str, Any] = json.loads((src / "tokenizer_config.json").read_text())
    conf["response_template"] = TEXT_RESPONSE_TEMPLATE
    (dst / "tokenizer_config.json").write_text(json.dumps(conf, indent=2))
    return dst
