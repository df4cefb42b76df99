"""Reference scorers for the math answer cases, and the agreement table (docs/math-scorer-agreement.md).

Three scorers read ``tests/data/math_answer_cases.yaml``:

- the suite: ``acl_lib.envs.math.is_correct``;
- math-verify (``parse`` of the gold in ``$...$`` and of the whole response with its default extraction, then
  ``verify``): how open-r1 style rewards score an answer;
- DAPO's reward (``dapo_score``): a re-implementation, for the tests only, of ``compute_score`` in verl's
  ``verl/utils/reward_score/math_dapo.py`` (itself adapted from lm-evaluation-harness's Minerva/hendrycks_math
  normaliser) with its default ``strict_box_verify=False``: the last 300 characters, the last
  ``(?i)Answer\\s*:\\s*([^\\n]+)`` match, ``normalize_final_answer`` on both sides, string equality. It reads no
  ``\\boxed{}`` outside that line (only a ground truth that needs extracting does, which ours never do).

``python tests/math_reference.py`` rewrites the docs file; ``tests/test_math_reference.py`` checks it is current.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CASES = ROOT / "tests" / "data" / "math_answer_cases.yaml"
DOC = ROOT / "docs" / "math-scorer-agreement.md"

# --- DAPO (verl math_dapo.py), re-implemented ------------------------------------------------------------

# (old, new) replaced in this order, then each of _DAPO_REMOVED deleted, as DAPO's normaliser does. The lists are
# its data; they define what DAPO accepts (e.g. "an " and "a " go anywhere, so do unit words like "cm").
_DAPO_SUBSTITUTIONS = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
                       (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_DAPO_REMOVED = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
                 "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
                 "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
                 "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
                 ",\\!", "{,}", '"', "\\dots")


def dapo_normalize(answer: str) -> str:
    """DAPO's ``normalize_final_answer``: the part after the last ``=``, its substitutions and removals, the
    first ``$...$`` kept, ``\\text{}``/``\\textbf{}``/``\\overline{}``/``\\boxed{}`` unwrapped, shorthand
    ``\\fracab``/``\\sqrta`` braced, ``$`` dropped, commas dropped from a comma-grouped integer."""
    s = answer.split("=")[-1]
    for old, new in _DAPO_SUBSTITUTIONS:
        s = s.replace(old, new)
    for gone in _DAPO_REMOVED:
        s = s.replace(gone, "")
    s = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", s)
    for cmd in ("text", "textbf", "overline"):
        s = re.sub(r"(\\" + cmd + r"\{)(.*?)(\})", "\\2", s)
    s = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", s)
    s = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", s)
    s = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", s)
    s = s.replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def dapo_extract(response: str) -> str:
    """The value DAPO's reward reads: the last ``Answer:`` line of the last 300 characters, else ``[INVALID]``."""
    found = re.findall(r"(?i)Answer\s*:\s*([^\n]+)", response[-300:])
    return found[-1] if found else "[INVALID]"


def dapo_score(response: str, gold: str) -> int:
    """1 when DAPO's reward calls ``response`` correct for ``gold`` (its ``acc``), else 0."""
    return int(dapo_normalize(dapo_extract(response)) == dapo_normalize(gold))


# --- math-verify -------------------------------------------------------------------------------------------


def math_verify_parse(response: str, gold: str) -> tuple[list, list]:
    from math_verify import parse

    # the timeouts use signal.alarm (main thread only); these inputs are short, written by hand
    return parse("$" + gold + "$", parsing_timeout=None), parse(response, parsing_timeout=None)


def math_verify_score(response: str, gold: str) -> int:
    """1 when math-verify, with its default extraction, finds ``response`` equal to ``gold``."""
    from math_verify import verify

    g, p = math_verify_parse(response, gold)
    return int(bool(g) and bool(p) and verify(g, p, timeout_seconds=None))


# --- the cases -----------------------------------------------------------------------------------------------


@dataclass
class Case:
    id: str  # <category>-<k>, k counted from 1 within the category in file order
    cat: str
    response: str
    gold: str
    verdict: int | str  # 1, 0 or "ambiguous"
    why: str = ""


def load_cases(path: Path = CASES) -> list[Case]:
    rows = yaml.safe_load(path.read_text(encoding="utf-8"))
    counts: dict[str, int] = {}
    cases = []
    for row in rows:
        counts[row["cat"]] = counts.get(row["cat"], 0) + 1
        cases.append(Case(id=f"{row['cat']}-{counts[row['cat']]}", cat=row["cat"], response=row["response"],
                          gold=row["gold"], verdict=row["verdict"], why=row.get("why", "")))
    return cases


@dataclass
class Scored:
    case: Case
    suite: int
    math_verify: int
    dapo: int


def score_all(cases: list[Case]) -> list[Scored]:
    from acl_lib.envs.math import is_correct

    return [Scored(c, int(is_correct(c.response, c.gold)), math_verify_score(c.response, c.gold),
                   dapo_score(c.response, c.gold)) for c in cases]


def summary(scored: list[Scored]) -> dict[str, float | int]:
    """Case counts, the suite's accuracy on the unambiguous cases, wrong answers scored 1, agreement rates."""
    clear = [s for s in scored if s.case.verdict != "ambiguous"]
    n = len(scored)
    return {
        "cases": n,
        "unambiguous": len(clear),
        "suite_accuracy": sum(s.suite == s.case.verdict for s in clear) / len(clear),
        "math_verify_accuracy": sum(s.math_verify == s.case.verdict for s in clear) / len(clear),
        "dapo_accuracy": sum(s.dapo == s.case.verdict for s in clear) / len(clear),
        "suite_wrong_scored_1": sum(s.suite == 1 and s.case.verdict == 0 for s in clear),
        "math_verify_wrong_scored_1": sum(s.math_verify == 1 and s.case.verdict == 0 for s in clear),
        "dapo_wrong_scored_1": sum(s.dapo == 1 and s.case.verdict == 0 for s in clear),
        "agree_math_verify": sum(s.suite == s.math_verify for s in scored) / n,
        "agree_dapo": sum(s.suite == s.dapo for s in scored) / n,
    }


# --- the disagreements table -----------------------------------------------------------------------------------


def _cell(s: str) -> str:
    s = s.replace("|", "\\|").replace("`", "'").replace("\n", " ⏎ ")
    return f"`{s}`" if s else ""


def _mechanism(s: Scored) -> str:
    """What each reference read, in a few words: why it said what it said."""
    from acl_lib.envs.math import extract_answer, normalize_answer

    bits = []
    pred = extract_answer(s.case.response)
    bits.append(f"suite read '{normalize_answer(pred)}'" if pred is not None else "suite found no answer")
    if s.math_verify != s.suite:
        g, p = math_verify_parse(s.case.response, s.case.gold)
        bits.append(f"math-verify parsed '{p[1]}'" if len(p) > 1 else "math-verify parsed nothing")
    if s.dapo != s.suite:
        raw = dapo_extract(s.case.response)
        bits.append("DAPO found no Answer line" if raw == "[INVALID]" else
                    f"DAPO compared '{dapo_normalize(raw)}' with '{dapo_normalize(s.case.gold)}'")
    return "; ".join(bits)


def justification(s: Scored) -> str:
    """One line: who is right and why."""
    v = s.case.verdict
    why = s.case.why or ("the response gives the gold value" if v == 1 else "the response does not give it")
    if v == "ambiguous":
        who = "ambiguous"
    else:
        right = [name for name, got in (("suite", s.suite), ("math-verify", s.math_verify), ("DAPO", s.dapo))
                 if got == v]
        who = (" and ".join(right) + " right") if right else "all wrong"
    return f"{who}: {why} ({_mechanism(s)})"


def disagreements_markdown(scored: list[Scored]) -> str:
    m = summary(scored)
    rows = [s for s in scored if s.suite != s.math_verify or s.suite != s.dapo]
    lines = [
        "# The math scorer against math-verify and DAPO's reward",
        "",
        "Generated by `python tests/math_reference.py` from `tests/data/math_answer_cases.yaml` (hand-written cases:",
        "a model response, the gold answer, the correct verdict, a category); `tests/test_math_reference.py` fails",
        "when this file is stale. Scorers: the suite (`acl_lib.envs.math.is_correct`), math-verify (default",
        "extraction on the whole response, gold in `$...$`), and DAPO's reward as verl's `math_dapo.py` computes it",
        "(last `Answer:` line of the last 300 characters, `normalize_final_answer`, string equality),",
        "re-implemented in `tests/math_reference.py`.",
        "",
        "| | suite | math-verify | DAPO |",
        "|---|---|---|---|",
        f"| right on the {m['unambiguous']} unambiguous cases (of {m['cases']}) | {m['suite_accuracy']:.1%} | "
        f"{m['math_verify_accuracy']:.1%} | {m['dapo_accuracy']:.1%} |",
        f"| wrong answers scored 1 | {m['suite_wrong_scored_1']} | {m['math_verify_wrong_scored_1']} | "
        f"{m['dapo_wrong_scored_1']} |",
        f"| agreement with the suite, all cases | | {m['agree_math_verify']:.1%} | {m['agree_dapo']:.1%} |",
        "",
        "math-verify keeps the first number it can parse in the answer it extracts and drops the words around it, so",
        "hedges, negations, scale words and constants written as words score 1 there. DAPO's reward compares strings:",
        "it rejects equal numbers written differently (`042`, `5.0`, `0.5` for `\\frac{1}{2}`), any unit outside its",
        "word list, and every response without an `Answer:` line (boxed answers alone score 0).",
        "",
        f"## Every case where the suite disagrees with math-verify or DAPO ({len(rows)})",
        "",
        "| case | response | gold | verdict | suite | math-verify | DAPO | who is right and why |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in rows:
        c = s.case
        lines.append(f"| {c.id} | {_cell(c.response)} | {_cell(c.gold)} | {c.verdict} | {s.suite} | "
                     f"{s.math_verify} | {s.dapo} | {justification(s).replace('|', '/')} |")
    misses = [s for s in scored if s.case.verdict != "ambiguous" and s.suite != s.case.verdict]
    lines += ["", f"## Cases the suite gets wrong ({len(misses)})", ""]
    if misses:
        lines += [f"- {s.case.id}: {_cell(s.case.response)} for {_cell(s.case.gold)}: the suite says {s.suite}, "
                  f"the verdict is {s.case.verdict} ({s.case.why or 'see the case'})" for s in misses]
    else:
        lines.append("None.")
    return "\n".join(lines) + "\n"


def main() -> None:
    scored = score_all(load_cases())
    DOC.write_text(disagreements_markdown(scored), encoding="utf-8")
    m = summary(scored)
    print(f"wrote {DOC.relative_to(ROOT)}: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                                         for k, v in m.items()))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
