"""Math domain: DAPO-style single-turn problems with a verifiable final answer, plus two MC OOD sets.

Splits (``MathEnv.splits``): ``train`` (no benchmark; tasks carry ``benchmark="dapo_math_17k"``),
``test`` -> ``aime26``, ``gpqa`` -> ``gpqa``, ``mmlu_redux`` -> ``mmlu_redux``. The two multiple-choice
splits are built by ``acl_lib.envs.mcq``; their tasks have ``meta["format"] == "mcq"`` and are scored by
letter, everything else by final answer.

Prompt (DAPO convention): ``DAPO_PREFIX + problem + DAPO_SUFFIX``; the response must end with a line
``Answer: <value>``.

Answer scoring lives in ``acl_lib.envs.math_answer`` (re-exported here). The rules below are checked against
math-verify and DAPO's reward on the hand-written cases of ``tests/data/math_answer_cases.yaml``; every
disagreement is listed, with who is right, in ``docs/math-scorer-agreement.md``. One principle: an answer that
is not one plain value (a hedge "3 or 4", a negation "7 is not correct", a bound "at least 3", a value changed
by a word "12 thousand", "2 pi") never scores 1, even where math-verify (which reads the first number) or DAPO
(which deletes its unit words anywhere) would give it 1: a policy trained on this reward must not learn to hedge.

Answer extraction (``extract_answer``), following DAPO/verl ``math_dapo.py``:
  1. every case-insensitive ``answer\\s*:`` (so ``Answer:42``, ``Final answer: 7`` and ``**Answer:** 7``
     count); the value is the rest of that line, or the next non-empty line if the colon ends its line
     (DAPO's ``\\s*`` also crosses the newline); the last match with a non-empty value wins;
  2. without any such line, the content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (nested braces); when
     boxes before it are joined to it by only a connector (``\\boxed{3} or \\boxed{4}``, ``\\boxed{3},
     \\boxed{4}``) the whole span, which then fails as a hedge or a list; boxes apart (a withdrawn first
     attempt, then a sentence, then the answer) leave the last one;
  3. otherwise None. The raw value is returned (only surrounding whitespace and markdown ``*`` are
     stripped: ``Answer: $-5$`` gives ``$-5$``); normalisation happens at comparison.
  Unlike DAPO we do not cut the response to its last 300 characters (that is only a speed trick there).

Normalisation (``normalize_answer``, applied to both sides), in order: strip surrounding markdown ``*`` and
backticks; unwrap every ``\\boxed{}``/``\\fbox{}`` in place (the words around stay); U+2212 and the other
minus signs -> ``-``; a tilde before a number at the start or after a space is plain text's "approximately"
(``~42``), elsewhere LaTeX's tie; drop ``$``, ``\\$``, ``\\(``, ``\\)``, ``\\[``, ``\\]``, ``\\left``,
``\\right``, ``\\!`` and degree marks; LaTeX spaces (``\\,`` ``\\;`` ``\\:`` ``\\ `` ``~`` ``\\quad``) are
spaces, so ``12\\,\\text{cm}^2`` is 12 with a unit and ``1\\,234`` is 1234; ``\\dfrac``/``\\tfrac`` ->
``\\frac``; unwrap ``\\text{}``, ``\\textbf{}``, ``\\mathrm{}``, ``\\mbox{}``; drop a lead that names the answer
(``The final answer is``, ``So the total is``, ``It is``, ``We get``, after ``So,``/``Thus,``; not when its
subject hedges or transforms the value: ``twice the answer is``, ``the answer is probably``) and a trailer
(``. I hope it is correct.``, ``is the answer``, ``, not 8``), so the Minerva form "The final answer is $42$.
I hope it is correct." gives 42; keep what follows the last ``=`` (``x = 5`` -> ``5``, as DAPO) unless what
precedes it hedges or lists (``x = 3 or x = 4``, ``x = 3, y = 4`` stay whole); ``negative 5``/``minus 5`` ->
``-5``, the word ``pi`` -> ``\\pi``, a number word (``twelve``, ``twenty-one``) -> its digits, a scale word
multiplies (``12 thousand`` -> ``12000``, ``4 dozen`` -> ``48``); drop unit words after a number when every
word is a known unit (cm, m, degrees, dollars, percent, square, per, ...) or a plural noun (``12 apples``,
``8 ways``), never a scale, a constant, a negation or a hedge (``12 thousands``, ``2 tau``, ``7 is not
correct``, ``3 or four`` keep their words); a mixed number ``1 1/2`` -> ``3/2``; remove the whitespace except
between two digits (``3 4`` is two numbers) or two letters; drop trailing ``.``; remove thousands separators
when the commas group digits by three (``1,234`` -> ``1234``; ``1,2`` stays a list); drop a leading ``+``.

Comparison (``is_correct`` / ``answers_match``): equal normalised strings -> correct; else if both sides
are plain numbers (integers, decimals, ``a/b``) they are compared exactly as rationals, so ``5.0`` equals
``5`` and ``042`` equals ``42`` (math-verify semantics; DAPO's pure string match would reject both) and
``5.00001`` does not; otherwise ``math_verify.verify(parse(gold), parse(pred))`` decides (``\\frac{1}{2}`` vs
``0.5``, ``2\\sqrt{2}`` vs ``\\sqrt{8}``; it also accepts ``5\\%`` for ``5``, its percentage leniency), unless
the prediction still holds what the gold does not: a word of two or more letters, a relation or hedge mark
(``=``, ``<``, ``\\pm``, ``\\approx``, ``\\neq``, ``?``) or a space between two numbers; math-verify would take
the first value out of it. math-verify is skipped for answers longer than 100 characters or nested more than 4
brackets deep and for huge powers or factorials (they could stall its parser or sympy): a model's output is
untrusted, so the input bounds the time, and math-verify's own signal-based timeouts (main thread only) are
off, so every thread gets the same result. No extractable answer -> False. Nothing here raises on model output.

Mini world (``worlds.data_dir`` empty): generated problems with integer answers at levels 1-4 from three
families: ``arith`` (precedence), ``word`` (multi-step word problems), ``algebra`` (solve for x); level 1
is one operation, each level adds steps. The level weights per split are ``worlds.math_levels``: by default
train 4:3:2:1, test 1:2:3:4 (harder on average, same families). ``worlds.math_max_operand`` (> 0) caps every
number a generator draws. The mini profile uses level 1 only with numbers up to 9 (measured: with two-digit
operands or the default mix a ~2M model trained for minutes does not learn the arithmetic; see the README).
A problem belongs to the test side iff sha1(problem text) % 4 == 0, so train and test never share a problem
for any n or seed. Each task keeps its worked steps in ``meta["steps"]`` (structured, so a wrong solution can
propagate a slip); ``solution_text`` renders them.

Real data (``worlds.data_dir`` set, the paper profile), read from ``<data_dir>/math/``:
  - ``dapo_math_17k.parquet`` (or ``.jsonl``/``.json``): DAPO-Math-17K columns ``data_source``,
    ``prompt`` (list of {role, content}), ``ability``, ``reward_model`` {ground_truth, style},
    ``extra_info`` {index}. Rows are deduplicated by prompt (the released file repeats each prompt);
    rows containing a test problem's text are dropped.
  - ``aime26.jsonl`` (or ``.json``/``.parquet``): MathArena schema ``problem_idx`` (or ``id``),
    ``problem``, ``answer``.
  - ``gpqa_diamond.csv`` and ``mmlu_redux.jsonl`` (or ``.parquet``): see ``acl_lib.envs.mcq``.
  A missing file raises FileNotFoundError naming the expected path.
"""

from __future__ import annotations

import hashlib
import random
import re
from pathlib import Path
from typing import Any

from acl_lib.config import DEFAULT_MATH_LEVELS, WorldsConfig
from acl_lib.envs import mcq
from acl_lib.envs.base import Environment, Episode, SingleTurnEpisode, Task
from acl_lib.envs.math_answer import (  # noqa: F401  (public here too)
    MV_MAX_CHARS,
    MV_MAX_DEPTH,
    _as_fraction,
    answers_match,
    extract_answer,
    is_correct,
    math_verify_safe,
    normalize_answer,
)
from acl_lib.envs.mcq import extract_choice, is_correct_choice  # noqa: F401  (public here too)

DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
TRAIN_BENCHMARK = "dapo_math_17k"

def dapo_prompt(problem: str) -> str:
    """The DAPO user prompt around one problem statement."""
    return DAPO_PREFIX + problem.strip() + DAPO_SUFFIX


def score_response(response: str, task: Task) -> tuple[float, str | None]:
    """SingleTurnEpisode score function for any task of this environment: (reward, failure)."""
    if task.meta.get("format") == "mcq":
        return mcq.score_choice(response, task)
    pred = extract_answer(response)
    if pred is None:
        return 0.0, "no Answer: line"
    if answers_match(pred, str(task.answer)):
        return 1.0, None
    shown = normalize_answer(pred) or pred
    return 0.0, f"wrong answer: got {shown[:80]} expected {task.answer}"


# --- worked steps ---------------------------------------------------------------------------------
# A step is {"fmt": str, "a": operand, "op": "+-*/", "b": operand}; an operand is an int or {"ref": k}
# (the result of step k). ``fmt`` may use {a}, {b}, {r}. Keeping steps structured lets a wrong solution
# change one intermediate result and carry the error forward, like a real slip.


def _apply(a: int, op: str, b: int, exact: bool = True) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        raise ZeroDivisionError
    if exact and a % b:
        raise ValueError(f"{a} / {b} is not an integer")
    return int(a / b)  # truncation: what a careless solver writes for an inexact division


def _run_steps(steps: list[dict], slip: tuple[int, int] | None = None) -> list[int]:
    """Results of every step; ``slip=(k, delta)`` adds ``delta`` to step k's result and carries it on."""
    results: list[int] = []
    for k, st in enumerate(steps):
        a, b = (results[v["ref"]] if isinstance(v, dict) else v for v in (st["a"], st["b"]))
        r = _apply(a, st["op"], b, exact=slip is None)
        if slip is not None and slip[0] == k:
            r += slip[1]
        results.append(r)
    return results


def _render_steps(steps: list[dict], results: list[int]) -> list[str]:
    lines = []
    for st, r in zip(steps, results):
        a, b = (results[v["ref"]] if isinstance(v, dict) else v for v in (st["a"], st["b"]))
        b_txt = f"({b})" if b < 0 else str(b)  # "5 * (-3)", never "5 * -3"
        lines.append(st["fmt"].format(a=a, b=b_txt, r=r))
    return lines


def _step(fmt: str, a: Any, op: str, b: Any) -> dict:
    return {"fmt": fmt, "a": a, "op": op, "b": b}


def _ref(k: int) -> dict:
    return {"ref": k}


# --- generators -----------------------------------------------------------------------------------
# Each returns (problem text, steps). The answer is the last step's result.

_NAMES = ["Ada", "Ben", "Cal", "Dina", "Eve", "Finn", "Gia", "Hal", "Iris", "Jay", "Kai", "Lena", "Max", "Nora",
          "Omar", "Pia", "Raj", "Sara", "Tom", "Uma", "Vic", "Wes", "Yara", "Zoe"]
_ITEMS = ["apples", "pens", "stamps", "cards", "marbles", "books", "eggs", "coins", "shells", "stickers"]


def _fmt(op: str) -> str:
    return "{a} " + op + " {b} = {r}"


def _gen_arith(level: int, rng: random.Random) -> tuple[str, list[dict]]:
    R = rng.randint
    if level == 1:  # one operation
        op = rng.choice("+-*")
        a, b = R(2, 99), (R(2, 9) if op == "*" else R(2, 99))
        return f"Compute {a} {op} {b}.", [_step(_fmt(op), a, op, b)]
    if level == 2:
        a, b, c, d = R(2, 20), R(2, 20), R(2, 9), R(2, 30)
        return (f"Compute ({a} + {b}) * {c} - {d}.",
                [_step(_fmt("+"), a, "+", b), _step(_fmt("*"), _ref(0), "*", c), _step(_fmt("-"), _ref(1), "-", d)])
    if level == 3:
        a, b, c, d, e = R(2, 12), R(2, 12), R(2, 12), R(2, 12), R(2, 30)
        return (f"Compute {a} * {b} - {c} * {d} + {e}.",
                [_step(_fmt("*"), a, "*", b), _step(_fmt("*"), c, "*", d),
                 _step(_fmt("-"), _ref(0), "-", _ref(1)), _step(_fmt("+"), _ref(2), "+", e)])
    a, b, c, d, e, f = R(2, 20), R(2, 20), R(2, 12), R(2, 12), R(2, 9), R(2, 9)
    return (f"Compute ({a} - {b}) * ({c} + {d}) - {e} * {f}.",
            [_step(_fmt("-"), a, "-", b), _step(_fmt("+"), c, "+", d), _step(_fmt("*"), _ref(0), "*", _ref(1)),
             _step(_fmt("*"), e, "*", f), _step(_fmt("-"), _ref(2), "-", _ref(3))])


def _gen_word(level: int, rng: random.Random) -> tuple[str, list[dict]]:
    R = rng.randint
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    if level == 1:
        a, b = R(5, 60), R(2, 40)
        if rng.random() < 0.5:
            return (f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
                    [_step(_fmt("+"), a, "+", b)])
        a = a + b
        return (f"{name} has {a} {item} and gives away {b}. How many {item} does {name} have now?",
                [_step(_fmt("-"), a, "-", b)])
    a, b, c = R(2, 30), R(2, 9), R(2, 12)
    head = f"{name} has {a} {item} and buys {b} packs with {c} {item} in each."
    steps = [_step(_fmt("*"), b, "*", c), _step(_fmt("+"), a, "+", _ref(0))]
    if level == 2:
        return f"{head} How many {item} does {name} have now?", steps
    total = a + b * c
    if level == 3:
        d = R(1, total - 1)
        steps.append(_step(_fmt("-"), _ref(1), "-", d))
        return f"{head} Then {name} gives {d} away. How many {item} are left?", steps
    k = R(2, 6)
    # give away d so that what is left is a positive multiple of k
    choices = [d for d in range(1, min(30, total - k) + 1) if (total - d) % k == 0]
    if not choices:
        return _gen_word(3, rng)
    d = rng.choice(choices)
    steps += [_step(_fmt("-"), _ref(1), "-", d), _step(_fmt("/"), _ref(2), "/", k)]
    return (f"{head} Then {name} gives {d} away and shares the rest equally among {k} friends. "
            f"How many {item} does each friend get?", steps)


def _signed(v: int) -> str:
    """`` + 5`` / `` - 5`` for writing an equation side."""
    return f" + {v}" if v >= 0 else f" - {-v}"


def _gen_algebra(level: int, rng: random.Random) -> tuple[str, list[dict]]:
    R = rng.randint
    if level == 1:
        x, a = R(1, 30), R(1, 30)
        if rng.random() < 0.5:
            return f"Solve for x: x + {a} = {x + a}.", [_step("x = {a} - {b} = {r}", x + a, "-", a)]
        return f"Solve for x: x - {a} = {x - a}.", [_step("x = {a} + {b} = {r}", x - a, "+", a)]
    if level == 2:
        x, c, a = R(1, 12), R(2, 9), R(1, 20)
        return (f"Solve for x: {c}x + {a} = {c * x + a}.",
                [_step(f"{c}x = " + "{a} - {b} = {r}", c * x + a, "-", a),
                 _step("x = {a} / {b} = {r}", _ref(0), "/", c)])
    if level == 3:
        x, q = R(-9, 12), R(2, 6)
        p, a = q + R(2, 5), R(1, 20)
        b = (p - q) * x - a
        return (f"Solve for x: {p}x - {a} = {q}x{_signed(b)}.",
                [_step("{a}x - {b}x = {r}x", p, "-", q), _step("{a} + {b} = {r}", b, "+", a),
                 _step("x = {a} / {b} = {r}", _ref(1), "/", _ref(0))])
    x, k, q, a = R(-9, 12), R(3, 7), R(1, 2), R(1, 9)
    b = k * (x + a) - q * x
    qx = "x" if q == 1 else f"{q}x"
    return (f"Solve for x: {k}(x + {a}) = {qx}{_signed(b)}.",
            [_step("{a} * {b} = {r}", k, "*", a), _step("{a}x - {b}x = {r}x", k, "-", q),
             _step("{a} - {b} = {r}", b, "-", _ref(0)), _step("x = {a} / {b} = {r}", _ref(2), "/", _ref(1))])


GENERATORS = {"arith": _gen_arith, "word": _gen_word, "algebra": _gen_algebra}


def is_test_problem(problem: str) -> bool:
    """The fixed train/test partition of the problem space: test iff sha1(text) % 4 == 0."""
    return int(hashlib.sha1(problem.encode("utf-8")).hexdigest(), 16) % 4 == 0


class _CappedRandom:
    """``rng`` whose ``randint(lo, hi)`` never exceeds ``cap`` (but never goes below ``lo``); the rest passes
    through. It shrinks every number a generator draws, so the arithmetic table stays small."""

    def __init__(self, rng: random.Random, cap: int):
        self._rng, self._cap = rng, cap

    def randint(self, lo: int, hi: int) -> int:
        return self._rng.randint(lo, max(lo, min(hi, self._cap)))

    def __getattr__(self, name: str):
        return getattr(self._rng, name)


def generate_math(split: str, n: int, world_seed: int = 0, seed: int = 0,
                  level_weights: dict[str, list[float]] | None = None, max_operand: int = 0) -> list[Task]:
    """``n`` distinct generated problems of ``split`` (``train`` or ``test``), deterministic.

    ``level_weights`` (split -> weights of levels 1-4) defaults to ``DEFAULT_MATH_LEVELS``; ``max_operand``
    (> 0) caps every number the generators draw (``worlds.math_max_operand``)."""
    weights = (level_weights or DEFAULT_MATH_LEVELS)[split]
    rng = random.Random(f"math:{world_seed}:{split}:{seed}")
    if max_operand:
        rng = _CappedRandom(rng, max_operand)
    want_test = split == "test"
    tasks: list[Task] = []
    seen: set[str] = set()
    attempts = 0
    while len(tasks) < n:
        attempts += 1
        if attempts > 100 * n + 1000:
            raise RuntimeError(f"could not generate {n} distinct math {split} problems (got {len(tasks)})")
        level = rng.choices([1, 2, 3, 4], weights=weights)[0]
        family = rng.choice(sorted(GENERATORS))
        problem, steps = GENERATORS[family](level, rng)
        if problem in seen or is_test_problem(problem) != want_test:
            continue
        seen.add(problem)
        answer = _run_steps(steps)[-1]
        tasks.append(
            Task(
                id=f"math-{split}-{hashlib.sha1(problem.encode()).hexdigest()[:10]}",
                domain="math",
                benchmark="aime26" if want_test else TRAIN_BENCHMARK,
                system_prompt="",
                user_prompt=dapo_prompt(problem),
                answer=str(answer),
                meta={"problem": problem, "family": family, "level": level, "steps": steps},
            )
        )
    return tasks


# --- worked solutions (scripted expert, SFT / pretraining corpus) ----------------------------------


def solution_text(task: Task) -> str:
    """A short correct worked solution ending in ``Answer: <value>`` (``Answer: X`` for MC tasks).

    Real-data tasks carry no steps, so their "solution" is the answer line alone.
    """
    if task.meta.get("format") == "mcq":
        return mcq.mcq_solution_text(task)
    steps = task.meta.get("steps")
    if not steps:
        return f"Answer: {task.answer}"
    lines = _render_steps(steps, _run_steps(steps))
    return "\n".join(lines + [f"Answer: {task.answer}"])


def wrong_solution_text(task: Task, rng: random.Random) -> str:
    """A plausible but wrong solution in the same format: one intermediate result is off and the error
    is carried through the later steps (so the final answer is wrong). For MC tasks: a distractor."""
    if task.meta.get("format") == "mcq":
        return mcq.mcq_wrong_solution_text(task, rng)
    steps = task.meta.get("steps")
    for _ in range(50):
        delta = rng.choice([-10, -3, -2, -1, 1, 2, 3, 10])
        if steps:
            k = rng.randrange(len(steps))
            try:
                results = _run_steps(steps, slip=(k, delta))
            except (ZeroDivisionError, ValueError):
                continue
            text = "\n".join(_render_steps(steps, results) + [f"Answer: {results[-1]}"])
        else:
            gold = _as_fraction(normalize_answer(str(task.answer)))
            text = f"Answer: {gold + delta if gold is not None else str(task.answer) + '+1'}"
        if not is_correct(text, str(task.answer)):
            return text
    return "Answer: " + str(task.answer) + "1"  # unreachable in practice; still a wrong answer


def scripted_expert(task: Task, messages: list[dict]) -> str:
    """The expert's (only) assistant turn: the worked solution of ``task``. ``messages`` is unused
    because the domain is single-turn."""
    return solution_text(task)


# --- real data ------------------------------------------------------------------------------------

DATA_FILES = {
    "train": ("dapo_math_17k", (".parquet", ".jsonl", ".json")),
    "test": ("aime26", (".jsonl", ".json", ".parquet")),
    "gpqa": ("gpqa_diamond", (".csv",)),
    "mmlu_redux": ("mmlu_redux", (".jsonl", ".json", ".parquet")),
}


def _norm_text(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip().lower()


def load_dapo(path: Path, exclude_problems: list[str] = ()) -> list[Task]:
    """DAPO-Math-17K rows as tasks, deduplicated by prompt, dropping rows that contain an excluded problem."""
    excluded = [_norm_text(p) for p in exclude_problems if p and p.strip()]
    tasks, seen = [], set()
    for i, row in enumerate(mcq.load_rows(path)):
        msgs = list(row["prompt"])
        user = next((m["content"] for m in reversed(msgs) if m["role"] == "user"), None)
        if user is None or user in seen:
            continue
        seen.add(user)
        low = _norm_text(user)
        if any(p in low for p in excluded):
            continue
        system = next((m["content"] for m in msgs if m["role"] == "system"), "")
        extra = row.get("extra_info") or {}
        index = extra.get("index", i) if isinstance(extra, dict) else i
        tasks.append(
            Task(
                id=f"dapo-{index}",
                domain="math",
                benchmark=TRAIN_BENCHMARK,
                system_prompt=system or "",
                user_prompt=user,
                answer=str(row["reward_model"]["ground_truth"]),
                meta={"data_source": row.get("data_source"), "ability": row.get("ability"), "index": index},
            )
        )
    return tasks


def load_aime(path: Path) -> list[Task]:
    """AIME 2026 in the MathArena schema (``problem_idx`` or ``id``, ``problem``, ``answer``)."""
    tasks = []
    for i, row in enumerate(mcq.load_rows(path)):
        pid = row.get("problem_idx", row.get("id", i))
        tasks.append(
            Task(
                id=f"aime26-{pid}",
                domain="math",
                benchmark="aime26",
                system_prompt="",
                user_prompt=dapo_prompt(str(row["problem"])),
                answer=str(row["answer"]).strip(),
                meta={"problem": str(row["problem"]), "problem_idx": pid},
            )
        )
    return tasks


class MathEnv(Environment):
    """Math reasoning (DAPO prompt, ``Answer:`` line) with GPQA / MMLU-Redux style OOD splits."""

    name = "math"
    splits: dict[str, str | None] = {"train": None, "test": "aime26", "gpqa": "gpqa", "mmlu_redux": "mmlu_redux"}

    def __init__(self, worlds: WorldsConfig | None = None, seed: int = 0):
        self.worlds = worlds if worlds is not None else WorldsConfig()
        self.seed = seed
        self.data_dir = Path(self.worlds.data_dir) / "math" if self.worlds.data_dir else None
        self._pools: dict[str, list[Task]] = {}

    # real data ------------------------------------------------------------------------------------
    def data_path(self, split: str) -> Path:
        """The local file backing ``split`` in real-data mode; FileNotFoundError names what is missing."""
        stem, exts = DATA_FILES[split]
        for ext in exts:
            p = self.data_dir / f"{stem}{ext}"
            if p.is_file():
                return p
        wanted = " or ".join(str(self.data_dir / f"{stem}{e}") for e in exts)
        raise FileNotFoundError(
            f"MathEnv split '{split}' needs {wanted} (worlds.data_dir={self.worlds.data_dir!r}); "
            "see acl_lib/envs/math.py for the expected schema"
        )

    def _pool(self, split: str) -> list[Task]:
        if split not in self._pools:
            path = self.data_path(split)
            if split == "train":
                try:  # keep test problems out of training
                    test = [t.meta["problem"] for t in self._pool("test")]
                except FileNotFoundError:
                    test = []
                self._pools[split] = load_dapo(path, exclude_problems=test)
            elif split == "test":
                self._pools[split] = load_aime(path)
            elif split == "gpqa":
                self._pools[split] = mcq.load_gpqa(path, world_seed=self.seed)
            else:
                self._pools[split] = mcq.load_mmlu_redux(path)
        return self._pools[split]

    # interface ------------------------------------------------------------------------------------
    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        """``n`` tasks of ``split``; deterministic in (world seed, split, n, seed). In real-data mode a
        split with at most ``n`` rows is returned whole, else ``n`` rows drawn with ``seed`` (file order)."""
        if split not in self.splits:
            raise ValueError(f"unknown math split {split!r}; splits are {list(self.splits)}")
        if self.data_dir is not None:
            pool = self._pool(split)
            if n >= len(pool):
                return list(pool)
            rng = random.Random(f"math-real:{self.seed}:{split}:{seed}")
            return [pool[i] for i in sorted(rng.sample(range(len(pool)), n))]
        if split in ("gpqa", "mmlu_redux"):
            return mcq.generate_mcq(split, n, self.seed, seed)
        return generate_math(split, n, self.seed, seed, level_weights=self.worlds.math_levels,
                             max_operand=self.worlds.math_max_operand)

    def start(self, task: Task, max_turns: int = 16) -> Episode:
        return SingleTurnEpisode(task, score_response)
