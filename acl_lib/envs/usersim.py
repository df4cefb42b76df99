"""A deterministic, rule-based simulated customer for the tool-use desks (retail, mock, telecom),
whose turns ``desk.DeskEpisode`` plays.

The user is described by a *scenario* (JSON-serialisable, stored in ``Task.answer``/``Task.meta``)::

    {"request": "I want to cancel an order.",            # said first, verbatim
     "auth": {"email": "a@b.com"}                         # or {"name": "First Last", "zip": "12345"}
                                                          # or {"user_id": "ann_lee_123"}
     "details": {"order": "#W123", "reason": "no longer needed"},   # keyword -> answer (verbatim)
     "confirm": "yes",                                    # said when asked for confirmation
     "max_turns": 10}                                     # user messages, the first one included

``reply(agent_text)`` applies these rules, in this order, and returns the first that fires:

1. The user has already said ``max_turns`` messages (or has stopped) -> ``"###STOP###"``.
2. Only *asking sentences* of the agent's message are read: a sentence ending in ``?``, containing
   ``(yes/no)`` / ``yes or no``, or starting with a request or question word (``please``, ``could you``,
   ``can you``, ``would you``, ``will you``, ``kindly``, ``let me know``, ``tell me``, ``may i``, ``what``,
   ``which``, ``who``, ``when``, ``where``, ``how``, ``do you``, ``shall i``, ``should i``). A statement
   ("Your order was cancelled.") asks for nothing, so "I can confirm the refund." does not trigger a "yes".
3. An asking sentence asks for identification (identify, authenticate, verify your, email, zip, postal,
   user id, your name, full name) and the user has not identified yet -> the auth sentence
   ("My email is a@b.com." / "My name is First Last and my zip code is 12345." / "My user id is x.").
4. An asking sentence asks for confirmation (confirm, proceed, go ahead, shall i, should i, yes/no,
   yes or no) -> ``scenario["confirm"]`` (default ``"yes"``).
5. Asking sentences name one or more detail keywords (case-insensitive, at a word start; ``_`` in a
   key matches a space) -> those answers verbatim, in the scenario's key order, joined by a space.
6. An asking sentence asks for identification again (auth already given) -> the auth sentence again.
7. Anything else (the agent reports the request done, or asks for nothing the user knows) ->
   ``"Thank you, that's all. ###STOP###"``.

The simulator never raises on agent text (``None`` or non-strings count as an empty message) and
keeps the whole exchange in ``transcript`` (list of ``{"role": "user"|"agent", "content": str}``)
and what it disclosed in ``given`` (``"auth"``, ``"confirm"``, ``"details:<key>"``), for checks.
"""

from __future__ import annotations

import re
from typing import Any

STOP = "###STOP###"
THANKS_STOP = f"Thank you, that's all. {STOP}"

# Sentence split: after ., ! or ? followed by space/newline, and at newlines (agents write lists).
_SENT_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+")
# A sentence that opens with a request or a question word asks even without "?" (small models drop it).
_REQUEST_START = re.compile(
    r"^\W*(please|could you|can you|would you|will you|kindly|let me know|tell me|may i|"
    r"what|which|who|when|where|how|do you|shall i|should i)\b",
    re.I,
)
_YES_NO = re.compile(r"\(\s*yes\s*/\s*no\s*\)|\byes or no\b|\byes/no\b", re.I)
_AUTH_WORDS = re.compile(
    r"\bidentif|\bauthenticat|\bverify your\b|\be-?mail\b|\bzip\b|\bpostal\b|\buser[ _]?id\b|\byour name\b"
    r"|\bfull name\b",
    re.I,
)
_CONFIRM_WORDS = re.compile(r"\bconfirm|\bproceed\b|\bgo ahead\b|\bshall i\b|\bshould i\b", re.I)


def asking_sentences(text: str) -> list[str]:
    """The sentences of ``text`` that ask the user something (rule 2 of the module docstring)."""
    out = []
    for s in _SENT_SPLIT.split(text or ""):
        s = s.strip()
        if s and (s.endswith("?") or _YES_NO.search(s) or _REQUEST_START.search(s)):
            out.append(s)
    return out


def auth_sentence(auth: dict) -> str:
    """How the user identifies: one sentence built from the scenario's ``auth`` dict."""
    if not auth:
        return "I don't have any account details."
    if "email" in auth:
        return f"My email is {auth['email']}."
    if "name" in auth and "zip" in auth:
        return f"My name is {auth['name']} and my zip code is {auth['zip']}."
    if "user_id" in auth:
        return f"My user id is {auth['user_id']}."
    parts = [f"my {k.replace('_', ' ')} is {v}" for k, v in auth.items()]
    text = ", ".join(parts) + "."
    return text[0].upper() + text[1:]  # keep the values' case (ids, emails)


def _keyword_re(key: str) -> re.Pattern:
    words = re.escape(str(key).lower()).replace("_", "[ _]").replace(r"\ ", "[ _]")
    return re.compile(r"\b" + words, re.I)


class RuleUser:
    """A simulated customer following ``scenario`` with the deterministic rules of the module docstring."""

    def __init__(self, scenario: dict):
        scenario = scenario if isinstance(scenario, dict) else {}
        self.scenario = scenario
        self.request: str = str(scenario.get("request", ""))
        self.auth: dict = dict(scenario.get("auth") or {})
        self.details: dict[str, Any] = dict(scenario.get("details") or {})
        self.confirm: str = str(scenario.get("confirm", "yes"))
        self.max_turns: int = int(scenario.get("max_turns", 10))
        self.transcript: list[dict] = []
        self.given: list[str] = []
        self.stopped = False
        self._detail_res = {k: _keyword_re(k) for k in self.details}

    # --- what the user has said -----------------------------------------------------------------
    @property
    def said(self) -> list[str]:
        """Every user message so far, in order."""
        return [m["content"] for m in self.transcript if m["role"] == "user"]

    def _say(self, text: str) -> str:
        self.transcript.append({"role": "user", "content": text})
        if STOP in text:
            self.stopped = True
        return text

    # --- the conversation -------------------------------------------------------------------------
    def first_message(self) -> str:
        """The opening request (counts as the first of ``max_turns`` user messages)."""
        if self.transcript:  # idempotent: asking twice returns the same opening
            return self.said[0]
        return self._say(self.request)

    def reply(self, agent_text: str) -> str:
        """The next user message answering ``agent_text``; contains ``###STOP###`` when the user is done."""
        text = agent_text if isinstance(agent_text, str) else ""
        if not self.transcript:
            self.first_message()
        self.transcript.append({"role": "agent", "content": text})
        if self.stopped or len(self.said) >= self.max_turns:
            return self._say(STOP)
        asks = asking_sentences(text)
        asks_auth = any(_AUTH_WORDS.search(s) for s in asks)
        if asks_auth and "auth" not in self.given:
            self.given.append("auth")
            return self._say(auth_sentence(self.auth))
        if any(_CONFIRM_WORDS.search(s) or _YES_NO.search(s) for s in asks):
            self.given.append("confirm")
            return self._say(self.confirm)
        hits = [k for k, rx in self._detail_res.items() if any(rx.search(s) for s in asks)]
        if hits:
            self.given.extend(f"details:{k}" for k in hits)
            return self._say(" ".join(str(self.details[k]) for k in hits))
        if asks_auth:
            return self._say(auth_sentence(self.auth))
        return self._say(THANKS_STOP)
