"""Episodes to read: the evaluation records of a benchmark (``<run>/eval/records/<benchmark>.jsonl``) as
displayable transcripts, HTML in a notebook (the system prompt folded away) and text elsewhere."""

from __future__ import annotations

import json
from pathlib import Path


def read_records(eval_dir: str | Path, benchmark: str) -> list[dict]:
    """The episode records of one benchmark (``<eval_dir>/records/<benchmark>.jsonl``)."""
    path = Path(eval_dir) / "records" / f"{benchmark}.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"no records for {benchmark!r}: {path} does not exist (was it evaluated?)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Transcript:
    """One episode, displayable: HTML in a notebook (the system prompt folded away), text elsewhere."""

    MAX_CHARS = 700

    def __init__(self, record: dict):
        self.record = record

    def _messages(self):
        for m in self.record.get("messages", []):
            content = m.get("content") or ""
            for call in m.get("tool_calls") or []:
                fn = call.get("function", call)
                content += f"\n<tool_call> {fn.get('name')}({fn.get('arguments')})"
            for raw in m.get("malformed_calls") or []:
                content += f"\n<tool_call, malformed> {raw.strip()}"
            if len(content) > self.MAX_CHARS:
                content = content[: self.MAX_CHARS] + f" ... [{len(content) - self.MAX_CHARS} more characters]"
            yield m.get("role", "?"), m.get("name"), content.strip()

    def header(self) -> str:
        r = self.record
        verdict = "success" if r.get("reward", 0) >= 1.0 - 1e-9 else f"failure: {r.get('failure')}"
        return (f"{r.get('benchmark')} · {r.get('id')} · reward {r.get('reward', 0):.2f} · {r.get('turns')} turns · "
                f"{verdict}")

    def __repr__(self) -> str:
        lines = [self.header()]
        for role, name, content in self._messages():
            if role == "system":
                content = content[:120] + " ..."
            lines.append(f"[{role}{' ' + name if name else ''}] {content}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        import html

        colors = {"system": "#eee", "user": "#e8f0fe", "assistant": "#e6f4ea", "tool": "#fef7e0"}
        parts = [f"<div style='font-size:12px'><b>{html.escape(self.header())}</b>"]
        for role, name, content in self._messages():
            body = (f"<pre style='white-space:pre-wrap;margin:0;font-size:11px'>{html.escape(content)}</pre>")
            label = html.escape(role + (f" ({name})" if name else ""))
            if role == "system":
                parts.append(f"<details><summary>system prompt</summary>{body}</details>")
            else:
                parts.append(f"<div style='background:{colors.get(role, '#fff')};padding:3px 6px;margin:2px 0'>"
                             f"<b>{label}</b>{body}</div>")
        return "".join(parts) + "</div>"


def transcripts(eval_dir: str | Path, benchmark: str, successes: int = 1, failures: int = 1) -> list[Transcript]:
    """The first ``successes`` successful and ``failures`` failed episodes of a benchmark (fewer when there
    are not that many), as displayable :class:`Transcript` objects."""
    records = read_records(eval_dir, benchmark)
    ok = [r for r in records if r.get("reward", 0) >= 1.0 - 1e-9][:successes]
    bad = [r for r in records if r.get("reward", 0) < 1.0 - 1e-9][:failures]
    return [Transcript(r) for r in ok + bad]


def show_transcripts(eval_dir: str | Path, benchmarks: list[str], successes: int = 1, failures: int = 1) -> None:
    """Display a success and a failure (when there is one) of each benchmark, saying so when there is none."""
    from IPython.display import Markdown, display

    for b in benchmarks:
        shown = transcripts(eval_dir, b, successes, failures)
        n_ok = sum(t.record.get("reward", 0) >= 1.0 - 1e-9 for t in shown)
        note = "" if n_ok else " (no successful episode to show)"
        display(Markdown(f"**{b}**{note}"))
        for t in shown:
            display(t)
