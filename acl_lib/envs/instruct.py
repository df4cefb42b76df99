"""Instruction following (IF): the environment, its generated prompts and the scripted expert.

Splits (``InstructEnv.splits``): ``train`` (no benchmark; tasks carry ``benchmark="ifeval_train"``),
``test`` -> ``ifeval`` (held-out topics and keyword pools, same constraint families), ``ifbench`` ->
``ifbench`` (only the unseen constraint types of :mod:`acl_lib.envs.instruct_ood`).

A task's ``answer`` is an IFEval row: ``{"key", "prompt", "instruction_id_list", "kwargs"}``. The
episode is single-turn; its reward is the *fraction* of the prompt's instructions the response follows
(strict), and ``failure`` lists the failed ids. The benchmark score is IFEval's prompt-level strict
accuracy: ``Task.meta["score_kind"] == "all"`` tells the harness to report the percentage of episodes
whose reward is exactly 1.0 (:func:`acl_lib.envs.ifeval_checks.ifeval_scores` gives all four IFEval
numbers from raw responses).

The instruction checks (IFEval's rules, ``check_instruction``, strict and loose) live in
:mod:`acl_lib.envs.ifeval_checks`; ``check_instruction`` is importable from here too.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from acl_lib.chat import THINK_CLOSE, THINK_OPEN, strip_think
from acl_lib.envs.base import Environment, Episode, SingleTurnEpisode, Task
from acl_lib.envs.ifeval_checks import (
    CONSTRAINED_OPTIONS,
    IFEVAL_IDS,
    OOD_IDS,
    RELATIONS,
    VERIFIERS,
    check_instruction,
    clean_kwargs,
    follow_list,
    validate_instruction,
)

TRAIN_BENCHMARK = "ifeval_train"

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
KEYWORDS = {"train": ["lantern", "velvet", "maple", "comet", "orchid", "pebble", "ribbon", "copper", "meadow",
                      "willow"],
            "test": ["silver", "thunder", "blossom", "marble", "feather", "canyon", "ember", "sparrow", "tulip",
                     "anchor"]}
FORBIDDEN = {"train": ["very", "really", "thing", "nice", "stuff", "good"],
             "test": ["great", "just", "awesome", "amazing", "basically", "totally"]}
END_PHRASES = {"train": ["Is there anything else I can help with?", "Let me know if you have additional questions.",
                         "That is all for now."],
               "test": ["Any other questions?", "Hope this helps.", "Thanks for reading."]}
FIRST_WORDS = {"train": ["today", "often", "usually", "first"], "test": ["finally", "sometimes", "indeed", "also"]}

# The mini base's mid-training vocabulary (``pretrain.midtrain_if_vocab: wide``, acl_lib.train.midtrain): training
# prompts of the same families whose topics, keywords, first words and end phrases come from these wider lists,
# so that the base learns to copy the prompt's words rather than recall the ten keywords of the ``train`` pool
# (a base that has seen only those writes them, or nothing, for a held-out keyword). None of these words is in a
# ``test`` or ``ifbench`` pool or topic (tests/test_instruct.py checks), and the evaluated world's own train prompts
# keep the ``train`` pools: the vocabulary is what the base was pretrained on, not a change to a world.
WIDE_NOUNS = """acorn almond apron arrow attic badge bagel balcony bamboo banjo barrel basket beacon beetle bench
blanket bonnet bottle bracelet bucket buckle button cabin cactus camel candy canoe carpet castle cellar cherry
chimney cloak clock clover cobweb compass cottage crayon cricket crown cushion daisy dolphin donkey dragon drum
easel eagle engine fabric falcon fence ferry fiddle flag flute fountain fox garnet gate glove goose granite grape
guitar hammer harp hatch helmet hammock hedge hive hook igloo island jacket jasmine jelly jigsaw kayak kettle kiwi
ladder ladle lagoon lamp lemon lizard locket magnet mango mantle meadowlark mitten monkey mosaic muffin needle nest
nutmeg oboe olive onion otter paddle pantry parcel parrot peach pepper piano pillow pine pocket pony puzzle quill
quilt rabbit radish raft raven reef robin rocket saddle salmon satchel scarf seashell shovel sled spindle spoon
squirrel stable stamp statue stove sunflower swan teapot tent thimble ticket tiger timber toast trumpet tunnel
turtle umbrella valley violin wagon walnut whistle window wizard yarn zebra""".split()
WIDE_ADVERBS = ["now", "here", "then", "soon", "later", "surely", "truly", "clearly", "perhaps", "gladly", "again",
                "mostly", "rarely", "slowly", "quietly", "happily", "simply", "lately", "briefly", "certainly"]
WIDE_END_PHRASES = ["That is my note.", "Glad you came by.", "See you next time.", "Have a lovely day.",
                    "Take care.", "More to come soon.", "That is the whole story.", "Happy days ahead.",
                    "Write back if you like.", "Until next time.", "That sums it up.", "Enjoy the rest of your day."]
# A first word or an end phrase from a short list is learned as a list (a base mid-trained on the 20 adverbs and 12
# phrases above still never wrote a held-out one): the wide pools add every noun as a first word and 300 phrases
# of three random wide words, which can only be written by copying them from the prompt.
_rng = random.Random("instruct-wide-end-phrases")
WIDE_END_PHRASES += [" ".join(_rng.sample(WIDE_NOUNS + WIDE_ADVERBS, 3)).capitalize() + _rng.choice(".!")
                     for _ in range(300)]
TOPICS["wide"] = [f"the {w}" for w in WIDE_NOUNS]
KEYWORDS["wide"] = WIDE_NOUNS
FORBIDDEN["wide"] = FORBIDDEN["train"]
END_PHRASES["wide"] = WIDE_END_PHRASES
FIRST_WORDS["wide"] = WIDE_ADVERBS + WIDE_NOUNS


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
        return {"relation": rel,
                "num_words": rng.choice([30, 40, 50]) if rel == "less than" else rng.choice([5, 8, 10, 15])}
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
        return {"capital_relation": rel,
                "capital_frequency": rng.randint(2, 3) if rel == "at least" else rng.randint(2, 4)}
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


def _draw_prompt(rng: random.Random, split: str, wide: bool = False) -> tuple[str, dict, dict]:
    """One candidate (user_prompt, answer, meta) of ``split`` (train / test / ifbench); ``wide``: a train prompt
    on the mid-training vocabulary (``WIDE_NOUNS`` ...)."""
    pool = ("wide" if wide else "train") if split == "train" else "test"
    topic = rng.choice(TOPICS["wide" if pool == "wide" else split])
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
              "Endless stories remain.", "Gentle mornings help.", "Careful study rewards patience.",
              "Fresh ideas grow.", "Warm memories linger.", "Patient hands create."],
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
        # quoted as the prompt quotes them ('Include keywords "a", "b"'), so the words tokenize as in the prompt
        quoted = [f'"{w}"' for w in spec["keywords:existence"]["keywords"]]
        body.append(f"This note mentions {' and '.join(quoted)}.")
    kf = spec.get("keywords:frequency")
    if kf and kf["relation"] == "at least":
        body.append(f"Think of {' and '.join([kf['keyword']] * int(kf['frequency']))}.")
    cf = spec.get("change_case:capital_word_frequency")
    if cf and cf["capital_relation"] == "at least":
        body.append("Key words: " + " ".join(_CAPS[: int(cf["capital_frequency"])]) + ".")
    if "detectable_content:number_placeholders" in spec:
        n_placeholders = int(spec["detectable_content:number_placeholders"]["num_placeholders"])
        body.append("Add details such as " + " and ".join(_PLACEHOLDERS[:n_placeholders]) + ".")
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
    spec = {i: clean_kwargs(kw) for i, kw in zip(ids, kwargs)}
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
                         "kwargs": [clean_kwargs(kw) for kw in kwargs]})
    return rows


class InstructEnv(Environment):
    """Constrained prompts; single-turn episodes rewarded by the fraction of instructions followed."""

    name = "instruct"
    FILES = {"train": "train.jsonl", "test": "ifeval.jsonl", "ifbench": "ifbench.jsonl"}

    def __init__(self, worlds=None, seed: int = 0, vocab: str = "world"):
        if vocab not in ("world", "wide"):
            raise ValueError(f"unknown instruct vocabulary {vocab!r}; use 'world' or 'wide'")
        self.worlds = worlds
        self.seed = seed
        self.vocab = vocab  # "wide": generated train prompts on the mid-training vocabulary (WIDE_NOUNS ...)
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
        if path is not None:  # training included: generated mini prompts are no stand-in for the real set
            raise FileNotFoundError(f"{path} not found (worlds.data_dir is set, so real data is expected: "
                                    f"IFEval-format jsonl with key, prompt, instruction_id_list, kwargs)")
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
        wide = self.vocab == "wide" and split == "train"
        rng = random.Random(f"instruct:{self.seed}:{split}:{seed}" + (":wide" if wide else ""))
        bench, out, seen = self._benchmark(split), [], set()
        for _ in range(n * 50):
            if len(out) == n:
                break
            prompt, answer, meta = _draw_prompt(rng, split, wide)
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
