"""Math answers: the final answer of a response, its normal form, and whether it equals the ground truth.

``extract_answer``, ``normalize_answer``, ``answers_match`` and ``is_correct`` score the math domain's answers
(``acl_lib.envs.math`` re-exports them and documents the rules); they follow DAPO/verl ``math_dapo.py`` with
math-verify for symbolic equality, and are checked against both on the hand-written cases of
``tests/data/math_answer_cases.yaml`` (``docs/math-scorer-agreement.md``). Nothing here raises on model output.
"""

from __future__ import annotations

import logging
import re
from fractions import Fraction

for _name in ("math_verify", "math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).setLevel(logging.CRITICAL)  # parse failures on model text are expected


# --- extraction ---------------------------------------------------------------------------------

_ANSWER_KEY = re.compile(r"(?i)answer\s*:")
_NON_SPACE = re.compile(r"\S")
_BOX_COMMANDS = ("\\boxed", "\\fbox")


def _close_brace(text: str, i: int, stop: int | None = None) -> int:
    """Index of the ``}`` closing the brace opened just before ``text[i]`` (nested braces count), or -1 when it
    is not closed before ``stop``."""
    depth = 1
    for j in range(i, len(text) if stop is None else stop):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return -1


def _last_box(text: str, end: int | None = None) -> tuple[int, int, int] | None:
    """(start, content start, closing brace) of the last ``\\boxed{`` / ``\\fbox{`` starting before ``end``,
    or None when there is none or it is not closed (before ``end``, when given)."""
    starts = [(text.rfind(c + "{", 0, len(text) if end is None else end), c) for c in _BOX_COMMANDS]
    idx, cmd = max(starts)
    if idx < 0:
        return None
    i = idx + len(cmd) + 1  # just after the opening brace
    j = _close_brace(text, i, end)
    return (idx, i, j) if j >= 0 else None



def _last_braced(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced nested braces, else None."""
    box = _last_box(text)
    return None if box is None else text[box[1] : box[2]]

# What may stand between two boxes that give one answer together ("\boxed{3} or \boxed{4}", "\boxed{3},
# \boxed{4}"): a hedge or a list, which the comparison then rejects (one value is asked for).
_BOX_JOINER = re.compile(r"(?i)[\s,;/&]*(?:(?:or|and|maybe|perhaps|possibly|either)\b[\s,;/&]*)*")


def _boxed_answer(text: str) -> str | None:
    """The last box's content; when boxes before it are joined to it by only a connector (``,`` ``or``
    ``and`` ``maybe``), the raw span from the first of them (``\\boxed{3} or \\boxed{4}``). None if no box."""
    box = _last_box(text)
    if box is None:
        return None
    first = box
    for _ in range(5):  # a few boxes back at most: the scan stays linear in the text
        prev = _last_box(text, first[0])
        if prev is None or first[0] - prev[2] > 30 or not _BOX_JOINER.fullmatch(text, prev[2] + 1, first[0]):
            break
        first = prev
    if first is box:
        return text[box[1] : box[2]]
    return text[first[0] : box[2] + 1]


def extract_answer(response: str) -> str | None:
    """The final answer of ``response`` (raw, stripped), or None. See the module docstring. Never raises."""
    if not isinstance(response, str) or not response:
        return None
    # The last key with a non-empty value wins, so the keys are tried from the end: each value is read from
    # its own line only (slicing the rest of the response for every key is quadratic on "answer:" * 20,000).
    for m in reversed(list(_ANSWER_KEY.finditer(response))):
        start = _NON_SPACE.search(response, m.end())  # DAPO's \s* after the colon, newlines included
        if start is None:
            continue
        end = response.find("\n", start.start())
        value = response[start.start() : end if end >= 0 else len(response)]
        value = value.strip().strip("*").strip()  # "**Answer:** 7" -> "7"
        if value:
            return value
    boxed = _boxed_answer(response)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    return None


# --- normalisation and comparison -------------------------------------------------------------------

_WRAPPERS = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_REPLACEMENTS = (("\\left", ""), ("\\right", ""), ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\$", ""),
                 ("$", ""), ("\\(", ""), ("\\)", ""), ("\\[", ""), ("\\]", ""), ("{,}", ","), ("\\!", ""),
                 ("\\qquad", " "), ("\\quad", " "), ("\\,", " "), ("\\;", " "), ("\\:", " "), ("\\ ", " "),
                 ("~", " "), ("^{\\circ}", ""), ("^\\circ", ""), ("°", ""))
# a tilde before a number at the start or after a space, "=" or "(" is plain text's "approximately" ("~42");
# elsewhere it is LaTeX's tie, a space ("42~cm")
_APPROX_TILDE = re.compile(r"(?:^|(?<=[\s=(:]))~(?=\s*[-+.\d])")
_MINUS = str.maketrans({"\u2212": "-", "\ufe63": "-", "\uff0d": "-"})  # minus sign, small and full-width hyphen-minus
# Words that hedge, negate or bound a value ("3 or 4", "not 7", "about 42", "at least 3"): where they appear
# around an answer it is not one plain value, whatever number stands beside them.
_HEDGE_WORDS = frozenset(
    "or and nor not no never maybe perhaps possibly probably likely approximately approx about around roughly "
    "nearly almost circa either neither unless if but except wrong incorrect false least most than between "
    "cannot isn't aren't wasn't".split())
# A lead that names the answer before it ("So the answer is", "The number of apples is", "It is", "We get").
_CONNECTIVE = re.compile(r"(?i)(?:so|thus|therefore|hence|then|finally)\b\s*,?\s*")
_LEAD = re.compile(r"(?i)(?:(?:the|my|our|its|this)\s+([a-z][a-z' -]{0,60}?)\s+(?:is|equals)\b|(?:it|this|that)\s+is\b"
                   r"|(?:we|i)\s+(?:get|got|obtain|find|have)\b)\s*:?\s*")
_LEAD_SUBJECT_BLOCK = _HEDGE_WORDS | frozenset(
    "twice double half triple square squared cube cubed reciprocal inverse negative opposite minus plus times "
    "more less think believe guess".split())
_TRAILERS = ("i hope it is correct", "is my final answer", "is the final answer", "is my answer", "is the answer",
             "is the correct answer", "is correct")
_REJECTED = re.compile(r"(?i),\s*not\s+[-+]?\d[\d.,/]*")  # "7, not 8": the alternative named and rejected
_NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
_TENS = {w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)}
_NUMBER_WORD = re.compile(r"(?i)([a-z]+)(?:[- ]([a-z]+))?(\s+(?:hundred|thousand|million|billion|trillion|dozen))?")
_SCALED = re.compile(r"(?i)([-+]?\d[\d,]{0,30}(?:\.\d{1,30})?)\s+"
                     r"(hundred|thousand|million|billion|trillion|dozen)\b(.*)")
_SCALES = {"hundred": 100, "thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12, "dozen": 12}
_PI_WORD = re.compile(r"(?i)(?<![A-Za-z\\])pi(?![A-Za-z])")
# a number, whitespace, then unit words ("12 apples", "3 square cm", "5 m^2", "5 m/s"); each word is then
# checked by _unit_word_ok, so "12 thousand", "2 pi", "7 is not correct" and "3 or four" are not units
_UNIT_TAIL = re.compile(r"([-+]?\d[\d,]*(?:\.\d+)?(?:/\d+)?)\s+([A-Za-z][A-Za-z²³^{}/\s23]*?)\.?")
_UNIT_TOKEN = re.compile(r"([A-Za-z]+)(?:\^\{?[23]\}?|[²³])?(?:/([A-Za-z]+)(?:\^\{?[23]\}?|[²³])?)?")
_UNIT_WORDS = frozenset(
    "mm cm km in inch ft foot feet yd yard mi mile meter metre centimeter centimetre millimeter kilometer square sq "
    "cubic cu mg kg gram kilogram lb lbs oz pound ounce ton tonne ml liter litre gallon cup sec second min minute "
    "hr hour day week month year mph kph kmh deg degree rad radian dollar cent usd eur euro percent per unit "
    "point total each altogether left remaining".split())
_UNIT_LETTERS = frozenset("mgsL")  # one-letter units; any other letter is a variable or a constant (x, e, i)
# plural nouns that are not units: scales, fractions, verbs and adverbs ending in s
_NOT_UNITS = frozenset(
    "hundreds thousands millions billions trillions dozens tens ones lakhs crores halves thirds quarters fourths "
    "fifths sixths sevenths eighths ninths tenths hundredths thousandths is was has does yes less this thus "
    "plus its perhaps always sometimes unless".split())
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_SPACED_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:\s\d{3})+(?![\d.])")  # "1 234", "12 345 678"
_MIXED = re.compile(r"([-+]?)(\d{1,18})\s+(\d{1,18})/(\d{1,18})")  # "1 1/2": one and a half
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)|[-+]?\d+/\d+")


def _words(s: str) -> list[str]:
    """Lower-cased words of ``s`` that are not LaTeX command names."""
    return [w.lower() for w in re.findall(r"(?<![\\A-Za-z'])[A-Za-z']+", s)]


def _hedged(left: str) -> bool:
    """Whether the side before an answer's last ``=`` hedges (``x = 3 or x``) or lists equations (``x = 3,
    y``); a tuple on the left (``(x, y) = (3, 4)``) does not."""
    if ("," in left or ";" in left) and "=" in left:
        return True
    return any(w in _HEDGE_WORDS or w.endswith("n't") for w in _words(left))


def _unwrap_boxes(s: str) -> str:
    """Every balanced ``\\boxed{x}`` / ``\\fbox{x}`` of ``s`` replaced by ``x`` (the words around stay)."""
    for _ in range(8):
        idx, cmd = min(((s.find(c + "{"), c) for c in _BOX_COMMANDS if c + "{" in s), default=(-1, ""))
        if idx < 0:
            break
        j = _close_brace(s, idx + len(cmd) + 1)
        if j < 0:
            break
        s = s[:idx] + s[idx + len(cmd) + 1 : j] + s[j + 1 :]
    return s


def _strip_prose(s: str) -> str:
    """``s`` without a lead that names the answer (``So the answer is``) and a trailer (``. I hope it is
    correct.``, ``is the answer``); a lead whose subject hedges or transforms the value stays."""
    t = s.rstrip(" .!")
    low = t.lower()
    for phrase in _TRAILERS:
        if low.endswith(phrase) and (len(t) == len(phrase) or not t[-len(phrase) - 1].isalnum()):
            t = t[: len(t) - len(phrase)].rstrip(" .,;!")
            break
    rejected = _REJECTED.search(t)
    if rejected and rejected.end() == len(t) and rejected.start() > 0:
        t = t[: rejected.start()]
    m = _CONNECTIVE.match(t)
    if m and m.end() < len(t):
        t = t[m.end() :]
    m = _LEAD.match(t)
    if m and m.end() < len(t):
        subject = m.group(1) or ""
        if not any(w in _LEAD_SUBJECT_BLOCK or w.endswith("n't") for w in _words(subject)):
            t = t[m.end() :]
    return t if t.strip() else s


def _spell_out(s: str) -> str:
    """Value words as symbols: ``negative 5`` -> ``-5``, ``pi`` -> ``\\pi``, ``twelve`` -> ``12``, ``12
    thousand`` -> ``12000`` (then "12 thousand" never equals 12)."""
    s = re.sub(r"(?i)^(?:negative|minus)\s+(?=[\d.\\(])", "-", s)
    s = _PI_WORD.sub(r"\\pi", s)
    m = _NUMBER_WORD.fullmatch(s)  # "twelve", "twenty-one", "five hundred"
    if m:
        head, unit, scale = m.group(1).lower(), (m.group(2) or "").lower(), m.group(3) or ""
        if unit in _SCALES and not scale:  # "five hundred"
            unit, scale = "", " " + unit
        if not unit and head in _NUMBER_WORDS:
            s = str(_NUMBER_WORDS[head]) + scale
        elif head in _TENS and 0 < _NUMBER_WORDS.get(unit, 0) < 10:
            s = str(_TENS[head] + _NUMBER_WORDS[unit]) + scale
    m = _SCALED.fullmatch(s)
    if m and ("," not in m.group(1) or _THOUSANDS.fullmatch(m.group(1))):
        value = Fraction(m.group(1).replace(",", "")) * _SCALES[m.group(2).lower()]
        s = str(value) + m.group(3)
    return s


def _unit_word_ok(w: str) -> bool:
    if len(w) == 1:
        return w in _UNIT_LETTERS
    w = w.lower()
    return w in _UNIT_WORDS or (len(w) >= 3 and w.endswith("s") and w not in _NOT_UNITS)


def _drop_unit(s: str) -> str:
    """The number of ``<number> <unit words>``, when every word is a unit or a plural noun; else ``s``."""
    m = _UNIT_TAIL.fullmatch(s)
    if not m:
        return s
    tokens = m.group(2).split()
    for tok in tokens:
        t = _UNIT_TOKEN.fullmatch(tok)
        if len(tokens) > 4 or t is None or not all(_unit_word_ok(w) for w in t.groups() if w):
            return s
    return m.group(1)


def _squeeze(s: str) -> str:
    """``s`` without whitespace, except one space between two digits ("3 4" is two numbers, not 34) or two
    letters (``\\pi radians``): a space left in means the answer is not one plain value."""
    parts = s.split()
    out = parts[0] if parts else ""
    for p in parts[1:]:
        a, b = out[-1], p[0]
        out += (" " if (a.isdigit() and b.isdigit()) or (a.isalpha() and b.isalpha()) else "") + p
    return out


def normalize_answer(answer: str) -> str:
    """Canonical string form of a final answer (rules in the module docstring). Never raises."""
    if not isinstance(answer, str):
        answer = "" if answer is None else str(answer)
    s = _unwrap_boxes(answer.strip().strip("*`").strip()).translate(_MINUS)
    s = _APPROX_TILDE.sub("≈", s)
    for old, new in _REPLACEMENTS:
        s = s.replace(old, new)
    for _ in range(3):  # nested wrappers, innermost first
        s = _WRAPPERS.sub(r"\1", s)
    s = _strip_prose(s.strip())
    if "=" in s:
        left, right = s.rsplit("=", 1)
        if right.strip() and not _hedged(left):  # "x = 5" -> "5"; "x = 3 or x = 4" stays whole
            s = right
    s = _drop_unit(_spell_out(s.strip()))
    s = _SPACED_THOUSANDS.sub(lambda m: re.sub(r"\s", "", m.group()), s)
    mixed = _MIXED.fullmatch(s)
    if mixed and int(mixed.group(4)) > 0:
        sign, whole, num, den = mixed.groups()
        s = sign + str(Fraction(int(whole) * int(den) + int(num), int(den)))
    s = _squeeze(s)
    s = s.rstrip(".") if len(s.rstrip(".")) > 0 else s
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    if s.startswith("+") and len(s) > 1:
        s = s[1:]
    return s


def _as_fraction(s: str) -> Fraction | None:
    """``s`` as an exact rational if it is a plain number (int, decimal, ``a/b``), else None."""
    if len(s) > 60 or not _NUMBER.fullmatch(s):
        return None
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


# Inputs that make sympy compute something huge: big powers, towers, factorials of big numbers or of
# factorials (``99!!`` is (99!)!), binomials.
_RISKY = re.compile(r"\^\s*\{?\s*[-+]?\d{3,}|\^[^^]*\^|\d{3,}\s*!|[!)}\]]\s*!|\\binom")
# Bounds on what reaches math-verify (measured on 2 loaded cores: within them a parse takes < 0.5 s; its
# LaTeX parser slows down steeply with nesting: 20 nested braces took 5-7 s).
MV_MAX_CHARS = 100
MV_MAX_DEPTH = 4


def _bracket_depth(s: str) -> int:
    depth = best = 0
    for ch in s:
        if ch in "([{":
            depth += 1
            best = max(best, depth)
        elif ch in ")]}":
            depth = max(0, depth - 1)
    return best


def math_verify_safe(s: str) -> bool:
    """Whether ``s`` (a normalised answer) is small enough to hand to math-verify: at most ``MV_MAX_CHARS``
    characters and ``MV_MAX_DEPTH`` nested brackets, no huge power or factorial (``_RISKY``)."""
    return len(s) <= MV_MAX_CHARS and _bracket_depth(s) <= MV_MAX_DEPTH and not _RISKY.search(s)


def _math_verify_equal(pred: str, gold: str) -> bool:
    """math-verify equivalence of two normalised answers (gold first, as math-verify expects).

    The time is bounded by the input (``math_verify_safe``), not by math-verify's own timeouts: those use
    ``signal.alarm``, which works only on the main thread (a trainer's worker thread waited > 120 s), so they
    are turned off everywhere and the result is the same on every thread."""
    if not (math_verify_safe(pred) and math_verify_safe(gold)):
        return False
    from math_verify import parse, verify

    try:
        g = parse("\\boxed{" + gold + "}", parsing_timeout=None)
        p = parse("\\boxed{" + pred + "}", parsing_timeout=None)
        if not g or not p:
            return False
        return bool(verify(g, p, timeout_seconds=None))
    except Exception:  # any sympy/parse failure means "not shown equal"
        return False


# What marks a normalised prediction as more than one value (a hedge, a bound, a relation, prose, two numbers):
# math-verify would read the first value in it and score "7 is not correct" or "\\pm 3" as 7 or 3.
_NOT_ONE_VALUE = ("\\pm", "\\mp", "\\approx", "\\neq", "\\ne", "\\sim", "\\le", "\\ge", "\\lt", "\\gt", "\\lor",
                  "\\vee", "<", ">", "±", "∓", "≈", "≠", "≤", "≥", "=", " ", "?")
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")


def _comparable(pred: str, gold: str) -> bool:
    """Whether math-verify may judge ``pred`` against ``gold`` (both normalised): not when ``pred`` carries a
    word of two or more letters (not a LaTeX command) or one of ``_NOT_ONE_VALUE`` that ``gold`` does not."""
    if _PROSE_WORD.search(pred) and not _PROSE_WORD.search(gold):
        return False
    return not any(mark in pred and mark not in gold for mark in _NOT_ONE_VALUE)


def answers_match(pred: str, gold: str) -> bool:
    """Whether an extracted answer equals the ground truth after normalisation. Never raises."""
    try:
        p, g = normalize_answer(pred), normalize_answer(gold)
        if not p or not g:
            return False
        if p == g:
            return True
        fp, fg = _as_fraction(p), _as_fraction(g)
        if fp is not None and fg is not None:
            return fp == fg
        return _comparable(p, g) and _math_verify_equal(p, g)
    except Exception:
        return False


def is_correct(response: str, ground_truth: str) -> bool:
    """True when the last ``Answer:`` (or ``\\boxed{}``) of ``response`` equals ``ground_truth``."""
    pred = extract_answer(response)
    return pred is not None and answers_match(pred, ground_truth)
