"""All the findings at once: :func:`judge`'s rows, as a DataFrame, as Markdown for a notebook, as ``findings.json``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from acl_lib.atomic import jsonable, write_json
from acl_lib.final import FinalData
from acl_lib.findings.core import NOISE_FLOOR, RULES, VERDICTS
from acl_lib.noise import BEYOND, FORMULA, POWER, Z_POWER


def judge(data: FinalData, ids: Sequence[str] | None = None) -> list[dict]:
    """One row per finding (``ids``, default F1-F8): claim, rule, quantity, ours (± SE), the study's, verdict,
    power (the smallest effect each part of the rule detects, beside the study's own), detail, values."""
    unknown = [i for i in ids or () if i not in RULES]
    if unknown:
        raise KeyError(f"unknown finding(s) {unknown}; the findings are {list(RULES)}")
    return [RULES[i].judge(data) for i in (ids or RULES)]


DISPLAY = ["claim", "quantity", "ours", "study", "verdict", "power", "rule", "detail"]


def findings_frame(data: FinalData | list[dict]):
    """:func:`judge`'s rows (or ``data``'s, judged here) as a DataFrame indexed by finding, the columns a reader
    needs (``DISPLAY``; ``values`` stay in ``findings.json``)."""
    import pandas as pd

    rows = judge(data) if isinstance(data, FinalData) else data
    frame = pd.DataFrame([{k: r[k] for k in ["finding", *DISPLAY]} for r in rows]).set_index("finding")
    frame.attrs["noise_floor"] = NOISE_FLOOR
    return frame


def verdict_summary(rows: list[dict]) -> str:
    """``"3 reproduced, 1 not reproduced, 2 underpowered, 2 not testable"``."""
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    return ", ".join(f"{n} {v}" for v, n in counts.items())


def verdicts_markdown(data: FinalData, ids: Sequence[str] | None = None) -> str:
    """Markdown of the verdicts of ``ids`` on ``data``: what a stage or diagnostics notebook shows of its findings,
    computed by the same rules as the final tables."""
    lines = []
    for r in judge(data, ids):
        study = f" The study: {r['study']}." if r["study"] else ""
        lines.append(f"- **{r['finding']}: {r['verdict']}** ({r['claim']}) Ours: {r['ours']}.{study} "
                     f"*{r['detail']}.* Power: {r['power']}. Rule: {r['rule']}.")
    seeds = ", ".join(map(str, data.seeds))
    return (f"**The findings on seed(s) {seeds}** (`acl_lib.findings`, the rules of the final tables)\n\n"
            + "\n".join(lines) + f"\n\n{NOISE_FLOOR}.")


def write_findings(data: FinalData, path: str | Path, rows: list[dict] | None = None) -> Path:
    """Write the verdicts to ``path`` (``outputs/<profile>/findings.json``): the seeds, the noise floor, and per
    finding its claim, rule, our numbers with their standard errors, the study's numbers and where they come from,
    the verdict, its power (``power`` in words, ``power_parts`` per test: the smallest effect detected at our
    precision, the study's own effect, whether it is powered) and what the rule saw. ``rows``: :func:`judge`'s rows
    on ``data`` when already computed. Returns the path."""
    rows = jsonable(rows if rows is not None else judge(data))
    doc = {"seeds": list(data.seeds), "curriculum": list(data.curriculum), "noise_floor": FORMULA,
           "beyond_noise_in_se": BEYOND, "power": POWER, "detectable_in_se": BEYOND + Z_POWER,
           "binomial_fallback": data.binomial_fallback(), "verdicts": VERDICTS, "summary": verdict_summary(rows),
           "findings": rows}
    return write_json(Path(path), doc)
