"""Out-of-domain instruction types (the mini counterpart of IF-Bench): never seen in IF training.

IF-Bench (Pyatkin et al. 2025) tests generalisation to *unseen* verifiable constraints. The ids and
keyword-argument names below are IF-Bench's, so a real ``ifbench.jsonl`` row that uses one of them
loads unchanged; the checks are our own re-implementation of the documented behaviour, with these
deliberate differences (all offline, no nltk / emoji packages):

- words are ``\\w+`` runs (IFEval's ``count_words``) unless a check says otherwise;
- sentences come from :func:`split_sentences` (split after ``.``, ``!``, ``?`` followed by whitespace
  or the end of the text), an approximation of IFEval's regex splitter;
- stop words are a fixed English list (:data:`STOP_WORDS`, close to nltk's), not nltk's corpus;
- an emoji is any character in the main Unicode emoji blocks (:func:`is_emoji`), not the ``emoji``
  package's table;
- ``count:conjunctions`` counts *distinct* conjunctions after stripping punctuation (IF-Bench keeps
  the raw tokens, so ``and`` and ``and,`` counted as two);
- ``ratio:sentence_type`` needs at least one question (IF-Bench also accepts 0 and 0);
- ``format:newline`` needs every non-blank line to hold exactly one word;
- ``format:emoji`` needs the emoji at the end of each sentence (IF-Bench also accepts one that opens
  the next sentence).

Every check takes ``(response, kwargs)`` with ``None`` kwargs already dropped and returns a bool; the
registry of :mod:`acl_lib.envs.ifeval_checks` lists them next to the IFEval ones, and its
``check_instruction`` guarantees that a check never raises on model text.
"""

from __future__ import annotations

import re
import string
from collections.abc import Callable
from dataclasses import dataclass

_PUNCT_TABLE = str.maketrans("", "", string.punctuation)

# Close to nltk's English stop-word list (the one IF-Bench uses), written out so nothing is downloaded.
STOP_WORDS = frozenset(
    """i me my myself we our ours ourselves you your yours yourself yourselves he him his himself she
    her hers herself it its itself they them their theirs themselves what which who whom this that these
    those am is are was were be been being have has had having do does did doing a an the and but if or
    because as until while of at by for with about against between into through during before after
    above below to from up down in out on off over under again further then once here there when where
    why how all any both each few more most other some such no nor not only own same so than too very s
    t can will just don should now d ll m o re ve y ain aren couldn didn doesn hadn hasn haven isn ma
    mightn mustn needn shan shouldn wasn weren won wouldn""".split()
)

CONJUNCTIONS = ("and", "but", "for", "nor", "or", "so", "yet")

# IF-Bench's list of person names for count:person_names.
PERSON_NAMES = (
    "Emma Liam Sophia Jackson Olivia Noah Ava Lucas Isabella Mason Mia Ethan Charlotte Alexander Amelia "
    "Benjamin Harper Leo Zoe Daniel Chloe Samuel Lily Matthew Grace Owen Abigail Gabriel Ella Jacob "
    "Scarlett Nathan Victoria Elijah Layla Nicholas Audrey David Hannah Christopher Penelope Thomas Nora "
    "Andrew Aria Joseph Claire Ryan Stella Jonathan"
).split()

# Main Unicode emoji blocks (code point ranges, inclusive).
_EMOJI_RANGES = (
    (0x1F000, 0x1FAFF),  # mahjong .. symbols & pictographs extended-A (faces, objects, flags)
    (0x2600, 0x27BF),  # miscellaneous symbols, dingbats
    (0x2B00, 0x2BFF),  # arrows and stars used as emoji (e.g. U+2B50 star)
    (0x2300, 0x23FF),  # technical: watch, hourglass
)


def is_emoji(ch: str) -> bool:
    """True if the single character ``ch`` lies in one of the main emoji blocks."""
    return len(ch) == 1 and any(lo <= ord(ch) <= hi for lo, hi in _EMOJI_RANGES)


def words(text: str) -> list[str]:
    """``\\w+`` tokens (IFEval's word count tokenizer)."""
    return re.findall(r"\w+", text)


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``: cut after ``.``/``!``/``?`` runs followed by whitespace or the end.

    Newlines count as spaces; empty pieces are dropped; each sentence keeps its end punctuation.
    """
    flat = text.replace("\n", " ")
    parts = re.split(r"(?<=[.!?])\s+", flat)
    return [p.strip() for p in parts if p.strip()]


# --- checks -------------------------------------------------------------------------------------


def _word_count_range(resp: str, kw: dict) -> bool:
    n = len(words(resp))
    return int(kw["min_words"]) <= n <= int(kw["max_words"])


def _unique_word_count(resp: str, kw: dict) -> bool:
    # Whitespace tokens, lowercased, outer punctuation stripped (as IF-Bench).
    uniq = {w.strip(string.punctuation + " ") for w in resp.lower().split()}
    return len(uniq) >= int(kw["N"])


def _stop_words(resp: str, kw: dict) -> bool:
    toks = [w.lower() for w in words(resp)]
    if not toks:
        return False
    share = 100.0 * sum(t in STOP_WORDS for t in toks) / len(toks)
    return share <= float(kw["percentage"])


def _conjunctions(resp: str, kw: dict) -> bool:
    found = {w.strip(string.punctuation).lower() for w in resp.split()} & set(CONJUNCTIONS)
    return len(found) >= int(kw["small_n"])


_NAME_RE = re.compile(r"\b(" + "|".join(PERSON_NAMES) + r")\b")


def _person_names(resp: str, kw: dict) -> bool:
    return len(set(_NAME_RE.findall(resp))) >= int(kw["N"])


def _numbers(resp: str, kw: dict) -> bool:
    # Punctuation removed first so 3.5 and 1,000 each count as one number (as IF-Bench).
    return len(re.findall(r"\d+", resp.translate(_PUNCT_TABLE))) == int(kw["N"])


_PRIMES = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47}


def _prime_lengths(resp: str, kw: dict) -> bool:
    toks = resp.translate(_PUNCT_TABLE).split()
    return bool(toks) and all(len(t) in _PRIMES for t in toks)


def _newline(resp: str, kw: dict) -> bool:
    text = resp.translate(_PUNCT_TABLE).strip()
    lines = [ln for ln in text.split("\n") if ln.strip()]
    return bool(lines) and all(len(ln.split()) == 1 for ln in lines)


def _sentence_type(resp: str, kw: dict) -> bool:
    sents = split_sentences(resp)
    decl = sum(s.endswith(".") for s in sents)
    ques = sum(s.endswith("?") for s in sents)
    return ques > 0 and decl == 2 * ques


def _emoji(resp: str, kw: dict) -> bool:
    """Every sentence ends with an emoji (its last or second-last character once punctuation is gone)."""
    sents = split_sentences(resp)
    if not sents:
        return False
    for s in sents:
        core = s.translate(_PUNCT_TABLE).rstrip()
        if not core or not any(is_emoji(c) for c in core[-2:]):
            return False
    return True


@dataclass(frozen=True)
class OODSpec:
    """One unseen instruction type: its check, its required kwargs and its prompt phrasing."""

    check: Callable[[str, dict], bool]
    required: tuple[str, ...]
    describe: Callable[[dict], str]


OOD_SPECS: dict[str, OODSpec] = {
    "count:word_count_range": OODSpec(
        _word_count_range,
        ("min_words", "max_words"),
        lambda k: f"The response must contain between {k['min_words']} and {k['max_words']} words.",
    ),
    "count:unique_word_count": OODSpec(
        _unique_word_count, ("N",), lambda k: f"Use at least {k['N']} unique words in the response."
    ),
    "ratio:stop_words": OODSpec(
        _stop_words,
        ("percentage",),
        lambda k: f"Ensure that stop words constitute no more than {k['percentage']}% of the total words in your "
        "response.",
    ),
    "count:conjunctions": OODSpec(
        _conjunctions,
        ("small_n",),
        lambda k: f"Use at least {k['small_n']} different coordinating conjunctions in the response.",
    ),
    "count:person_names": OODSpec(
        _person_names,
        ("N",),
        lambda k: f"Mention at least {k['N']} different person names in the response, from this list of person names: "
        + ", ".join(PERSON_NAMES[:20])
        + ".",
    ),
    "count:numbers": OODSpec(_numbers, ("N",), lambda k: f"Include exactly {k['N']} numbers in the response."),
    "words:prime_lengths": OODSpec(
        _prime_lengths, (), lambda k: "Use only words with lengths that are prime numbers."
    ),
    "format:newline": OODSpec(_newline, (), lambda k: "Write each word on a new line."),
    "ratio:sentence_type": OODSpec(
        _sentence_type, (), lambda k: "Maintain a 2:1 ratio of declarative to interrogative sentences."
    ),
    "format:emoji": OODSpec(_emoji, (), lambda k: "Please use an emoji at the end of every sentence."),
}
