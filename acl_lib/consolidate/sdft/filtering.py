"""SDFT's filter (``filter_episodes``): a trajectory an oracle sampled is kept only if, in this order (the first
failed test is the one counted, ``filter.json``):

1. **reward**: its final reward is 1.0;
2. **protocol**: no protocol error (every tool call well formed, known, with valid arguments) and it follows the
   protocol (``protocol_violation``): the environment ended it (not the turn limit, a context overflow or an
   unfinished episode), no turn was cut off at the token budget, and the end is an end of the protocol:
   math, a single answer whose last non-empty line is ``Answer: <value>`` (the DAPO prompt's format; the
   scorer would also take an ``Answer:`` line earlier, or a ``\\boxed{}``); IF, a single answer; neither
   with tool-call markup or an unclosed ``<think>``; search, a last turn without a tool call that holds the
   ``<answer>`` and no ``<answer>`` in an earlier turn (a tool call after an answer); the retail desk, a last
   assistant turn without a tool call (the user ended the conversation) unless that call was the transfer to a
   human, which ends a desk episode by the protocol;
3. **duplicates**: within a domain, in sampling order, a trajectory whose normalised assistant text (every
   assistant turn's text and tool calls, lowercased, whitespace collapsed) shares a Jaccard similarity above
   ``sdft.dedup_threshold`` of word ``sdft.dedup_ngram``-grams with one kept before it is dropped.

A kept trajectory becomes a row: the chat row the cold starts train on (``train.sft.episode_row``) plus its
domain, task id, sample index, task difficulty and length.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence

from acl_lib.chat import THINK_CLOSE, THINK_OPEN, TOOL_CALL_OPEN, strip_think
from acl_lib.envs.base import SingleTurnEpisode, ToolEpisode
from acl_lib.envs.search import extract_answer
from acl_lib.train.sft import assistant_text, episode_row  # assistant_text: what dedup compares

_ANSWER_LINE = re.compile(r"^[*\s]*answer[*\s]*:", re.I)


def _assistant_turns(messages: list[dict]) -> list[dict]:
    return [m for m in messages if m.get("role") == "assistant"]


def protocol_violation(ep, cut: bool = False) -> str | None:
    """Why the finished episode ``ep`` does not follow its protocol, or None (see the module docstring, step 2).

    ``cut``: a turn of it ended at the token budget rather than at a stop token (``_CutWatch``)."""
    if not ep.done:
        return "not finished"
    if ep.end_reason:
        return f"not ended by the environment: {ep.end_reason}"
    if cut:
        return "a turn was cut off at the token budget"
    turns = _assistant_turns(ep.messages)
    if not turns:
        return "no assistant turn"
    if any(m.get("malformed_calls") for m in turns):
        return "malformed tool call"
    last = turns[-1]
    if isinstance(ep, SingleTurnEpisode):
        text = ep.response or ""
        if TOOL_CALL_OPEN in text:
            return "tool-call markup in a single-turn answer"
        if text.count(THINK_OPEN) != text.count(THINK_CLOSE):
            return "unclosed <think>"
        shown = strip_think(text) if THINK_OPEN in text or THINK_CLOSE in text else text
        if not shown.strip():
            return "empty answer"
        if ep.task.domain == "math" and ep.task.meta.get("format") != "mcq":
            lines = [ln for ln in shown.splitlines() if ln.strip()]
            if not _ANSWER_LINE.match(lines[-1]):
                return "the last line is not 'Answer: <value>'"
        return None
    if isinstance(ep, ToolEpisode):
        if last.get("tool_calls"):
            names = [c["function"]["name"] for c in last["tool_calls"]]
            if getattr(ep, "transferred", False) and "transfer_to_human_agents" in names:
                return None  # a desk's transfer hands the conversation over: the protocol's own end
            return "ended on a tool call"
        if ep.task.domain == "search":
            if extract_answer(last.get("content") or "") is None:
                return "no <answer> in the final turn"
            if any("<answer>" in (m.get("content") or "") for m in turns[:-1]):
                return "a tool call after an answer"
        return None
    return None


def ngrams(text: str, n: int) -> frozenset:
    """Word ``n``-grams of ``text`` (a text of fewer than ``n`` words is one gram of all its words)."""
    words = text.split()
    if len(words) < n:
        return frozenset([tuple(words)]) if words else frozenset()
    return frozenset(tuple(words[i:i + n]) for i in range(len(words) - n + 1))


def jaccard(a: frozenset, b: frozenset) -> float:
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def dedup(texts: Sequence[str], threshold: float, n: int) -> list[int]:
    """Indices of ``texts`` kept, in order: each is dropped when its ``n``-gram Jaccard similarity to one kept
    before it is above ``threshold``."""
    kept: list[int] = []
    grams: list[frozenset] = []
    for i, t in enumerate(texts):
        g = ngrams(t, n)
        if any(jaccard(g, h) > threshold for h in grams):
            continue
        kept.append(i)
        grams.append(g)
    return kept


def task_difficulty(task) -> float | None:
    """The task's difficulty from ``task.meta``: ``difficulty``, else ``level``, else the number of ``hops``."""
    meta = task.meta or {}
    for key in ("difficulty", "level"):
        v = meta.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    if isinstance(meta.get("hops"), list):
        return float(len(meta["hops"]))
    return None


def episode_length(messages: list[dict]) -> int:
    """Characters of the assistant turns (text and tool calls): the length ``difficulty`` order ranks by."""
    n = 0
    for m in _assistant_turns(messages):
        n += len(m.get("content") or "")
        for c in m.get("tool_calls") or []:
            a = c["function"]["arguments"]
            n += len(c["function"]["name"]) + len(a if isinstance(a, str) else json.dumps(a))
    return n


def judge_episode(domain: str, ep, was_cut: bool = False, sample: int = 0) -> dict:
    """One finished episode's verdict before the near-duplicate filter (picklable: a shard of the sampling sends
    its verdicts back): ``{"failed": "reward" | "protocol", "reason": ...}``, or ``{"failed": None, "row": the
    chat row with its domain, task id, sample, difficulty, length and turns, "text": its assistant_text}``.
    ``was_cut``: a turn was cut at the token budget."""
    if ep.reward() < 1.0:
        return {"failed": "reward", "reason": (ep.failure or "reward below 1").split(":")[0][:80]}
    why = ("protocol error: " + ep.protocol_errors[0]) if ep.protocol_errors else protocol_violation(ep, was_cut)
    if why:
        return {"failed": "protocol", "reason": why.split(":")[0][:80] if why.startswith("not ended") else why[:80]}
    row = episode_row(ep.messages, ep.task.tools)
    row.update(domain=domain, task_id=ep.task.id, sample=int(sample), difficulty=task_difficulty(ep.task),
               length=episode_length(ep.messages), turns=ep.turns)
    return {"failed": None, "row": row, "text": assistant_text(ep.messages)}


def filter_episodes(domain: str, episodes: list, cut: set | frozenset = frozenset(), threshold: float = 0.9,
                    n: int = 3, samples: Sequence[int] | None = None) -> tuple[list[dict], dict]:
    """The filter of the module docstring over finished ``episodes`` of ``domain`` (sampling order). ``cut``:
    ``id(episode.messages)`` of the episodes with a turn cut at the token budget. Returns ``(rows, stats)``;
    ``stats`` has ``tried``, ``reward_failed``, ``protocol_failed``, ``duplicates``, ``kept`` and the reasons."""
    verdicts = [judge_episode(domain, ep, id(ep.messages) in cut, samples[i] if samples else 0)
                for i, ep in enumerate(episodes)]
    return filter_verdicts(verdicts, threshold, n)


def filter_verdicts(verdicts: list[dict], threshold: float = 0.9, n: int = 3) -> tuple[list[dict], dict]:
    """``filter_episodes`` from the episodes' ``judge_episode`` verdicts (sampling order; a sharded sampling's
    verdicts, merged back into that order): the reward and protocol failures counted by reason, then the
    near-duplicates of the passed ones dropped across the whole domain."""
    reasons = {"reward": Counter(), "protocol": Counter()}
    stats = {"tried": len(verdicts), "reward_failed": 0, "protocol_failed": 0, "duplicates": 0, "kept": 0}
    passed = []
    for v in verdicts:
        if v["failed"]:
            stats[f"{v['failed']}_failed"] += 1
            reasons[v["failed"]][v["reason"]] += 1
        else:
            passed.append(v)
    keep = dedup([v["text"] for v in passed], threshold, n)
    stats["duplicates"] = len(passed) - len(keep)
    rows = [passed[j]["row"] for j in keep]
    stats["kept"] = len(rows)
    stats["acceptance"] = stats["kept"] / stats["tried"] if stats["tried"] else 0.0
    stats["reasons"] = {k: dict(v.most_common()) for k, v in reasons.items()}
    return rows, stats
