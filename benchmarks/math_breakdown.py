"""Where a mini math score comes from: pass rate per problem family and the share of arithmetic lines that are right.

    python benchmarks/math_breakdown.py outputs/base_build_b4/mini/seed0/base/eval \\
        outputs/mini/seed0/pstage_gmA_t07s300/eval_before outputs/mini/seed0/pstage_gmA_t07s300/eval_after

Reads each evaluation directory's ``records/aime26.jsonl`` (the mini math world's test split). The family is read
from the problem statement as the generators write it (``acl_lib/envs/math.py``): "Solve for x" is algebra,
"Compute" bare arithmetic, anything else a word problem. An arithmetic line is any ``a op b = r`` the model wrote
(``op`` one of + - * /); it is right when ``r`` is the result (a division truncates, as the world's solver's).

This is how the mid-trained bases' math was diagnosed (docs/mini-calibration.md): a base whose arithmetic lines
are right one time in ten gives GRPO nothing to sharpen, whatever its budget.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from acl_lib.envs.math import _apply

_LINE = re.compile(r"(-?\d+) ([-+*/]) (-?\d+) = (-?\d+)")


def family(prompt: str) -> str:
    if "Solve for x" in prompt:
        return "algebra"
    if "Compute " in prompt:
        return "arithmetic"
    return "word"


def line_is_right(a: int, op: str, b: int, r: int) -> bool:
    """``a op b = r`` computed as the world's solver computes it (``acl_lib.envs.math._apply``; a division
    truncates); a division by zero is never right."""
    try:
        return _apply(a, op, b, exact=False) == r
    except ZeroDivisionError:
        return False


def breakdown(records: list[dict]) -> dict:
    """``{"families": {family: {"episodes", "score"}}, "lines": n, "lines_right": share}`` of math records."""
    fams: dict[str, list[float]] = {}
    lines = right = 0
    for rec in records:
        user = next(m["content"] for m in rec["messages"] if m["role"] == "user")
        answer = "\n".join(m["content"] for m in rec["messages"] if m["role"] == "assistant")
        fams.setdefault(family(user), []).append(float(rec["reward"]))
        for m in _LINE.finditer(answer):
            lines += 1
            right += line_is_right(int(m[1]), m[2], int(m[3]), int(m[4]))
    return {"families": {f: {"episodes": len(v), "score": 100.0 * sum(v) / len(v)} for f, v in sorted(fams.items())},
            "lines": lines, "lines_right": right / lines if lines else None}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("eval_dirs", nargs="+", help="evaluation directories (each with records/aime26.jsonl)")
    args = ap.parse_args(argv)
    for d in args.eval_dirs:
        path = Path(d) / "records" / "aime26.jsonl"
        if not path.exists():
            raise SystemExit(f"{path}: no math records here (an evaluation directory has records/aime26.jsonl)")
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        b = breakdown(records)
        fams = ", ".join(f"{f} {v['score']:.1f}% of {v['episodes']}" for f, v in b["families"].items())
        right = "-" if b["lines_right"] is None else f"{100 * b['lines_right']:.0f}%"
        print(f"{d}: {fams}; arithmetic lines right {right} of {b['lines']}")


if __name__ == "__main__":
    main()
