"""Multiple-choice sets: the math domain's out-of-domain benchmarks (GPQA-Diamond, MMLU-Redux).

This module holds everything multiple-choice; ``acl_lib.envs.math.MathEnv`` delegates its ``gpqa`` and
``mmlu_redux`` splits here, so the benchmark registry keeps mapping both keys to the ``math`` environment
and these tasks carry ``domain="math"`` with ``meta["format"] == "mcq"``.

- Prompt: the question, then the options as ``A) ...`` .. ``D) ...``; the reply must end with a line
  ``Answer: X`` (the simple-evals convention, worded here in our own words).
- Letter extraction (``extract_choice``), last match wins, over three forms:
  ``Answer: X`` / ``answer is X`` / ``answer is (X)`` (also ``option is X``, ``choice is X``). The keyword
  is case-insensitive. The letter may be wrapped in ``( )``, ``[ ]``, ``$ $``, ``** **``, ``\\boxed{}``,
  ``\\text{}``/``\\textbf{}`` or quotes and must not be followed by a letter or digit (so "the answer is
  Always" is no match). Case rule: an upper-case letter is always taken; a lower-case one only when it
  is bracketed (``(b)``) or is the whole rest of the line (``Answer: b.``), because a bare lower-case
  ``a`` is usually the English article ("the answer is a prime"). Only A-D count (4 options).
- Mini sets (generated): ``gpqa``: science-flavoured quantitative questions (speed, Ohm's law, density,
  power, work) whose distractors are typical mistakes; ``mmlu_redux``: a different family (unit
  conversion, primes, divisibility, remainders, largest value, syllogisms over made-up words).
  Options are shuffled with an rng derived from (world seed, split, seed, index).
- Real sets (paper profile), read through ``datasets`` from local files:
  ``gpqa_diamond.csv`` with the original GPQA columns (``Question``, ``Correct Answer``,
  ``Incorrect Answer 1..3``, ``Record ID``, ...); options are shuffled deterministically from
  (world seed, Record ID). ``mmlu_redux.jsonl`` / ``.parquet`` with the edinburgh-dawg/mmlu-redux-2.0
  columns (``question``, ``choices`` (4 strings), ``answer`` (int index), ``error_type``) plus
  ``subject`` (the dataset config name; ``config`` is accepted too). Rows whose ``error_type`` is not
  ``"ok"`` are dropped: the annotators found the question, options or gold label faulty.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from acl_lib.envs.base import Task

LETTERS = "ABCD"

MCQ_INSTRUCTION = (
    "Answer the following multiple choice question. Think step by step, then give your choice. "
    "The last line of your response should be of the form Answer: $LETTER (without quotes) where "
    "$LETTER is one of ABCD."
)


def mcq_prompt(question: str, options: list[str]) -> str:
    """The user prompt: instruction, question, and the options listed ``A) ..`` to ``D) ..``."""
    lines = [f"{LETTERS[i]}) {opt}" for i, opt in enumerate(options)]
    return f"{MCQ_INSTRUCTION}\n\n{question.strip()}\n\n" + "\n".join(lines)


# --- letter extraction ------------------------------------------------------------------------------

# keyword: "answer:" or "answer/option/choice is[:]" (case-insensitive); then optional wrappers; then a letter.
_OPEN = r"(?:\*\*|\\boxed\{|\\text(?:bf)?\{|\$|\(|\[|\{|'|\"|\s)*"
_CHOICE_RE = re.compile(
    r"(?i:answer\s*:|(?:answer|option|choice)\s+is\s*:?)"  # the keyword
    r"(?P<open>" + _OPEN + r")"
    r"(?P<letter>[A-Da-d])(?![A-Za-z0-9])"
)
# What may follow a lower-case letter on its line for it to count ("answer: b." but not "answer: a cat"),
# read up to the first other character only: reading each match's whole line is quadratic on long lines.
_TRAILING = re.compile(r"(?:(?!\n)[\s\)\]\}\$\*\.\"',;:!])*")


def extract_choice(response: str) -> str | None:
    """The chosen letter (``"A"``..``"D"``, upper-case) of the last answer statement, or None.

    See the module docstring for the accepted forms and the case rule. Never raises.
    """
    if not isinstance(response, str) or not response:
        return None
    for m in reversed(list(_CHOICE_RE.finditer(response))):  # the last answer statement that counts wins
        letter = m.group("letter")
        if letter.islower():
            bracketed = "(" in m.group("open") or "[" in m.group("open")
            end = _TRAILING.match(response, m.end()).end()
            alone = end == len(response) or response[end] == "\n"
            if not (bracketed or alone):
                continue
        return letter.upper()
    return None


def is_correct_choice(response: str, gold_letter: str) -> bool:
    """True when the extracted letter equals ``gold_letter`` (case-insensitive, A-D). Never raises."""
    if not isinstance(gold_letter, str) or gold_letter.strip().upper() not in LETTERS or not gold_letter.strip():
        return False
    got = extract_choice(response)
    return got is not None and got == gold_letter.strip().upper()


def score_choice(response: str, task: Task) -> tuple[float, str | None]:
    """SingleTurnEpisode score function for a multiple-choice task: (reward, failure)."""
    got = extract_choice(response)
    if got is None:
        return 0.0, "no Answer: line (no choice letter A-D found)"
    if got != task.answer:
        return 0.0, f"wrong answer: got {got} expected {task.answer}"
    return 1.0, None


# --- rendering worked answers -------------------------------------------------------------------------


def mcq_solution_text(task: Task) -> str:
    """A short correct reasoning line and ``Answer: X``."""
    letter = task.answer
    why = task.meta.get("explanation") or f"The correct option is {task.meta['options'][LETTERS.index(letter)]}."
    return f"{why} This is option {letter}.\nAnswer: {letter}"


def mcq_wrong_solution_text(task: Task, rng: random.Random) -> str:
    """A plausible but wrong answer: picks a distractor and argues for it in the same format."""
    options = task.meta["options"]
    wrong = rng.choice([c for c in LETTERS[: len(options)] if c != task.answer])
    picked = options[LETTERS.index(wrong)].rstrip(".")
    return f"The value that fits is {picked}. This is option {wrong}.\nAnswer: {wrong}"


# --- mini generators ------------------------------------------------------------------------------
# Each generator returns (question, correct option text, [3 distractor texts], explanation).

_NAMES = ["Ana", "Ben", "Cai", "Dee", "Eli", "Fay", "Gus", "Ivy", "Jon", "Kim", "Leo", "Mia", "Ned", "Ola", "Pat"]


def _distractors(rng: random.Random, answer: int, mistakes: list[int], unit: str = "") -> list[str]:
    """Three distinct wrong options: typical mistakes first, then near misses. Positive integers."""
    out: list[int] = []
    for m in mistakes + [answer + d for d in rng.sample([-3, -2, -1, 1, 2, 3, 5, -5, 10, -10], 10)]:
        if m != answer and m > 0 and m not in out:
            out.append(m)
        if len(out) == 3:
            break
    return [f"{v}{unit}" for v in out]


def _gpqa_speed(rng):
    t1, v, t2 = rng.randint(2, 9), rng.randint(2, 12), rng.randint(2, 12)
    d1 = v * t1
    ans = v * t2
    q = f"A cart moves at constant speed and covers {d1} m in {t1} s. How far does it move in {t2} s?"
    why = f"Speed = {d1} / {t1} = {v} m/s, so distance = {v} * {t2} = {ans} m."
    return q, f"{ans} m", _distractors(rng, ans, [d1 + t2, d1 * t2, v + t2], " m"), why


def _gpqa_ohm(rng):
    i, r = rng.randint(2, 9), rng.randint(2, 20)
    ans = i * r
    q = f"A current of {i} A flows through a resistor of {r} ohm. What is the voltage across it?"
    why = f"V = I * R = {i} * {r} = {ans} V."
    return q, f"{ans} V", _distractors(rng, ans, [i + r, abs(r - i), r // i if r // i else 1], " V"), why


def _gpqa_density(rng):
    d, v = rng.randint(2, 9), rng.randint(2, 12)
    m = d * v
    q = f"A block has mass {m} g and volume {v} cm^3. What is its density in g/cm^3?"
    why = f"Density = mass / volume = {m} / {v} = {d} g/cm^3."
    return q, f"{d}", _distractors(rng, d, [m - v, m + v, d * 2]), why


def _gpqa_power(rng):
    p, t = rng.randint(2, 15), rng.randint(2, 9)
    w = p * t
    q = f"A motor does {w} J of work in {t} s. What is its average power in watts?"
    why = f"Power = work / time = {w} / {t} = {p} W."
    return q, f"{p} W", _distractors(rng, p, [w - t, w + t, w], " W"), why


def _gpqa_work(rng):
    f, d, k = rng.randint(2, 9), rng.randint(2, 9), rng.randint(2, 4)
    ans = f * k * d
    q = (f"A force of {f} N moves a box {d} m. The force is then made {k} times larger. How much work does the larger "
         f"force do over the same {d} m?")
    why = f"New force = {f} * {k} = {f * k} N, work = {f * k} * {d} = {ans} J."
    return q, f"{ans} J", _distractors(rng, ans, [f * d, f * d + k, (f + k) * d], " J"), why


GPQA_FAMILIES: dict[str, Callable] = {
    "speed": _gpqa_speed,
    "ohm": _gpqa_ohm,
    "density": _gpqa_density,
    "power": _gpqa_power,
    "work": _gpqa_work,
}

_UNITS = [("hours", "minutes", 60), ("minutes", "seconds", 60), ("km", "m", 1000), ("kg", "g", 1000),
          ("m", "cm", 100), ("days", "hours", 24), ("weeks", "days", 7), ("dozens", "items", 12)]
_PRIMES = [p for p in range(11, 100) if all(p % d for d in range(2, int(p**0.5) + 1))]
_NONSENSE = ["blims", "crans", "dops", "fends", "glors", "hibs", "jorts", "kwans", "lums", "mivs", "nabs", "prels"]


def _mmlu_units(rng):
    big, small, f = rng.choice(_UNITS)
    k = rng.randint(2, 9)
    ans = k * f
    q = f"How many {small} are in {k} {big}?"
    why = f"1 {big[:-1] if big.endswith('s') else big} = {f} {small}, so {k} * {f} = {ans}."
    return q, str(ans), _distractors(rng, ans, [k + f, k * 10 if f != 10 else k * 100, k * f // 10]), why


def _mmlu_prime(rng):
    p = rng.choice(_PRIMES)
    comps = set()
    while len(comps) < 3:
        a, b = rng.randint(3, 13), rng.randint(3, 9)
        if a * b < 100 and a * b % 2 == 1:  # odd composites: "odd" is not enough to pick the prime
            comps.add(a * b)
    q = "Which of the following numbers is prime?"
    why = f"{p} has no divisor other than 1 and itself; each other option has a factor."
    return q, str(p), [str(c) for c in sorted(comps)], why


def _mmlu_divisible(rng):
    d = rng.randint(3, 9)
    ans = d * rng.randint(3, 15)
    wrong = set()
    while len(wrong) < 3:
        w = rng.randint(10, 140)
        if w % d and w != ans:
            wrong.add(w)
    q = f"Which of the following numbers is divisible by {d}?"
    why = f"{ans} = {d} * {ans // d}, so it is divisible by {d}."
    return q, str(ans), [str(w) for w in sorted(wrong)], why


def _mmlu_remainder(rng):
    d = rng.randint(3, 9)
    qt, r = rng.randint(2, 12), rng.randint(1, d - 1)
    n = d * qt + r
    q = f"What is the remainder when {n} is divided by {d}?"
    why = f"{n} = {d} * {qt} + {r}, so the remainder is {r}."
    opts = [str(x) for x in rng.sample([x for x in range(0, d + 3) if x != r], 3)]
    return q, str(r), opts, why


def _mmlu_largest(rng):
    exprs = set()
    while len(exprs) < 4:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        exprs.add((a, b))
    vals = {e: e[0] * e[1] for e in exprs}
    if len(set(vals.values())) < 4:
        return _mmlu_largest(rng)
    best = max(vals, key=vals.get)
    others = [f"{a} * {b}" for (a, b) in exprs if (a, b) != best]
    q = "Which of the following has the largest value?"
    why = ", ".join(f"{a} * {b} = {vals[(a, b)]}" for (a, b) in sorted(exprs)) + f"; the largest is {vals[best]}."
    return q, f"{best[0]} * {best[1]}", others, why


def _mmlu_syllogism(rng):
    x, y = rng.sample(_NONSENSE, 2)
    name = rng.choice(_NAMES)
    q = f"All {x} are {y}. {name} is one of the {x}. Which statement must be true?"
    right = f"{name} is one of the {y}."
    wrong = [f"{name} is not one of the {y}.", f"All {y} are {x}.", f"No {x} are {y}."]
    why = f"Every one of the {x} is one of the {y}, and {name} is one of the {x}."
    return q, right, wrong, why


MMLU_FAMILIES: dict[str, Callable] = {
    "unit_conversion": _mmlu_units,
    "prime": _mmlu_prime,
    "divisible": _mmlu_divisible,
    "remainder": _mmlu_remainder,
    "largest": _mmlu_largest,
    "syllogism": _mmlu_syllogism,
}

FAMILIES = {"gpqa": GPQA_FAMILIES, "mmlu_redux": MMLU_FAMILIES}


def _make_task(benchmark: str, uid: str, question: str, correct: str, wrong: list[str], rng: random.Random,
               meta: dict[str, Any]) -> Task:
    """Shuffle the 4 options with ``rng`` and build the Task (answer = gold letter)."""
    options = [correct] + list(wrong[:3])
    rng.shuffle(options)
    letter = LETTERS[options.index(correct)]
    return Task(
        id=uid,
        domain="math",
        benchmark=benchmark,
        system_prompt="",
        user_prompt=mcq_prompt(question, options),
        answer=letter,
        meta={"format": "mcq", "question": question, "options": options, **meta},
    )


def generate_mcq(benchmark: str, n: int, world_seed: int, seed: int) -> list[Task]:
    """``n`` distinct generated tasks of ``benchmark`` (``gpqa`` or ``mmlu_redux``), deterministic."""
    families = FAMILIES[benchmark]
    names = sorted(families)
    rng = random.Random(f"mcq:{world_seed}:{benchmark}:{seed}")
    tasks, seen = [], set()
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 200 * n + 1000:
            raise RuntimeError(f"could not generate {n} distinct {benchmark} questions (got {len(tasks)})")
        fam = names[len(tasks) % len(names)] if attempts <= n else rng.choice(names)
        q, correct, wrong, why = families[fam](rng)
        if len(set(wrong + [correct])) < 4:
            continue
        key = q + "|" + correct + "|" + "|".join(sorted(wrong))
        if key in seen:
            continue
        seen.add(key)
        uid = f"{benchmark}-{hashlib.sha1(key.encode()).hexdigest()[:10]}"
        # the option order comes from the task's own seed, so it does not depend on earlier tasks
        shuffle_rng = random.Random(f"shuffle:{world_seed}:{benchmark}:{seed}:{uid}")
        tasks.append(_make_task(benchmark, uid, q, correct, wrong, shuffle_rng, {"family": fam, "explanation": why}))
    return tasks


# --- real data loaders (paper profile) ---------------------------------------------------------------


def load_rows(path: Path):
    """A local csv / json(l) / parquet file as a ``datasets.Dataset`` (iterate it for row dicts; rows are
    not all materialised, which matters for DAPO-Math-17K's ~1.8M repeated rows).

    CSV cells are read as text exactly as written: every column is typed ``string`` (so an option
    ``0.50`` stays ``0.50``, not the float 0.5) and pandas' NA guessing is off (an option ``None`` stays).
    """
    import csv

    import datasets

    kind = {".csv": "csv", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}[path.suffix]
    kwargs: dict[str, Any] = {}
    if kind == "csv":
        with open(path, newline="", encoding="utf-8") as f:
            header = next(csv.reader(f))
        kwargs = dict(features=datasets.Features({c: datasets.Value("string") for c in header}),
                      keep_default_na=False, na_filter=False)
    return datasets.load_dataset(kind, data_files=str(path), split="train", **kwargs)


def load_gpqa(path: Path, world_seed: int = 0) -> list[Task]:
    """GPQA-Diamond from the original CSV; options shuffled deterministically per (world seed, Record ID)."""
    tasks = []
    for i, row in enumerate(load_rows(path)):
        correct = str(row["Correct Answer"]).strip()
        wrong = [str(row[f"Incorrect Answer {k}"]).strip() for k in (1, 2, 3)]
        rid = str(row.get("Record ID") or f"row{i}")
        rng = random.Random(f"gpqa:{world_seed}:{rid}")
        meta = {"record_id": rid, "subdomain": row.get("Subdomain"), "explanation": None}
        tasks.append(_make_task("gpqa", f"gpqa-{rid}", str(row["Question"]).strip(), correct, wrong, rng, meta))
    return tasks


def _gold_index(ans: Any) -> int:
    """MMLU ``answer``: an int index, a digit string, or a letter."""
    if isinstance(ans, str) and ans.strip().upper() in LETTERS and not ans.strip().isdigit():
        return LETTERS.index(ans.strip().upper())
    return int(ans)


def load_mmlu_redux(path: Path) -> list[Task]:
    """MMLU-Redux 2.0 rows with ``error_type == "ok"``; options keep their original order (like MMLU)."""
    tasks = []
    for i, row in enumerate(load_rows(path)):
        if str(row.get("error_type", "ok")).strip() != "ok":
            continue
        choices = [str(c) for c in row["choices"]]
        if len(choices) != 4:
            continue
        gold = _gold_index(row["answer"])
        subject = row.get("subject") or row.get("config") or "unknown"
        options = choices
        tasks.append(
            Task(
                id=f"mmlu_redux-{subject}-{i}",
                domain="math",
                benchmark="mmlu_redux",
                system_prompt="",
                user_prompt=mcq_prompt(str(row["question"]), options),
                answer=LETTERS[gold],
                meta={"format": "mcq", "question": str(row["question"]), "options": options, "subject": subject,
                      "explanation": None},
            )
        )
    return tasks
