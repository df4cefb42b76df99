"""The IFEval instruction checks and their registry, apart from the IF environment (``instruct.py``).

``VERIFIERS`` maps every instruction id to its ``Verifier``: the IFEval ids (``punctuation:no_comma``, ...)
and the unseen IF-Bench ids of :mod:`acl_lib.envs.instruct_ood`. ``check_instruction`` (strict) and
``check_instruction_loose`` check one instruction on one response, ``follow_list`` one IFEval row,
``ifeval_scores`` gives IFEval's four accuracies; ``validate_instruction`` checks a row at load time.

Verifiers follow google-research/instruction_following_eval (ids, kwargs names, relations, regexes),
re-implemented here. Differences, all because nothing can be downloaded at run time:

- ``length_constraints:number_sentences`` uses :func:`split_sentences`, a regex approximation of nltk's
  punkt model (abbreviations, initials, numbers and ellipses handled by simple rules);
- ``change_case:capital_word_frequency`` tokenises as nltk's ``word_tokenize`` does (its Treebank rules,
  re-implemented in :func:`treebank_tokens`), on the sentences of :func:`split_sentences` in place of punkt's;
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
import re
from collections.abc import Callable
from dataclasses import dataclass

from acl_lib.envs.instruct_ood import OOD_SPECS

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


# nltk's word_tokenize, which IFEval's capital_word_frequency counts with: punkt sentences (here
# split_sentences), then NLTKWordTokenizer on each, the Treebank rules as nltk 3.9-3.10 writes them, in its
# order. What it splits decides the count: "CANNOT" is "CAN" "NOT", "GONNA" "GON" "NA", "DON'T" "DO" "N'T"
# (two capital words each), while "HELLO.WORLD", "A/B" and "O'NEIL" stay one token.
_TB_STARTING_QUOTES = (
    (re.compile(r"([«“‘„]|[`]+)"), r" \1 "),
    (re.compile(r"^\""), r"``"),
    (re.compile(r"(``)"), r" \1 "),
    (re.compile(r"([ \(\[{<])(\"|\'{2})"), r"\1 `` "),
    (re.compile(r"(?i)(?<!\w)(\')(?!(?:re|ve|ll|m|t|s|d|n)\b)(?=\w)"), r"\1 "),
)
_TB_PUNCTUATION = (
    (re.compile(r'([^\.])(\.)([\]\)}>"\'' "»”’ " r"]*+)\s*$"), r"\1 \2 \3 "),  # the final period
    (re.compile(r"([:,])([^\d])"), r" \1 \2"),
    (re.compile(r"([:,])$"), r" \1 "),
    (re.compile(r"\.{2,}"), r" \g<0> "),
    (re.compile(r"[;@#$%&]"), r" \g<0> "),
    (re.compile(r"[\u2012-\u2015]"), r" \g<0> "),  # figure, en and em dashes, horizontal bar
    (re.compile(r'([^\.])(\.)([\]\)}>"\']*)\s*$'), r"\1 \2\3 "),
    (re.compile(r"[?!]"), r" \g<0> "),
    (re.compile(r"([^'])' "), r"\1 ' "),
    (re.compile(r"[*]"), r" \g<0> "),
    (re.compile(r"[\]\[\(\)\{\}\<\>]"), r" \g<0> "),  # brackets
    (re.compile(r"--"), r" -- "),
)
_TB_ENDING_QUOTES = (
    (re.compile(r"([»”’])"), r" \1 "),
    (re.compile(r"''"), " '' "),
    (re.compile(r'"'), " '' "),
    (re.compile(r"\s+"), " "),
    (re.compile(r"([^' ])('[sS]|'[mM]|'[dD]|') "), r"\1 \2 "),
    (re.compile(r"([^' ])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T) "), r"\1 \2 "),
)
_TB_CONTRACTIONS = tuple(re.compile(p) for p in (
    r"(?i)\b(can)(?#X)(not)\b", r"(?i)\b(d)(?#X)('ye)\b", r"(?i)\b(gim)(?#X)(me)\b", r"(?i)\b(gon)(?#X)(na)\b",
    r"(?i)\b(got)(?#X)(ta)\b", r"(?i)\b(lem)(?#X)(me)\b", r"(?i)\b(more)(?#X)('n)\b", r"(?i)\b(wan)(?#X)(na)(?=\s)",
    r"(?i) ('t)(?#X)(is)\b", r"(?i) ('t)(?#X)(was)\b"))


def treebank_tokens(sentence: str) -> list[str]:
    """``nltk.tokenize.NLTKWordTokenizer().tokenize(sentence)``, re-implemented (one sentence)."""
    text = sentence
    for rx, sub in _TB_STARTING_QUOTES + _TB_PUNCTUATION:
        text = rx.sub(sub, text)
    text = " " + text + " "
    for rx, sub in _TB_ENDING_QUOTES:
        text = rx.sub(sub, text)
    for rx in _TB_CONTRACTIONS:
        text = rx.sub(r" \1 \2 ", text)
    return text.split()


def word_tokens(text: str) -> list[str]:
    """``nltk.word_tokenize(text)``: Treebank tokens of each sentence (``split_sentences`` stands in for punkt)."""
    return [tok for sentence in split_sentences(text) for tok in treebank_tokens(sentence)]


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


def count_placeholders(text: str) -> int:
    """Number of IFEval placeholder matches, ``len(re.findall(r"\\[.*?\\]", text))``, in linear time (the
    regex is quadratic on a long line of ``[`` with no ``]``: 38 s for 100,000 of them)."""
    n, i, count = len(text), 0, 0
    while True:
        i = text.find("[", i)
        if i < 0:
            return count
        line_end = text.find("\n", i)
        line_end = n if line_end < 0 else line_end
        j = text.find("]", i + 1, line_end)
        if j < 0:  # no "]" before the line ends: every "[" up to there fails the same way
            i = line_end + 1
            continue
        count += 1
        i = j + 1


def _number_placeholders(r: str, k: dict) -> bool:
    return count_placeholders(r) >= int(k["num_placeholders"])


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


def find_titles(text: str) -> list[str]:
    """``re.findall(r"<<[^\\n]+>>", text)`` in linear time (the regex is quadratic on a long line of ``<``).

    On one line the greedy match runs from the first ``<<`` to the last ``>>`` (at least one character
    between); after it the line holds no further ``>>``, so there is at most one match per line."""
    out = []
    for line in text.split("\n"):
        i = line.find("<<")
        if i >= 0:
            j = line.rfind(">>")
            if j >= i + 3:
                out.append(line[i : j + 2])
    return out


def _title(r: str, k: dict) -> bool:
    return any(t.lstrip("<").rstrip(">").strip() for t in find_titles(r))


def _detected_english(r: str) -> bool:
    """IFEval's language test for ``change_case:english_*``: ``langdetect`` must call the text English, and text
    it cannot classify counts as following. As in the reference, this misfires on very short answers: "YES" is
    detected as Welsh ("cy") and so fails ``english_capital``. ``DetectorFactory.seed = 0`` makes it
    deterministic (the reference leaves langdetect's random seed unset, so its verdicts on borderline text can
    vary between runs)."""
    import langdetect  # a runtime dependency; imported here because loading its profiles costs ~0.5 s

    langdetect.DetectorFactory.seed = 0
    try:
        return langdetect.detect(r) == "en"
    except langdetect.LangDetectException:
        return True


def _english_lowercase(r: str, k: dict) -> bool:
    return r.islower() and _detected_english(r)


def _english_capital(r: str, k: dict) -> bool:
    return r.isupper() and _detected_english(r)


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
             lambda k: f"In your response, the word {k['keyword']} should appear {k['relation']} {k['frequency']} "
             "times."),
    Verifier("keywords:forbidden_words", _forbidden_words, ("forbidden_words",),
             describe=lambda k: f"Do not include keywords {_kw_list(k['forbidden_words'])} in the response."),
    Verifier("keywords:letter_frequency", _letter_frequency, ("letter", "let_frequency", "let_relation"),
             ("let_relation",),
             lambda k: f"In your response, the letter {k['letter']} should appear {k['let_relation']} "
             f"{k['let_frequency']} times."),
    Verifier("language:response_language", _response_language, ("language",),
             describe=lambda k: f"Your ENTIRE response should be in {k['language']} language, no other language is "
             "allowed."),
    Verifier("length_constraints:number_sentences", _number_sentences, ("num_sentences", "relation"), ("relation",),
             lambda k: f"Your response should contain {k['relation']} {k['num_sentences']} sentences."),
    Verifier("length_constraints:number_paragraphs", _number_paragraphs, ("num_paragraphs",),
             describe=lambda k: f"There should be {k['num_paragraphs']} paragraphs. Paragraphs are separated with the "
             "markdown divider: ***"),
    Verifier("length_constraints:number_words", _number_words, ("num_words", "relation"), ("relation",),
             lambda k: f"Answer with {k['relation']} {k['num_words']} words."),
    Verifier("length_constraints:nth_paragraph_first_word", _nth_paragraph_first_word,
             ("num_paragraphs", "nth_paragraph", "first_word"),
             describe=lambda k: f"There should be {k['num_paragraphs']} paragraphs. Paragraphs and only paragraphs are "
             f"separated with each other by two new lines as if it was '\\n\\n' in python. Paragraph "
             f"{k['nth_paragraph']} must start with word {k['first_word']}."),
    Verifier("detectable_content:postscript", _postscript, ("postscript_marker",),
             describe=lambda k: "At the end of your response, please explicitly add a postscript starting with "
             f"{k['postscript_marker']}"),
    Verifier("detectable_content:number_placeholders", _number_placeholders, ("num_placeholders",),
             describe=lambda k: f"The response must contain at least {k['num_placeholders']} placeholders represented "
             "by square brackets, such as [address]."),
    Verifier("detectable_format:number_bullet_lists", _number_bullet_lists, ("num_bullets",),
             describe=lambda k: f"Your answer must contain exactly {k['num_bullets']} bullet points. Use the markdown "
             "bullet points such as:\n* This is point 1. \n* This is point 2"),
    Verifier("detectable_format:constrained_response", _constrained_response,
             describe=lambda k: f"Answer with one of the following options: {CONSTRAINED_OPTIONS}"),
    Verifier("detectable_format:number_highlighted_sections", _number_highlighted_sections, ("num_highlights",),
             describe=lambda k: f"Highlight at least {k['num_highlights']} sections in your answer with markdown, i.e. "
             "*highlighted section*."),
    Verifier("detectable_format:multiple_sections", _multiple_sections, ("section_spliter", "num_sections"),
             describe=lambda k: f"Your response must have {k['num_sections']} sections. Mark the beginning of each "
             f"section with {k['section_spliter']} X, such as:\n{k['section_spliter']} 1\n[content of section 1]\n"
             f"{k['section_spliter']} 2\n[content of section 2]"),
    Verifier("detectable_format:json_format", _json_format,
             describe=lambda k: "Entire output should be wrapped in JSON format. You can use markdown ticks such as "
             "```."),
    Verifier("detectable_format:title", _title,
             describe=lambda k: "Your answer must contain a title, wrapped in double angular brackets, such as "
             "<<poem of joy>>."),
    Verifier("change_case:english_lowercase", _english_lowercase,
             describe=lambda k: "Your entire response should be in English, and in all lowercase letters. No capital "
             "letters are allowed."),
    Verifier("change_case:english_capital", _english_capital,
             describe=lambda k: "Your entire response should be in English, and in all capital letters."),
    Verifier("change_case:capital_word_frequency", _capital_word_frequency, ("capital_frequency", "capital_relation"),
             ("capital_relation",),
             lambda k: "In your response, words with all capital letters should appear "
             f"{k['capital_relation']} {k['capital_frequency']} times."),
    Verifier("punctuation:no_comma", _no_comma,
             describe=lambda k: "In your entire response, refrain from the use of any commas."),
    Verifier("startend:end_checker", _end_checker, ("end_phrase",),
             describe=lambda k: f"Finish your response with this exact phrase {k['end_phrase']} No other words should "
             "follow this phrase."),
    Verifier("startend:quotation", _quotation,
             describe=lambda k: "Wrap your entire response with double quotation marks."),
    Verifier("combination:repeat_prompt", _repeat_prompt, ("prompt_to_repeat",),
             describe=lambda k: "First repeat the request word for word without change, then give your answer (1. do "
             "not say any words or characters before repeating the request; 2. the request you need to repeat does not "
             "include this sentence)"),
    Verifier("combination:two_responses", _two_responses,
             describe=lambda k: "Give two different responses. Responses and only responses should be separated by 6 "
             "asterisk symbols: ******."),
]

VERIFIERS: dict[str, Verifier] = {v.id: v for v in _IFEVAL}
for _id, _spec in OOD_SPECS.items():
    VERIFIERS[_id] = Verifier(_id, _spec.check, _spec.required, describe=_spec.describe, ood=True)

IFEVAL_IDS = tuple(v.id for v in _IFEVAL)
OOD_IDS = tuple(OOD_SPECS)


def clean_kwargs(kwargs: dict | None) -> dict:
    """IFEval builds each instruction with ``**kwargs`` after dropping ``None`` values."""
    return {k: v for k, v in (kwargs or {}).items() if v is not None}


def get_verifier(instruction_id: str) -> Verifier:
    if instruction_id not in VERIFIERS:
        raise KeyError(f"unknown instruction id {instruction_id!r}; known ids: {sorted(VERIFIERS)}")
    return VERIFIERS[instruction_id]


def validate_instruction(instruction_id: str, kwargs: dict | None) -> None:
    """Task-load-time check of one instruction: unknown id -> KeyError; missing/bad kwargs -> ValueError."""
    v = get_verifier(instruction_id)
    kw = clean_kwargs(kwargs)
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
            raise ImportError("language:response_language needs the 'langdetect' package "
                              "(pip install langdetect)") from exc


def check_instruction(instruction_id: str, kwargs: dict | None, response: str, prompt: str | None = None) -> bool:
    """Strict IFEval check of one instruction on one response.

    Raises KeyError only for an unknown ``instruction_id`` (a data error). Never raises on the response:
    empty, whitespace-only, non-string or unreadable responses, or a verifier error, give False.
    """
    v = get_verifier(instruction_id)
    kw = clean_kwargs(kwargs)
    if instruction_id == "combination:repeat_prompt" and "prompt_to_repeat" not in kw and prompt:
        kw["prompt_to_repeat"] = prompt
    if not isinstance(response, str) or not response.strip():
        return False
    try:
        return bool(v.check(response, kw))
    except Exception:  # model text must never crash scoring
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
