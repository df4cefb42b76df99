"""Instruction following (IF): prompts with verifiable constraints, scored by IFEval's rules.

Splits (``InstructEnv.splits``): ``train`` (no benchmark; tasks carry ``benchmark="ifeval_train"``),
``test`` -> ``ifeval`` (held-out topics and keyword pools, same constraint families), ``ifbench`` ->
``ifbench`` (only the unseen constraint types of :mod:`acl_lib.envs.instruct_ood`).

A task's ``answer`` is an IFEval row: ``{"key", "prompt", "instruction_id_list", "kwargs"}``. The
episode is single-turn; its reward is the *fraction* of the prompt's instructions the response follows
(strict), and ``failure`` lists the failed ids. The benchmark score is IFEval's prompt-level strict
accuracy: ``Task.meta["score_kind"] == "all"`` tells the harness to report the percentage of episodes
whose reward is exactly 1.0 (:func:`ifeval_scores` gives all four IFEval numbers from raw responses).

Verifiers follow google-research/instruction_following_eval (ids, kwargs names, relations, regexes),
re-implemented here. Differences, all because nothing can be downloaded at run time:

- ``length_constraints:number_sentences`` uses :func:`split_sentences`, a regex approximation of nltk's
  punkt model (abbreviations, initials, numbers and ellipses handled by simple rules);
- ``change_case:capital_word_frequency`` tokenises with a regex close to nltk's ``word_tokenize``;
- ``change_case:english_lowercase`` / ``english_capital`` check the case only (IFEval also asks
  ``langdetect`` that the text is English);
- ``language:response_language`` needs the optional ``langdetect`` package: tasks that use it fail to
  load with a clear error when it is missing;
- a keyword / section splitter / postscript marker that is not a valid regex is matched literally
  (IFEval would crash);
- ``detectable_format:number_highlighted_sections`` counts ``*x*`` and ``**x**`` as IFEval's current
  version does.

Like IFEval's evaluation, an empty (whitespace-only) response follows no instruction.
"""

from __future__ import annotations

import collections
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from acl_lib.chat import THINK_CLOSE, THINK_OPEN, strip_think
from acl_lib.envs.base import Environment, Episode, SingleTurnEpisode, Task
from acl_lib.envs.instruct_ood import OOD_SPECS

TRAIN_BENCHMARK = "ifeval_train"
RELATIONS = ("less than", "at least")
CONSTRAINED_OPTIONS = ("My answer is yes.", "My answer is no.", "My answer is maybe.")

# ============================== text utilities ==============================


def count_words(text: str) -> int:
    """Number of ``\\w+`` runs (IFEval: nltk ``RegexpTokenizer(r"\\w+")``)."""
    return len(re.findall(r"\w+", text))


# Lower-cased tokens (without the final period) that punkt's English model treats as abbreviations.
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs etc inc ltd co corp jan feb apr jun jul aug sep sept oct nov dec "
    "approx dept gov mt vol ave blvd lt sgt capt".split()  # no ordinary words (sun, sat, no, ...)
)
# (?<!...) starts a match only at the beginning of a punctuation run (keeps long runs linear)
_SENT_END = re.compile(r"(?<![.!?])([.!?]+)([\"'\u201d\u2019)\]*]*)(\s+)")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``, approximating nltk punkt (English), which IFEval uses to count them.

    A run of ``.``/``!``/``?`` (plus closing quotes/brackets) followed by whitespace ends a sentence,
    except: a period after a known abbreviation or a token with inner periods (``e.g.``, ``U.S.``,
    ``P.S.``) or a single-letter initial; a period after a number when the next word is lowercase; an
    ellipsis when the next word is lowercase. Newlines alone never split (as in punkt).
    """
    out, start = [], 0
    for m in _SENT_END.finditer(text):
        punct = m.group(1)
        nxt = text[m.end() : m.end() + 1]
        if "!" not in punct and "?" not in punct:
            tail = text[max(start, m.start(1) - 64) : m.start(1)]  # the word before the period
            prev = (tail.split()[-1] if tail and not tail[-1].isspace() else "").lstrip("\"'([*").lower()
            if len(punct) > 1:  # ellipsis: a break only before a capitalised word
                if not nxt.isupper():
                    continue
            elif prev in _ABBREVIATIONS or re.fullmatch(r"(?:[^\W\d_]\.)+[^\W\d_]", prev) or (
                len(prev) == 1 and prev.isalpha()
            ):
                continue  # abbreviation (e.g. / u.s / p.s) or initial
            elif re.fullmatch(r"\d+(?:[.,]\d+)*", prev) and nxt.islower():
                continue  # a number ends a sentence only before a capitalised word
        out.append(text[start : m.end(2)])
        start = m.end()
    out.append(text[start:])
    return [s.strip() for s in out if s.strip()]


def count_sentences(text: str) -> int:
    return len(split_sentences(text))


# Abbreviations with inner periods stay one token, words keep inner hyphens, punctuation is separate
# (close to nltk word_tokenize, which IFEval's capital_word_frequency uses).
_TOKEN = re.compile(r"[A-Za-z](?:\.[A-Za-z])+\.?|\w+(?:-\w+)*|[^\w\s]")


def word_tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def _compile(pattern: str, flags: int = 0) -> re.Pattern:
    """IFEval uses kwargs as raw regexes; an invalid one is matched literally instead of crashing."""
    try:
        return re.compile(pattern, flags)
    except re.error:
        return re.compile(re.escape(pattern), flags)


def _compare(count: int, relation: str, threshold) -> bool:
    if relation == "less than":
        return count < int(threshold)
    if relation == "at least":
        return count >= int(threshold)
    raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}")


# ============================== IFEval verifiers ==============================
# Each takes (response, kwargs-without-None) and returns a bool.


def _keywords_existence(r: str, k: dict) -> bool:
    return all(_compile(kw, re.IGNORECASE).search(r) for kw in k["keywords"])


def _keywords_frequency(r: str, k: dict) -> bool:
    n = len(_compile(k["keyword"].strip(), re.IGNORECASE).findall(r))
    return _compare(n, k["relation"], k["frequency"])


def _forbidden_words(r: str, k: dict) -> bool:
    return not any(_compile(r"\b" + w + r"\b", re.IGNORECASE).search(r) for w in k["forbidden_words"])


def _letter_frequency(r: str, k: dict) -> bool:
    letter = str(k["letter"]).strip().lower()
    if len(letter) != 1:
        raise ValueError(f"letter must be one character, got {k['letter']!r}")
    return _compare(collections.Counter(r.lower())[letter], k["let_relation"], k["let_frequency"])


def _response_language(r: str, k: dict) -> bool:
    import langdetect  # optional; checked at task-load time

    langdetect.DetectorFactory.seed = 0  # langdetect is random by default
    try:
        return langdetect.detect(r) == k["language"]
    except langdetect.LangDetectException:
        return True  # IFEval counts undetectable text as following


def _number_sentences(r: str, k: dict) -> bool:
    return _compare(count_sentences(r), k["relation"], k["num_sentences"])


def _number_paragraphs(r: str, k: dict) -> bool:
    parts = re.split(r"\s?\*\*\*\s?", r)
    n = len(parts)
    for i, p in enumerate(parts):
        if not p.strip():
            if i in (0, len(parts) - 1):
                n -= 1  # a divider at the very start or end adds no paragraph
            else:
                return False  # two dividers with nothing between
    return n == int(k["num_paragraphs"])


def _number_words(r: str, k: dict) -> bool:
    return _compare(count_words(r), k["relation"], k["num_words"])


def _nth_paragraph_first_word(r: str, k: dict) -> bool:
    paragraphs = r.split("\n\n")
    n = sum(1 for p in paragraphs if p.strip())
    nth = int(k["nth_paragraph"])
    if not 1 <= nth <= n:
        return False
    para = paragraphs[nth - 1].strip()  # IFEval indexes the raw split (empty pieces included)
    if not para:
        return False
    word = para.split()[0].strip().lstrip("'").lstrip('"')
    first = ""
    for ch in word:
        if ch in {".", ",", "?", "!", "'", '"'}:
            break
        first += ch.lower()
    return n == int(k["num_paragraphs"]) and first == str(k["first_word"]).lower()


def _postscript(r: str, k: dict) -> bool:
    # IFEval runs findall(r"\s*<marker>.*$", MULTILINE) on the lowercased text. The leading \s* may be
    # empty and ".*$" always matches, so that is a plain search for the marker (without IFEval's
    # quadratic time on long whitespace runs).
    marker = str(k["postscript_marker"]).strip()
    if marker == "P.P.S":
        pattern = r"p\.\s?p\.\s?s"
    elif marker == "P.S.":
        pattern = r"p\.\s?s\."
    else:
        pattern = marker.lower()
    return bool(_compile(pattern).search(r.lower()))


def _number_placeholders(r: str, k: dict) -> bool:
    return len(re.findall(r"\[.*?\]", r)) >= int(k["num_placeholders"])


def count_bullets(text: str, marker: str) -> int:
    """Number of IFEval bullet matches: ``findall(r"^\\s*\\*[^\\*].*$", MULTILINE)`` for ``marker="*"``,
    ``findall(r"^\\s*-.*$", MULTILINE)`` for ``"-"``, computed in linear time (the regexes are quadratic
    on long whitespace runs). Like the regex, the leading whitespace may span newlines."""
    n, i, count = len(text), 0, 0
    while i <= n:  # i is a line start
        j = i
        while j < n and text[j].isspace():
            j += 1
        if marker == "*":
            ok, rest = j < n - 1 and text[j] == "*" and text[j + 1] != "*", j + 2
        else:
            ok, rest = j < n and text[j] == "-", j + 1
        count += ok
        # after a match the search resumes at the end of its line; after a failure every line start
        # inside the same whitespace run fails the same way
        e = text.find("\n", rest if ok else j)
        if e == -1:
            break
        i = e + 1
    return count


def _number_bullet_lists(r: str, k: dict) -> bool:
    return count_bullets(r, "*") + count_bullets(r, "-") == int(k["num_bullets"])


def _constrained_response(r: str, k: dict) -> bool:
    r = r.strip()
    return any(opt in r for opt in CONSTRAINED_OPTIONS)


def _number_highlighted_sections(r: str, k: dict) -> bool:
    single = [h for h in re.findall(r"\*[^\n\*]*\*", r) if h.strip("*").strip()]
    double = [h for h in re.findall(r"\*\*[^\n\*]*\*\*", r) if h[2:-2].strip()]
    return len(single) + len(double) >= int(k["num_highlights"])


def _multiple_sections(r: str, k: dict) -> bool:
    splitter = str(k["section_spliter"]).strip()
    sections = _compile(r"\s?" + splitter + r"\s?\d+\s?").split(r)
    return len(sections) - 1 >= int(k["num_sections"])


def _json_format(r: str, k: dict) -> bool:
    v = r.strip()
    for fence in ("```json", "```Json", "```JSON", "```"):
        v = v.removeprefix(fence)
    v = v.removesuffix("```").strip()
    try:
        json.loads(v)
    except ValueError:
        return False
    return True


def _title(r: str, k: dict) -> bool:
    return any(t.lstrip("<").rstrip(">").strip() for t in re.findall(r"<<[^\n]+>>", r))


def _english_lowercase(r: str, k: dict) -> bool:
    return r.islower()


def _english_capital(r: str, k: dict) -> bool:
    return r.isupper()


def _capital_word_frequency(r: str, k: dict) -> bool:
    n = sum(1 for t in word_tokens(r) if t.isupper())
    return _compare(n, k["capital_relation"], k["capital_frequency"])


def _no_comma(r: str, k: dict) -> bool:
    return "," not in r


def _end_checker(r: str, k: dict) -> bool:
    return r.strip().strip('"').lower().endswith(str(k["end_phrase"]).strip().lower())


def _quotation(r: str, k: dict) -> bool:
    r = r.strip()
    return len(r) > 1 and r[0] == '"' and r[-1] == '"'


def _repeat_prompt(r: str, k: dict) -> bool:
    return r.strip().lower().startswith(str(k["prompt_to_repeat"]).strip().lower())


def _two_responses(r: str, k: dict) -> bool:
    parts = r.split("******")
    kept = []
    for i, p in enumerate(parts):
        if p.strip():
            kept.append(p)
        elif i not in (0, len(parts) - 1):
            return False  # an empty response between two separators
    return len(kept) == 2 and kept[0].strip() != kept[1].strip()


# ============================== registry ==============================


@dataclass(frozen=True)
class Verifier:
    """One instruction type: ``check(response, kwargs) -> bool``, the kwargs it needs (``relations``
    name those that must be ``less than`` / ``at least``) and its prompt phrasing."""

    id: str
    check: Callable[[str, dict], bool]
    required: tuple[str, ...] = ()
    relations: tuple[str, ...] = ()
    describe: Callable[[dict], str] = lambda k: ""
    ood: bool = False


def _kw_list(words) -> str:
    return ", ".join(f'"{w}"' for w in words)


_IFEVAL = [
    Verifier("keywords:existence", _keywords_existence, ("keywords",),
             describe=lambda k: f"Include keywords {_kw_list(k['keywords'])} in the response."),
    Verifier("keywords:frequency", _keywords_frequency, ("keyword", "frequency", "relation"), ("relation",),
             lambda k: f"In your response, the word {k['keyword']} should appear {k['relation']} {k['frequency']} times."),
    Verifier("keywords:forbidden_words", _forbidden_words, ("forbidden_words",),
             describe=lambda k: f"Do not include keywords {_kw_list(k['forbidden_words'])} in the response."),
    Verifier("keywords:letter_frequency", _letter_frequency, ("letter", "let_frequency", "let_relation"), ("let_relation",),
             lambda k: f"In your response, the letter {k['letter']} should appear {k['let_relation']} {k['let_frequency']} times."),
    Verifier("language:response_language", _response_language, ("language",),
             describe=lambda k: f"Your ENTIRE response should be in {k['language']} language, no other language is allowed."),
    Verifier("length_constraints:number_sentences", _number_sentences, ("num_sentences", "relation"), ("relation",),
             lambda k: f"Your response should contain {k['relation']} {k['num_sentences']} sentences."),
    Verifier("length_constraints:number_paragraphs", _number_paragraphs, ("num_paragraphs",),
             describe=lambda k: f"There should be {k['num_paragraphs']} paragraphs. Paragraphs are separated with the markdown divider: ***"),
    Verifier("length_constraints:number_words", _number_words, ("num_words", "relation"), ("relation",),
             lambda k: f"Answer with {k['relation']} {k['num_words']} words."),
    Verifier("length_constraints:nth_paragraph_first_word", _nth_paragraph_first_word,
             ("num_paragraphs", "nth_paragraph", "first_word"),
             describe=lambda k: f"There should be {k['num_paragraphs']} paragraphs. Paragraphs and only paragraphs are separated "
             f"with each other by two new lines as if it was '\\n\\n' in python. Paragraph {k['nth_paragraph']} must start "
             f"with word {k['first_word']}."),
    Verifier("detectable_content:postscript", _postscript, ("postscript_marker",),
             describe=lambda k: f"At the end of your response, please explicitly add a postscript starting with {k['postscript_marker']}"),
    Verifier("detectable_content:number_placeholders", _number_placeholders, ("num_placeholders",),
             describe=lambda k: f"The response must contain at least {k['num_placeholders']} placeholders represented by square brackets, such as [address]."),
    Verifier("detectable_format:number_bullet_lists", _number_bullet_lists, ("num_bullets",),
             describe=lambda k: f"Your answer must contain exactly {k['num_bullets']} bullet points. Use the markdown bullet points such as:\n* This is point 1. \n* This is point 2"),
    Verifier("detectable_format:constrained_response", _constrained_response,
             describe=lambda k: f"Answer with one of the following options: {CONSTRAINED_OPTIONS}"),
    Verifier("detectable_format:number_highlighted_sections", _number_highlighted_sections, ("num_highlights",),
             describe=lambda k: f"Highlight at least {k['num_highlights']} sections in your answer with markdown, i.e. *highlighted section*."),
    Verifier("detectable_format:multiple_sections", _multiple_sections, ("section_spliter", "num_sections"),
             describe=lambda k: f"Your response must have {k['num_sections']} sections. Mark the beginning of each section with "
             f"{k['section_spliter']} X, such as:\n{k['section_spliter']} 1\n[content of section 1]\n{k['section_spliter']} 2\n[content of section 2]"),
    Verifier("detectable_format:json_format", _json_format,
             describe=lambda k: "Entire output should be wrapped in JSON format. You can use markdown ticks such as ```."),
    Verifier("detectable_format:title", _title,
             describe=lambda k: "Your answer must contain a title, wrapped in double angular brackets, such as <<poem of joy>>."),
    Verifier("change_case:english_lowercase", _english_lowercase,
             describe=lambda k: "Your entire response should be in English, and in all lowercase letters. No capital letters are allowed."),
    Verifier("change_case:english_capital", _english_capital,
             describe=lambda k: "Your entire response should be in English, and in all capital letters."),
    Verifier("change_case:capital_word_frequency", _capital_word_frequency, ("capital_frequency", "capital_relation"),
             ("capital_relation",),
             lambda k: f"In your response, words with all capital letters should appear {k['capital_relation']} {k['capital_frequency']} times."),
    Verifier("punctuation:no_comma", _no_comma,
             describe=lambda k: "In your entire response, refrain from the use of any commas."),
    Verifier("startend:end_checker", _end_checker, ("end_phrase",),
             describe=lambda k: f"Finish your response with this exact phrase {k['end_phrase']} No other words should follow this phrase."),
    Verifier("startend:quotation", _quotation,
             describe=lambda k: "Wrap your entire response with double quotation marks."),
    Verifier("combination:repeat_prompt", _repeat_prompt, ("prompt_to_repeat",),
             describe=lambda k: "First repeat the request word for word without change, then give your answer (1. do not say any "
             "words or characters before repeating the request; 2. the request you need to repeat does not include this sentence)"),
    Verifier("combination:two_responses", _two_responses,
             describe=lambda k: "Give two different responses. Responses and only responses should be separated by 6 asterisk symbols: ******."),
]

VERIFIERS: dict[str, Verifier] = {v.id: v for v in _IFEVAL}
for _id, _spec in OOD_SPECS.items():
    VERIFIERS[_id] = Verifier(_id, _spec.check, _spec.required, describe=_spec.describe, ood=True)

IFEVAL_IDS = tuple(v.id for v in _IFEVAL)
OOD_IDS = tuple(OOD_SPECS)


def _clean_kwargs(kwargs: dict | None) -> dict:
    """IFEval builds each instruction with ``**kwargs`` after dropping ``None`` values."""
    return {k: v for k, v in (kwargs or {}).items() if v is not None}


def get_verifier(instruction_id: str) -> Verifier:
    if instruction_id not in VERIFIERS:
        raise KeyError(f"unknown instruction id {instruction_id!r}; known ids: {sorted(VERIFIERS)}")
    return VERIFIERS[instruction_id]


def validate_instruction(instruction_id: str, kwargs: dict | None) -> None:
    """Task-load-time check of one instruction: unknown id -> KeyError; missing/bad kwargs -> ValueError."""
    v = get_verifier(instruction_id)
    kw = _clean_kwargs(kwargs)
    missing = [name for name in v.required if name not in kw]
    if missing and instruction_id != "combination:repeat_prompt":  # repeat_prompt may take the prompt
        raise ValueError(f"{instruction_id}: missing kwargs {missing} (given: {sorted(kw)})")
    if instruction_id == "keywords:letter_frequency" and len(str(kw.get("letter", "")).strip()) != 1:
        raise ValueError(f"{instruction_id}: letter must be one character, got {kw.get('letter')!r}")
    for name in v.relations:
        if kw.get(name) not in RELATIONS:
            raise ValueError(f"{instruction_id}: {name} must be one of {RELATIONS}, got {kw.get(name)!r}")
    if instruction_id == "language:response_language":
        try:
            import langdetect  # noqa: F401
        except ImportError as exc:
            raise ImportError("language:response_language needs the 'langdetect' package (pip install langdetect)") from exc


def check_instruction(instruction_id: str, kwargs: dict | None, response: str, prompt: str | None = None) -> bool:
    """Strict IFEval check of one instruction on one response.

    Raises KeyError only for an unknown ``instruction_id`` (a data error). Never raises on the response:
    empty, whitespace-only, non-string or unreadable responses, or a verifier error, give False.
    """
    v = get_verifier(instruction_id)
    kw = _clean_kwargs(kwargs)
    if instruction_id == "combination:repeat_prompt" and "prompt_to_repeat" not in kw and prompt:
        kw["prompt_to_repeat"] = prompt
    if not isinstance(response, str) or not response.strip():
        return False
    try:
        return bool(v.check(response, kw))
    except Exception:  # noqa: BLE001 - model text must never crash scoring
        return False


def loose_variants(response: str) -> list[str]:
    """IFEval's loose-mode rewrites: as is, without the first / last / both lines, each also without ``*``."""
    if not isinstance(response, str):
        return []
    lines = response.split("\n")
    cut = ["\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(), "\n".join(lines[1:-1]).strip()]
    return [response, response.replace("*", "")] + cut + [c.replace("*", "") for c in cut]


def check_instruction_loose(instruction_id: str, kwargs: dict | None, response: str, prompt: str | None = None) -> bool:
    """Loose IFEval check: the instruction passes if any loose variant of the response passes strictly."""
    get_verifier(instruction_id)
    return any(check_instruction(instruction_id, kwargs, r, prompt) for r in loose_variants(response))


def follow_list(row: dict, response: str, loose: bool = False) -> list[bool]:
    """Per-instruction results of one IFEval row (``instruction_id_list``, ``kwargs``, ``prompt``)."""
    check = check_instruction_loose if loose else check_instruction
    ids = row["instruction_id_list"]
    kwargs = list(row.get("kwargs") or []) + [{}] * len(ids)  # a missing kwargs entry means none
    return [check(i, kw, response, row.get("prompt")) for i, kw in zip(row["instruction_id_list"], kwargs)]


def ifeval_scores(records: list[dict]) -> dict[str, float]:
    """IFEval's four accuracies, in percent, over ``records`` (IFEval rows with a ``response`` each).

    ``prompt_*``: share of prompts whose instructions all pass; ``inst_*``: share of instructions that
    pass; ``strict`` / ``loose`` as in IFEval. An empty list gives zeros.
    """
    totals = {"prompt_strict": 0, "inst_strict": 0, "prompt_loose": 0, "inst_loose": 0}
    n_prompts = n_inst = 0
    for rec in records:
        response = rec.get("response", "")
        for mode, loose in (("strict", False), ("loose", True)):
            res = follow_list(rec, response, loose)
            totals[f"prompt_{mode}"] += all(res)
            totals[f"inst_{mode}"] += sum(res)
        n_prompts += 1
        n_inst += len(rec["instruction_id_list"])
    return {
        k: (100.0 * v / (n_prompts if k.startswith("prompt") else n_inst) if (n_prompts and n_inst) else 0.0)
        for k, v in totals.items()
    }


# ============================== mini prompt generator ==============================

TOPICS = {
    "train": ["the ocean", "coffee", "gardening", "the moon", "trains", "bread", "rainy days", "the library",
              "bicycles", "music lessons", "mountains", "tea", "birds", "the city park", "winter", "the river",
              "apples", "old maps", "friendship", "summer camp", "candles", "the beach", "painting", "owls"],
    "test": ["the desert", "lighthouses", "honey bees", "the harbor", "a farm", "chess", "the forest",
             "rain boots", "a small bakery", "the night sky", "sailing", "a museum"],
    "ifbench": ["the weather", "a market", "kites", "the garden", "a train station", "puppets", "the stars",
                "a picnic", "the snow", "a bridge", "the wind", "a theater"],
}
BASES = {
    "train": ["Write a short note about {t}.", "Write a few sentences about {t}.", "Describe {t} briefly.",
              "Tell me about {t}."],
    "test": ["Write a short note about {t}.", "Give a brief description of {t}.", "Tell me about {t}."],
    "ifbench": ["Write a short note about {t}.", "Describe {t} briefly.", "Tell me about {t}."],
}
QUESTION_BASE = "Is {t} worth learning about?"
# Held-out kwargs pools: test prompts use words the train prompts never do.
KEYWORDS = {"train": ["lantern", "velvet", "maple", "comet", "orchid", "pebble", "ribbon", "copper", "meadow", "willow"],
            "test": ["silver", "thunder", "blossom", "marble", "feather", "canyon", "ember", "sparrow", "tulip", "anchor"]}
FORBIDDEN = {"train": ["very", "really", "thing", "nice", "stuff", "good"],
             "test": ["great", "just", "awesome", "amazing", "basically", "totally"]}
END_PHRASES = {"train": ["Is there anything else I can help with?", "Let me know if you have additional questions.",
                         "That is all for now."],
               "test": ["Any other questions?", "Hope this helps.", "Thanks for reading."]}
FIRST_WORDS = {"train": ["today", "often", "usually", "first"], "test": ["finally", "sometimes", "indeed", "also"]}


def _sample_ifeval_kwargs(iid: str, rng: random.Random, pool: str) -> dict:
    """Small kwargs (a tiny model's responses stay short) for one IFEval instruction id."""
    rel = rng.choice(RELATIONS)
    if iid == "keywords:existence":
        return {"keywords": sorted(rng.sample(KEYWORDS[pool], rng.randint(1, 2)))}
    if iid == "keywords:frequency":
        return {"keyword": rng.choice(KEYWORDS[pool]), "relation": rel,
                "frequency": rng.randint(2, 3) if rel == "at least" else rng.randint(1, 2)}
    if iid == "keywords:forbidden_words":
        return {"forbidden_words": sorted(rng.sample(FORBIDDEN[pool], rng.randint(1, 2)))}
    if iid == "keywords:letter_frequency":
        if rel == "at least":
            return {"letter": rng.choice("aeonst"), "let_frequency": rng.randint(3, 8), "let_relation": rel}
        return {"letter": rng.choice("qxzj"), "let_frequency": rng.randint(1, 3), "let_relation": rel}
    if iid == "length_constraints:number_words":
        return {"relation": rel, "num_words": rng.choice([30, 40, 50]) if rel == "less than" else rng.choice([5, 8, 10, 15])}
    if iid == "length_constraints:number_sentences":
        return {"relation": rel, "num_sentences": rng.randint(3, 5) if rel == "less than" else rng.randint(2, 4)}
    if iid == "length_constraints:number_paragraphs":
        return {"num_paragraphs": rng.randint(2, 3)}
    if iid == "length_constraints:nth_paragraph_first_word":
        n = rng.randint(2, 3)
        return {"num_paragraphs": n, "nth_paragraph": rng.randint(1, n), "first_word": rng.choice(FIRST_WORDS[pool])}
    if iid == "detectable_content:postscript":
        return {"postscript_marker": rng.choice(["P.S.", "P.P.S"])}
    if iid == "detectable_content:number_placeholders":
        return {"num_placeholders": rng.randint(1, 3)}
    if iid == "detectable_format:number_bullet_lists":
        return {"num_bullets": rng.randint(1, 3)}
    if iid == "detectable_format:number_highlighted_sections":
        return {"num_highlights": rng.randint(1, 3)}
    if iid == "detectable_format:multiple_sections":
        return {"section_spliter": rng.choice(["Section", "SECTION"]), "num_sections": rng.randint(2, 3)}
    if iid == "change_case:capital_word_frequency":
        return {"capital_relation": rel, "capital_frequency": rng.randint(2, 3) if rel == "at least" else rng.randint(2, 4)}
    if iid == "startend:end_checker":
        return {"end_phrase": rng.choice(END_PHRASES[pool])}
    return {}  # no kwargs (repeat_prompt's prompt_to_repeat is filled in by the generator)


def _sample_ood_kwargs(iid: str, rng: random.Random) -> dict:
    if iid == "count:word_count_range":
        lo = rng.randint(8, 20)
        return {"min_words": lo, "max_words": lo + rng.randint(6, 10)}
    if iid == "count:unique_word_count":
        return {"N": rng.randint(8, 20)}
    if iid == "ratio:stop_words":
        return {"percentage": rng.choice([30, 40, 50])}
    if iid == "count:conjunctions":
        return {"small_n": rng.randint(2, 3)}
    if iid in ("count:person_names", "count:numbers"):
        return {"N": rng.randint(1, 3)}
    return {}


# Pairs the generator never combines (IFEval's conflict table, narrowed to our families).
_LAYOUT = {"length_constraints:number_paragraphs", "length_constraints:nth_paragraph_first_word",
           "detectable_format:multiple_sections", "detectable_format:number_bullet_lists"}
_CASE = {"change_case:english_lowercase", "change_case:english_capital", "change_case:capital_word_frequency"}
_ONLY_WITH = {  # id -> the only ids it may be combined with
    "detectable_format:constrained_response": set(),
    "detectable_format:json_format": {"keywords:existence", "keywords:forbidden_words"},
    "combination:two_responses": {"keywords:forbidden_words", "keywords:existence", "detectable_format:title",
                                  "punctuation:no_comma"},
    "combination:repeat_prompt": {"keywords:existence", "detectable_format:title", "punctuation:no_comma"},
}
_PAIR_CONFLICTS = {frozenset(p) for p in [
    ("startend:quotation", "detectable_format:title"),
    ("length_constraints:number_sentences", "length_constraints:number_paragraphs"),
    ("length_constraints:number_sentences", "length_constraints:nth_paragraph_first_word"),
    # the section splitter is matched case-sensitively, so a case rule breaks it
    ("detectable_format:multiple_sections", "change_case:english_lowercase"),
    ("detectable_format:multiple_sections", "change_case:english_capital"),
]}
_OOD_CONFLICTS = {frozenset(p) for p in [("words:prime_lengths", "format:emoji")]}


def compatible(ids: list[str]) -> bool:
    """True if no two of ``ids`` conflict (the same id twice, two layouts, two case rules, ...)."""
    if len(set(ids)) != len(ids):
        return False
    if len(set(ids) & _LAYOUT) > 1 or len(set(ids) & _CASE) > 1:
        return False
    for i in ids:
        if i in _ONLY_WITH and any(j != i and j not in _ONLY_WITH[i] for j in ids):
            return False
    pairs = {frozenset((a, b)) for a in ids for b in ids if a != b}
    return not (pairs & (_PAIR_CONFLICTS | _OOD_CONFLICTS))


# Training / test families: the IFEval ids we generate (language detection is not generated).
GENERATED_IFEVAL_IDS = tuple(i for i in IFEVAL_IDS if i != "language:response_language")


def _draw_prompt(rng: random.Random, split: str) -> tuple[str, dict, dict]:
    """One candidate (user_prompt, answer, meta) of ``split`` (train / test / ifbench)."""
    pool = "train" if split == "train" else "test"
    topic = rng.choice(TOPICS[split])
    family = OOD_IDS if split == "ifbench" else GENERATED_IFEVAL_IDS
    k = rng.choice([1, 2]) if split == "ifbench" else rng.choice([1, 2, 2, 3, 3])
    while True:
        ids = rng.sample(family, k)
        if compatible(ids):
            break
    if "detectable_format:constrained_response" in ids:
        base = QUESTION_BASE.format(t=topic)
    else:
        base = rng.choice(BASES[split]).format(t=topic)
    kwargs = []
    for iid in ids:
        kw = _sample_ood_kwargs(iid, rng) if split == "ifbench" else _sample_ifeval_kwargs(iid, rng, pool)
        if iid == "combination:repeat_prompt":
            kw = {"prompt_to_repeat": base}
        kwargs.append(kw)
    parts = [base] + [VERIFIERS[i].describe(kw) for i, kw in zip(ids, kwargs)]
    prompt = " ".join(parts)
    answer = {"key": None, "prompt": prompt, "instruction_id_list": list(ids), "kwargs": kwargs}
    return prompt, answer, {"topic": topic, "base": base}


# ============================== scripted expert ==============================

_STYLES = {
    "plain": ["{T} is a topic that many people like.", "There is a lot to learn about {t}.",
              "Many people read about {t} in their free time.", "A short note can show why {t} matters.",
              "People often talk about {t} with friends.", "It is easy to start learning about {t}.",
              "Some books cover {t} in detail.", "Learning about {t} can be fun.",
              "Small steps help when you study {t}.", "The story of {t} is rich and long.",
              "Each season brings something new to {t}.", "Curious minds return to {t} again and again."],
    "terse": ["{T}: rich history.", "Bright colors everywhere.", "Curious minds wander.", "Simple pleasures matter.",
              "Endless stories remain.", "Gentle mornings help.", "Careful study rewards patience.", "Fresh ideas grow.",
              "Warm memories linger.", "Patient hands create."],
    # every word has a prime number of letters (2, 3, 5 or 7)
    "prime": ["We can study it.", "It is fun to learn.", "The sky has no limit.", "You can start today.",
              "We all share ideas.", "Our minds are awake.", "The sun is out.", "We sit by the sea.",
              "Try to smile often.", "Do not stop now."],
}
_QUESTIONS = ["Can you try it?", "Who can say?", "How do we start?", "Are we awake?", "Why is it so?",
              "Why not begin now?"]  # prime-length words too
_CAPS = ["CALM", "FOCUS", "LEARN", "GROW", "SHARE"]
_PLACEHOLDERS = ["[name]", "[place]", "[date]", "[time]"]
_NUMBERS = ["12", "25", "40", "73"]
_NAMES = ["Mia", "Ava", "Leo", "Zoe", "Mason"]  # prime-length names from the IF-Bench list
_FILLER = "sun sky sea day art fun map cup ink owl elm fig bay den dew gem hue ivy oak".split()
_CONJ_CLAUSES = (["we learn", "we sit", "we smile", "we try"], ["and", "but", "yet", "so"])
_EMOJI = "\U0001F31F"  # glowing star


def _body_sentences(style: str, topic: str, n: int, offset: int = 0) -> list[str]:
    tpl = _STYLES[style]
    out = []
    for i in range(n):
        s = tpl[(i + offset) % len(tpl)]
        out.append(s.format(t=topic, T=topic[:1].upper() + topic[1:]))
    return out


def _chunks(items: list[str], n: int) -> list[list[str]]:
    size = -(-len(items) // n)
    return [items[i * size : (i + 1) * size] for i in range(n)]


def _compose(spec: dict, topic: str, style: str, n: int, pad: int, offset: int = 0) -> str:
    """One candidate response for the instructions ``spec`` (id -> kwargs)."""
    if "detectable_format:constrained_response" in spec:
        return CONSTRAINED_OPTIONS[0]
    body = _body_sentences(style, topic, n, offset)
    if "keywords:existence" in spec:
        body.append(f"This note mentions {' and '.join(spec['keywords:existence']['keywords'])}.")
    kf = spec.get("keywords:frequency")
    if kf and kf["relation"] == "at least":
        body.append(f"Think of {' and '.join([kf['keyword']] * int(kf['frequency']))}.")
    cf = spec.get("change_case:capital_word_frequency")
    if cf and cf["capital_relation"] == "at least":
        body.append("Key words: " + " ".join(_CAPS[: int(cf["capital_frequency"])]) + ".")
    if "detectable_content:number_placeholders" in spec:
        body.append("Add details such as " + " and ".join(_PLACEHOLDERS[: int(spec["detectable_content:number_placeholders"]["num_placeholders"])]) + ".")
    if "count:conjunctions" in spec:
        clauses, conj = _CONJ_CLAUSES
        m = int(spec["count:conjunctions"]["small_n"])
        text = clauses[0] + "".join(f" {conj[i]} {clauses[i + 1]}" for i in range(m))
        body.append(text[0].upper() + text[1:] + ".")
    if "count:person_names" in spec:
        body.append("Ask " + " and ".join(_NAMES[: int(spec["count:person_names"]["N"])]) + ".")
    if "count:numbers" in spec:
        body.append("Try " + " and ".join(_NUMBERS[: int(spec["count:numbers"]["N"])]) + " times.")
    if pad:
        words = [_FILLER[i % len(_FILLER)] for i in range(pad)]
        body.append(" ".join(words).capitalize() + ".")
    if "ratio:sentence_type" in spec:
        decl = sum(s.endswith(".") for s in body)
        if decl % 2:
            body.append(_body_sentences(style, topic, 1, offset + n)[0])
            decl += 1
        body += _QUESTIONS[: decl // 2]
    if "format:emoji" in spec:
        body = [s[:-1] + " " + _EMOJI + s[-1] for s in body]
    nh = int(spec.get("detectable_format:number_highlighted_sections", {}).get("num_highlights", 0))
    # the last sentences are highlighted, so a line never starts with "*" unless it is a bullet
    body = [f"*{s}*" if i >= len(body) - nh else s for i, s in enumerate(body)]
    text = _layout(spec, body, topic)
    if "combination:two_responses" in spec:
        other = _compose({k: v for k, v in spec.items() if k != "combination:two_responses"
                          and k != "detectable_format:title"}, topic, style, n, pad, offset + 3)
        text = text + "\n******\n" + other
    if "detectable_format:json_format" in spec:
        text = json.dumps({"note": " ".join(body)})
    if "detectable_format:title" in spec:
        title = f"<<{topic[:1].upper() + topic[1:]} notes>>"
        nth = spec.get("length_constraints:nth_paragraph_first_word", {}).get("nth_paragraph")
        # the title goes first, unless paragraph 1 must start with a given word
        text = (text + "\n" + title) if nth is not None and int(nth) == 1 else (title + "\n" + text)
    if "combination:repeat_prompt" in spec:
        text = spec["combination:repeat_prompt"]["prompt_to_repeat"] + "\n" + text
    if "detectable_content:postscript" in spec:
        text += f"\n{spec['detectable_content:postscript']['postscript_marker'].rstrip('.')}. Have a lovely day."
    if "startend:end_checker" in spec:
        text += " " + spec["startend:end_checker"]["end_phrase"]
    if "startend:quotation" in spec:
        text = f'"{text}"'
    if "change_case:english_lowercase" in spec:
        text = text.lower()
    if "change_case:english_capital" in spec:
        text = text.upper()
    if "format:newline" in spec:
        text = "\n".join(text.split())
    return text


def _layout(spec: dict, body: list[str], topic: str) -> str:
    if "detectable_format:multiple_sections" in spec:
        kw = spec["detectable_format:multiple_sections"]
        parts = _chunks(body, int(kw["num_sections"]))
        return "\n".join(f"{kw['section_spliter']} {i + 1}\n" + " ".join(p) for i, p in enumerate(parts))
    if "length_constraints:number_paragraphs" in spec:
        parts = _chunks(body, int(spec["length_constraints:number_paragraphs"]["num_paragraphs"]))
        return "\n***\n".join(" ".join(p) for p in parts)
    if "length_constraints:nth_paragraph_first_word" in spec:
        kw = spec["length_constraints:nth_paragraph_first_word"]
        parts = [" ".join(p) for p in _chunks(body, int(kw["num_paragraphs"]))]
        nth = int(kw["nth_paragraph"]) - 1
        parts[nth] = f"{str(kw['first_word']).capitalize()} we think about {topic}. " + parts[nth]
        return "\n\n".join(parts)
    if "detectable_format:number_bullet_lists" in spec:
        nb = int(spec["detectable_format:number_bullet_lists"]["num_bullets"])
        intro = " ".join(body[nb:])
        # "- " bullets when sentences are *highlighted*: "* *x*" would hide the highlight from IFEval's regex
        mark = "-" if "detectable_format:number_highlighted_sections" in spec else "*"
        bullets = "\n".join(f"{mark} {s}" for s in body[:nb])
        return (intro + "\n" + bullets) if intro else bullets
    return " ".join(body)


_N_CHOICES = (3, 2, 4, 1, 5, 6, 8, 10, 12)
_PAD_CHOICES = (0, 3, 6, 10, 15, 20)


def solve(answer: dict, topic: str) -> tuple[str, float]:
    """The expert's best response to an IFEval row and its strict reward (a small search over lengths,
    padding and wording styles, each candidate checked by the real verifiers)."""
    ids, kwargs = answer["instruction_id_list"], answer.get("kwargs") or [{}] * len(answer["instruction_id_list"])
    spec = {i: _clean_kwargs(kw) for i, kw in zip(ids, kwargs)}
    layout_n = max([int(kw.get("num_bullets", 0)) for kw in spec.values()]
                   + [int(kw.get("num_sections", 0)) for kw in spec.values()]
                   + [int(kw.get("num_paragraphs", 0)) for kw in spec.values()]
                   + [int(kw.get("num_highlights", 0)) for kw in spec.values()] + [0])
    best, best_r = "", -1.0
    for style in ("plain", "terse", "prime"):
        for n in _N_CHOICES:
            if n < layout_n:
                continue
            for pad in _PAD_CHOICES:
                text = _compose(spec, topic, style, n, pad)
                res = [check_instruction(i, kw, text, answer.get("prompt")) for i, kw in zip(ids, kwargs)]
                r = sum(res) / max(1, len(res))
                if r > best_r:
                    best, best_r = text, r
                if r == 1.0:
                    return best, 1.0
    return best, best_r


def scripted_expert(task: Task, messages: list[dict]) -> str:
    """A response that follows every instruction of a generated task (and writes about its topic)."""
    topic = task.meta.get("topic") or "this topic"
    return solve(task.answer, topic)[0]


# ============================== environment ==============================


def score_response(response: str, task: Task) -> tuple[float, str | None]:
    """Fraction of the task's instructions followed (strict) and the failed ids (None when all pass)."""
    if not isinstance(response, str):
        response = ""
    if THINK_OPEN in response or THINK_CLOSE in response:
        response = strip_think(response)
    ans = task.answer
    res = follow_list(ans, response)
    failed = [i for i, ok in zip(ans["instruction_id_list"], res) if not ok]
    reward = sum(res) / len(res) if res else 0.0
    return reward, ("failed instructions: " + ", ".join(failed)) if failed else None


def load_ifeval_jsonl(path: str | Path) -> list[dict]:
    """Rows of an IFEval-format jsonl (``key``, ``prompt``, ``instruction_id_list``, ``kwargs``), each
    instruction validated (unknown id -> KeyError, bad kwargs -> ValueError)."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            ids, kwargs = row["instruction_id_list"], row.get("kwargs") or [{}] * len(row["instruction_id_list"])
            if len(ids) != len(kwargs):
                raise ValueError(f"{path}:{line_no}: {len(ids)} instruction ids but {len(kwargs)} kwargs")
            for iid, kw in zip(ids, kwargs):
                try:
                    validate_instruction(iid, kw)
                except KeyError as exc:
                    raise KeyError(f"{path}:{line_no}: {exc.args[0]}") from None
            rows.append({"key": row.get("key", line_no), "prompt": row["prompt"], "instruction_id_list": list(ids),
                         "kwargs": [_clean_kwargs(kw) for kw in kwargs]})
    return rows


class InstructEnv(Environment):
    """Constrained prompts; single-turn episodes rewarded by the fraction of instructions followed."""

    name = "instruct"
    FILES = {"train": "train.jsonl", "test": "ifeval.jsonl", "ifbench": "ifbench.jsonl"}

    def __init__(self, worlds=None, seed: int = 0):
        self.worlds = worlds
        self.seed = seed
        self.data_dir = getattr(worlds, "data_dir", "") or ""
        self.splits: dict[str, str | None] = {"train": None, "test": "ifeval", "ifbench": "ifbench"}

    def _benchmark(self, split: str) -> str:
        return self.splits[split] or TRAIN_BENCHMARK

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        if split not in self.splits:
            raise ValueError(f"unknown instruct split {split!r}; splits are {list(self.splits)}")
        path = Path(self.data_dir) / "instruct" / self.FILES[split] if self.data_dir else None
        if path is not None and path.exists():
            return self._file_tasks(split, path, n, seed)
        if path is not None and split != "train":
            raise FileNotFoundError(f"{path} not found (worlds.data_dir is set, so real data is expected)")
        return self._generated_tasks(split, n, seed)

    def _file_tasks(self, split: str, path: Path, n: int, seed: int) -> list[Task]:
        rows = load_ifeval_jsonl(path)
        if split == "train":  # keep benchmark prompts out of training
            held_out = set()
            for name in ("test", "ifbench"):
                other = path.parent / self.FILES[name]
                if other.exists():
                    held_out |= {r["prompt"] for r in load_ifeval_jsonl(other)}
            rows = [r for r in rows if r["prompt"] not in held_out]
        if n < len(rows):
            picked = sorted(random.Random(f"instruct-file:{self.seed}:{split}:{seed}").sample(range(len(rows)), n))
            rows = [rows[i] for i in picked]
        bench = self._benchmark(split)
        return [Task(id=f"{bench}-{r['key']}", domain=self.name, benchmark=bench, system_prompt="",
                     user_prompt=r["prompt"], answer=r,
                     meta={"score_kind": "all", "split": split, "source": str(path)}) for r in rows]

    def _generated_tasks(self, split: str, n: int, seed: int) -> list[Task]:
        rng = random.Random(f"instruct:{self.seed}:{split}:{seed}")
        bench, out, seen = self._benchmark(split), [], set()
        for _ in range(n * 50):
            if len(out) == n:
                break
            prompt, answer, meta = _draw_prompt(rng, split)
            if prompt in seen or solve(answer, meta["topic"])[1] < 1.0:
                continue  # duplicates and (rare) combinations the expert cannot satisfy are redrawn
            seen.add(prompt)
            answer["key"] = f"{split}-{seed}-{len(out)}"
            out.append(Task(id=f"{bench}-{self.seed}-{answer['key']}", domain=self.name, benchmark=bench,
                            system_prompt="", user_prompt=prompt, answer=answer,
                            meta={"score_kind": "all", "split": split, "source": "generated", **meta}))
        if len(out) < n:
            raise RuntimeError(f"could only generate {len(out)} of {n} distinct {split} prompts")
        return out

    def start(self, task: Task, max_turns: int = 16) -> Episode:
        return SingleTurnEpisode(task, score_response)
