"""Search domain: question answering with a ``search(query)`` tool over a BM25-indexed corpus.

This module holds the generated world, the tasks, the episode, the environment and the scripted expert;
the retrievers behind the tool (local ``bm25s`` index, HTTP service) are in ``retrievers.py``.

The agent may call ``search`` as often as it needs; each call returns the top-k passages formatted the
way Search-R1 / FlashRAG show them to the model (``Doc 1(Title: "...") text``, one per line). A turn
without a tool call is the final answer, read from its last ``<answer>...</answer>``. Reward: exact
match after SQuAD v1.1 normalisation against any gold answer.

Two sources of data, one code path:

- **Mini world** (``worlds.data_dir`` empty): a generated knowledge corpus of invented countries,
  cities, people, companies and rivers, with attributes (founding year, capital, river length, ...) and
  relations (birthplace, CEO, headquarters, ...). Each entity has a short wiki-style document that also
  carries distractor facts (a second year, a second city), and event documents mention several
  entities, so a question is only answerable by reading the right passage. Deterministic in the world
  seed; its size follows ``worlds.n_train / n_test / n_ood`` (a few hundred documents for ``mini``).
  Questions:

  * ``train`` / ``test`` (benchmark ``nq``): single-hop questions on the in-domain relations
    (birth year, birthplace, founding year, headquarters, capital, country of a city, river length).
    Train and test never share an (entity, relation) pair.
  * ``single_hop`` (OOD): single-hop questions on relations never asked in training (occupation,
    industry, listing year, currency, official language, river mouth).
  * ``multi_hop`` (OOD): two chained lookups ("In which year was the company whose CEO is X
    founded?"). The final (entity, relation) pair of a multi-hop question is never a train question.

- **Real data** (``worlds.data_dir`` set, the ``paper`` profile), under ``<data_dir>/search/``:
  FlashRAG-style question files ``<dataset>/<split>.jsonl`` (``id``, ``question``, ``golden_answers``,
  optional ``metadata``) and a wiki-style corpus ``wiki-18.jsonl`` or ``corpus.jsonl`` (``id``,
  ``contents`` = ``"Title"\\ntext``) with a bm25s index saved next to it (built on first use). When
  ``worlds.retriever_url`` is set, searches go to a Search-R1-style ``POST /retrieve`` service instead.
"""

from __future__ import annotations

import functools
import json
import math
import random
import re
import string
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from acl_lib.chat import ToolCall, format_tool_call, parse_assistant
from acl_lib.config import WorldsConfig
from acl_lib.envs.base import Environment, Task, ToolEpisode, ToolError, function_schema
from acl_lib.envs.retrievers import BM25Retriever, HTTPRetriever

# --------------------------------------------------------------------------------------------------
# Answer checking (SQuAD v1.1 semantics)
# --------------------------------------------------------------------------------------------------

_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """SQuAD v1.1 normalisation: lowercase, drop ASCII punctuation, drop the articles a/an/the
    (replaced by a space), collapse whitespace."""
    s = s if isinstance(s, str) else str(s)
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def exact_match(prediction: str, golden_answers: list[str] | str) -> bool:
    """True if ``prediction`` equals any gold answer after ``normalize_answer``."""
    if prediction is None:
        return False
    if isinstance(golden_answers, str):
        golden_answers = [golden_answers]
    pred = normalize_answer(prediction)
    return any(pred == normalize_answer(g) for g in golden_answers or [] if g is not None)


def extract_answer(text: str) -> str | None:
    """The text inside the last ``<answer>...</answer>`` of ``text`` (stripped), or None if there is none.

    The last match of ``re.findall(r"<answer>(.*?)</answer>", text, re.S)``, found with ``str.find`` in linear
    time (the regex is quadratic on many unclosed ``<answer>`` tags)."""
    if not isinstance(text, str):
        return None
    found, pos = None, 0
    while True:
        start = text.find("<answer>", pos)
        if start < 0:
            break
        end = text.find("</answer>", start + len("<answer>"))
        if end < 0:  # no later "<answer>" can be closed either
            break
        found = text[start + len("<answer>") : end]
        pos = end + len("</answer>")
    return found.strip() if found is not None else None


# --------------------------------------------------------------------------------------------------
# Passages: the FlashRAG corpus schema and the Search-R1 observation format
# --------------------------------------------------------------------------------------------------

_DOC_LINE = re.compile(r"^Doc (\d+)\(Title: (.*?)\) (.*)$", re.M)


def make_contents(title: str, text: str) -> str:
    """A corpus ``contents`` field: ``"Title"`` on the first line, the passage text after it."""
    return f'"{title}"\n{text}'


def split_contents(contents: str) -> tuple[str, str]:
    """(title line, text) of a ``contents`` field, as Search-R1 splits it (the title keeps its quotes)."""
    title, _, text = contents.partition("\n")
    return title, text


def format_passages(docs: list[dict]) -> str:
    """Render retrieved documents as the model sees them: ``Doc i(Title: ...) text``, one per line."""
    lines = []
    for i, doc in enumerate(docs, 1):
        title, text = split_contents(str(doc.get("contents", "")))
        lines.append(f"Doc {i}(Title: {title}) {text}")
    return "\n".join(lines)


def parse_passages(observation: str) -> list[tuple[str, str]]:
    """Inverse of ``format_passages``: [(title without quotes, text)] read from an observation string."""
    return [(t.strip().strip('"'), body.strip()) for _, t, body in _DOC_LINE.findall(observation or "")]


# --------------------------------------------------------------------------------------------------
# The generated world
# --------------------------------------------------------------------------------------------------

_ONSETS = ["b", "br", "c", "d", "dr", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "th", "v", "z", "st"]
_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "o", "ia", "ou"]
_CODAS = ["", "", "", "n", "r", "l", "s", "m", "nd"]
_OCCUPATIONS = ["architect", "painter", "chemist", "novelist", "engineer", "pilot", "composer", "surgeon",
                "economist", "sculptor", "astronomer", "lawyer", "photographer", "geologist", "violinist"]
_INDUSTRIES = ["software", "shipping", "mining", "banking", "textiles", "aviation", "pharmaceuticals",
               "retail", "energy", "agriculture", "telecommunications", "publishing"]
_COMPANY_SUFFIXES = ["Holdings", "Group", "Industries", "Partners", "Corporation", "Works", "Labs"]
_CURRENCY_UNITS = ["crown", "mark", "dinar", "florin", "real", "shilling"]
_SEA_PREFIXES = ["Gulf of", "Sea of", "Bay of"]
_EVENT_KINDS = ["Trade Fair", "Music Festival", "Science Congress", "Chess Open", "Film Festival", "Book Fair"]

# Relation -> question template, grouped by split role. ``{e}`` is the subject entity's name.
IN_DOMAIN = {  # train + test (benchmark nq)
    ("person", "birth_year"): "In what year was {e} born?",
    ("person", "birth_city"): "Where was {e} born?",
    ("company", "founded"): "What year was {e} founded?",
    ("company", "headquarters"): "Where is {e} headquartered?",
    ("country", "capital"): "What is the capital of {e}?",
    ("city", "country"): "In which country is {e} located?",
    ("river", "length"): "How long is the {e}?",
}
OOD_SINGLE = {  # relations never asked in training (benchmark single_hop)
    ("person", "occupation"): "What is the occupation of {e}?",
    ("company", "industry"): "In which industry does {e} operate?",
    ("company", "listed"): "In what year was {e} listed on the stock exchange?",
    ("country", "currency"): "What is the currency of {e}?",
    ("country", "language"): "What is the official language of {e}?",
    ("river", "mouth"): "Into which body of water does the {e} flow?",
}
MULTI_HOP = {  # name -> (subject type, first relation, second relation, template) (benchmark multi_hop)
    "ceo_founded": ("person", "ceo_of", "founded", "In which year was the company whose CEO is {e} founded?"),
    "born_capital": ("person", "birth_country", "capital", "What is the capital of the country where {e} was born?"),
    "ceo_birth_city": ("company", "ceo", "birth_city", "Where was the CEO of {e} born?"),
    "city_river_length": ("city", "river", "length", "How long is the river that flows through {e}?"),
}

# How the expert reads a relation off the subject's own passage: a regex on the passage text whose
# first group is the value. These mirror the document templates in ``_entity_documents``.
READERS = {
    "birth_year": r"is an? [a-z ]+ born in (\d{4})\.",
    "occupation": r"is an? ([a-z ]+?) born in \d{4}\.",
    "birth_city": r"was born in ([^,.]+), a city in [^.]+\.",
    "birth_country": r"was born in [^,.]+, a city in ([^.]+)\.",
    "ceo_of": r"has been the chief executive officer of ([^.]+)\.",
    "industry": r"is an? ([a-z ]+?) company headquartered in",
    "headquarters": r"company headquartered in ([^.]+)\.",
    "founded": r"It was founded in (\d{4})",
    "listed": r"listed on the stock exchange in (\d{4})\.",
    "ceo": r"Its chief executive officer is ([^.]+)\.",
    "capital": r"is a country whose capital is ([^.]+)\.",
    "currency": r"Its currency is the (.+?) and its official language",
    "language": r"its official language is ([^.]+)\.",
    "country": r"is a city in ([^.]+)\.",
    "river": r"It lies on the ([^.]+)\.",
    "length": r"^The .+? is (\d+ kilometres) long\.",
    "mouth": r"flows into the ([^.]+)\.",
}
# The query the expert issues for a relation, then a plainer fallback if the passage was not retrieved.
QUERY_HINTS = {
    "birth_year": "born", "occupation": "occupation", "birth_city": "born in city", "birth_country": "born in city",
    "ceo_of": "chief executive officer", "industry": "company industry", "headquarters": "company headquartered",
    "founded": "founded", "listed": "listed stock exchange", "ceo": "chief executive officer",
    "capital": "country capital", "currency": "currency", "language": "official language",
    "country": "city", "river": "city lies on river", "length": "kilometres long", "mouth": "flows into",
}


@dataclass
class World:
    """The generated knowledge base: entity records, the corpus, and the question pools per split."""

    seed: int
    entities: dict[str, dict[str, dict]]  # type -> name -> attributes
    documents: list[dict]  # {"id", "contents"}
    pools: dict[str, list[dict]] = field(default_factory=dict)  # split -> question records
    retriever: BM25Retriever | None = field(default=None, repr=False)  # built on first search


def world_scale(n_train: int, n_test: int, n_ood: int) -> int:
    """Number of people in the world (the other entity counts follow it) so that every split's pool
    holds at least the configured number of questions. In-domain pairs are ~4.25 per person."""
    return int(min(5000, max(12, math.ceil(1.15 * (n_train + n_test + n_ood) / 4.25))))


class _Names:
    """Invented, globally unique capitalised words (deterministic in the rng)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = {"the", "an", "a"}

    def word(self, syllables: tuple[int, int] = (2, 2)) -> str:
        while True:
            n = self.rng.randint(*syllables)
            w = "".join(self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS) for _ in range(n))
            if 4 <= len(w) <= 9 and w not in self.used:
                self.used.add(w)
                return w.capitalize()


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _entity_documents(E: dict, rng: random.Random) -> list[tuple[str, str]]:
    """(title, text) of every entity's own passage, with distractor facts mixed in."""
    docs = []
    cities = sorted(E["city"])
    for name, p in E["person"].items():
        t = (f"{name} is {_article(p['occupation'])} {p['occupation']} born in {p['birth_year']}. "
             f"{name} was born in {p['birth_city']}, a city in {p['birth_country']}. ")
        first = name.split()[0]
        if p.get("ceo_of"):
            t += f"Since {p['ceo_since']}, {first} has been the chief executive officer of {p['ceo_of']}. "
        other = rng.choice([c for c in cities if c != p["birth_city"]])
        t += f"In {p['birth_year'] + rng.randint(18, 28)}, {first} moved to {other}, {E['city'][other]['country']}."
        docs.append((name, t))
    for name, c in E["company"].items():
        other = rng.choice([x for x in cities if x != c["headquarters"]])
        office_year = rng.randint(c["listed"] + 1, 2024)
        docs.append((name, (
            f"{name} is {_article(c['industry'])} {c['industry']} company headquartered in {c['headquarters']}. "
            f"It was founded in {c['founded']} and listed on the stock exchange in {c['listed']}. "
            f"Its chief executive officer is {c['ceo']}. In {office_year} it opened an office in {other}.")))
    for name, k in E["country"].items():
        docs.append((name, (
            f"{name} is a country whose capital is {k['capital']}. Its largest city is {k['largest_city']}. "
            f"Its currency is the {k['currency']} and its official language is {k['language']}.")))
    for name, c in E["city"].items():
        t = f"{name} is a city in {c['country']}. "
        if c.get("river"):
            t += f"It lies on the {c['river']}. "
        t += f"About {c['population']:,} people live there, and it was first mentioned in {c['first_mentioned']}."
        docs.append((name, t))
    for name, r in E["river"].items():
        docs.append((name, (
            f"The {name} is {r['length']} kilometres long. It rises in {r['source_country']} and flows into the "
            f"{r['mouth']}. Its longest tributary, the {r['tributary']}, is {r['tributary_length']} kilometres long.")))
    return docs


def _event_documents(E: dict, n: int, rng: random.Random) -> list[tuple[str, str]]:
    """Distractor passages that mention several entities together with unrelated years."""
    people, companies, countries, cities = (sorted(E[t]) for t in ("person", "company", "country", "city"))
    docs, titles = [], set()
    while len(docs) < n:
        year, city, kind = rng.randint(1950, 2020), rng.choice(cities), rng.choice(_EVENT_KINDS)
        title = f"{year} {city} {kind}"
        if title in titles:
            continue
        titles.add(title)
        docs.append((title, (
            f"The {title} was opened by {rng.choice(people)}. {rng.choice(companies)} was its main sponsor, "
            f"and its guests of honour came from {rng.choice(countries)}.")))
    return docs


def _gold(etype: str, relation: str, E: dict, name: str) -> list[str]:
    """Gold answers of (entity, relation): the canonical value first, accepted variants after it."""
    rec = E[etype][name]
    if relation == "birth_city":
        return [rec["birth_city"], f"{rec['birth_city']}, {rec['birth_country']}"]
    if relation == "headquarters":
        hq = rec["headquarters"]
        return [hq, f"{hq}, {E['city'][hq]['country']}"]
    if relation == "length":
        n = rec["length"]
        return [f"{n} kilometres", f"{n} kilometers", f"{n} km", str(n)]
    if relation == "industry":
        return [rec["industry"], f"{rec['industry']} industry"]
    return [str(rec[relation])]


@functools.lru_cache(maxsize=8)
def build_world(seed: int, n_people: int, n_test: int, n_ood: int) -> World:
    """Generate the world of ``seed`` with ``n_people`` people (see ``world_scale``) and its question pools:
    ``test`` holds ``n_test`` questions, ``single_hop`` and ``multi_hop`` ``n_ood`` each, ``train`` the rest."""
    rng = random.Random(f"acl-search-world-{seed}")
    names = _Names(rng)
    n_countries = max(4, n_people // 5)
    n_cities, n_companies, n_rivers = 4 * n_countries, max(4, n_people // 2), max(3, n_people // 4)

    E: dict[str, dict[str, dict]] = {t: {} for t in ("country", "city", "person", "company", "river")}
    for _ in range(n_countries):
        E["country"][names.word()] = {}
    countries = list(E["country"])
    for i in range(n_cities):
        E["city"][names.word()] = {"country": countries[i % n_countries], "population": rng.randint(8, 900) * 1000,
                                   "first_mentioned": rng.randint(900, 1700)}
    for k in countries:
        in_k = [c for c, v in E["city"].items() if v["country"] == k]
        capital, largest = rng.sample(in_k, 2)
        E["country"][k] = {"capital": capital, "largest_city": largest, "language": names.word((2, 2)) + "ish",
                           "currency": f"{names.word((1, 2))} {rng.choice(_CURRENCY_UNITS)}"}
    # a small pool of first and last names, so that several people share one (BM25 distractors)
    firsts = [names.word((1, 2)) for _ in range(max(6, n_people // 3))]
    lasts = [names.word() for _ in range(max(6, n_people // 2))]
    while len(E["person"]) < n_people:
        full = f"{rng.choice(firsts)} {rng.choice(lasts)}"
        if full not in E["person"]:
            city = rng.choice(list(E["city"]))
            E["person"][full] = {"birth_year": rng.randint(1920, 1995), "birth_city": city,
                                 "birth_country": E["city"][city]["country"], "occupation": rng.choice(_OCCUPATIONS)}
    ceos = rng.sample(list(E["person"]), n_companies)
    for ceo in ceos:
        name = f"{names.word()} {rng.choice(_COMPANY_SUFFIXES)}"
        founded = rng.randint(1850, 2010)
        E["company"][name] = {"industry": rng.choice(_INDUSTRIES), "headquarters": rng.choice(list(E["city"])),
                              "founded": founded, "listed": rng.randint(founded + 3, min(founded + 60, 2020)),
                              "ceo": ceo}
        p = E["person"][ceo]
        p["ceo_of"], p["ceo_since"] = name, rng.randint(p["birth_year"] + 28, min(p["birth_year"] + 55, 2024))
    free_cities = rng.sample(list(E["city"]), len(E["city"]))  # each city lies on at most one river
    for _ in range(n_rivers):
        name = f"{names.word()} River"
        E["river"][name] = {"length": rng.randint(40, 3000), "source_country": rng.choice(countries),
                            "mouth": f"{rng.choice(_SEA_PREFIXES)} {names.word()}",
                            "tributary": f"{names.word()} Brook", "tributary_length": rng.randint(10, 300)}
        for _ in range(rng.randint(1, 3)):
            if free_cities:
                E["city"][free_cities.pop()]["river"] = name

    texts = _entity_documents(E, rng) + _event_documents(E, max(3, n_people // 3), rng)
    rng.shuffle(texts)
    documents = [{"id": str(i), "contents": make_contents(t, x)} for i, (t, x) in enumerate(texts)]
    world = World(seed=seed, entities=E, documents=documents)
    world.pools = _question_pools(E, rng, n_test, n_ood)
    return world


def _single(etype: str, relation: str, name: str, template: str, E: dict) -> dict:
    return {"question": template.format(e=name), "golden_answers": _gold(etype, relation, E, name),
            "hops": [{"subject": name, "relation": relation}], "kind": relation}


def _round_robin(groups: dict[Any, list], n: int) -> list:
    """Up to ``n`` items taken from the (already shuffled) groups in turn, so every kind is represented."""
    out, queues = [], [list(g) for g in groups.values() if g]
    while len(out) < n and queues:
        for q in list(queues):
            if len(out) < n and q:
                out.append(q.pop(0))
            if not q:
                queues.remove(q)
    return out


def _question_pools(E: dict, rng: random.Random, n_test: int, n_ood: int) -> dict[str, list[dict]]:
    def shuffled(xs: Iterable) -> list:
        xs = sorted(xs)
        rng.shuffle(xs)
        return xs

    multi_groups = {}
    for kind, (etype, r1, r2, template) in MULTI_HOP.items():
        subjects = [s for s, rec in E[etype].items() if rec.get(r1)]
        multi_groups[kind] = []
        for s in shuffled(subjects):
            bridge = E[etype][s][r1]
            btype = {"ceo_of": "company", "birth_country": "country", "ceo": "person", "river": "river"}[r1]
            multi_groups[kind].append({
                "question": template.format(e=s), "golden_answers": _gold(btype, r2, E, bridge), "kind": kind,
                "hops": [{"subject": s, "relation": r1}, {"relation": r2}], "_final": (bridge, r2)})
    multi = _round_robin(multi_groups, n_ood)
    reserved = {q.pop("_final") for q in multi}  # their final pairs never become train questions
    for group in multi_groups.values():
        for q in group:
            q.pop("_final", None)

    single_groups = {rel: [_single(t, rel, s, tpl, E) for s in shuffled(E[t])] for (t, rel), tpl in OOD_SINGLE.items()}
    in_groups = {rel: [_single(t, rel, s, tpl, E) for s in shuffled(E[t])] for (t, rel), tpl in IN_DOMAIN.items()}
    test = _round_robin(in_groups, n_test)
    taken = {(q["hops"][0]["subject"], q["hops"][0]["relation"]) for q in test} | reserved
    train = [q for g in in_groups.values() for q in g
             if (q["hops"][0]["subject"], q["hops"][0]["relation"]) not in taken]
    rng.shuffle(train)
    return {"train": train, "test": test, "single_hop": _round_robin(single_groups, n_ood), "multi_hop": multi}


# --------------------------------------------------------------------------------------------------
# Real data (FlashRAG layout under <data_dir>/search/)
# --------------------------------------------------------------------------------------------------

# split -> [(dataset folder, file stem)]; for evaluation files ``test`` falls back to ``dev``.
REAL_DATASETS = {
    "train": [("nq", "train")],
    "test": [("nq", "test")],
    "single_hop": [("popqa", "test"), ("triviaqa", "test")],
    "multi_hop": [("2wikimultihopqa", "dev"), ("hotpotqa", "dev"), ("bamboogle", "test"), ("musique", "dev")],
}
CORPUS_FILES = ("wiki-18.jsonl", "corpus.jsonl")


def load_question_file(path: str | Path) -> list[dict]:
    """Read a FlashRAG question file: one JSON object per line with ``id``, ``question``,
    ``golden_answers`` (a list; a bare string is wrapped) and optional ``metadata``."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if "question" not in row or "golden_answers" not in row:
                raise ValueError(f"{path}:{lineno}: a question row needs 'question' and 'golden_answers'")
            gold = row["golden_answers"]
            row["golden_answers"] = [gold] if isinstance(gold, str) else [str(g) for g in gold]
            row.setdefault("id", str(lineno - 1))
            rows.append(row)
    return rows


def _real_file(root: Path, dataset: str, stem: str) -> Path | None:
    for s in (stem, "dev", "test") if stem != "train" else (stem,):
        p = root / dataset / f"{s}.jsonl"
        if p.exists():
            return p
    return None


def find_corpus(root: Path) -> Path:
    for name in CORPUS_FILES:
        if (root / name).exists():
            return root / name
    raise FileNotFoundError(f"no search corpus in {root} (expected one of {', '.join(CORPUS_FILES)})")


# --------------------------------------------------------------------------------------------------
# Environment, episode, expert
# --------------------------------------------------------------------------------------------------

SYSTEM_PROMPT = (
    "You answer questions with the help of a search engine. Call the `search` tool with a query whenever you "
    "need a fact; you may search as many times as you need, and each search returns the top passages of a "
    "knowledge corpus. When you know the answer, reply without a tool call and give only the final answer "
    "inside <answer> and </answer>, for example <answer>Paris</answer>."
)
SEARCH_TOOL = function_schema(
    "search",
    "Search the knowledge corpus and return the most relevant passages.",
    {"query": {"type": "string", "description": "What to search for, e.g. an entity name and the fact wanted."}},
)


class SearchEpisode(ToolEpisode):
    """A question-answering episode: ``search`` calls until a turn without a tool call gives the answer."""

    def __init__(self, task: Task, retriever, topk: int, max_turns: int = 16):
        super().__init__(task, max_turns=max_turns)
        self.retriever = retriever
        self.topk = topk
        self._prefetched: dict[str, list[dict]] = {}  # query -> documents (prefetch), used once each
        self.final_text: str | None = None
        self.prediction: str | None = None

    def tool_functions(self) -> dict[str, Callable[..., Any]]:
        return {"search": self._search}

    def _search(self, query: str) -> str:
        if not query.strip():
            raise ToolError("query must be a non-empty string")
        q = query[:1000]
        docs = self._prefetched.pop(q) if q in self._prefetched else self.retriever.search(q, self.topk)
        return format_passages(docs) if docs else "No results found."

    @staticmethod
    def prefetch(episodes: list[SearchEpisode], texts: list[str]) -> None:
        """Before a round of turns is stepped: the searches the turns ``texts`` will make, retrieved in one batch per
        retriever (``search_many``) and kept on each episode for its ``_search``. A failing retriever leaves the
        searches to be made (and fail) one by one, as without this."""
        wanted: dict[int, tuple[object, int, list]] = {}
        for ep, text in zip(episodes, texts):
            queries = [c.arguments["query"][:1000] for c in parse_assistant(text).calls
                       if isinstance(c, ToolCall) and c.name == "search"
                       and isinstance(c.arguments.get("query"), str) and c.arguments["query"].strip()]
            if queries:
                wanted.setdefault(id(ep.retriever), (ep.retriever, ep.topk, []))[2].append((ep, queries))
        for retriever, topk, items in wanted.values():
            unique = list(dict.fromkeys(q for _, qs in items for q in qs))
            try:
                found = dict(zip(unique, retriever.search_many(unique, topk)))
            except ToolError:
                continue
            for ep, qs in items:
                ep._prefetched.update({q: found[q] for q in qs})

    def on_text(self, content: str) -> list[dict]:
        self.final_text = content
        self.prediction = extract_answer(content)
        self.done = True
        return []

    def _score(self) -> float:
        if self.final_text is None:
            self.failure = self.end_reason or "no final answer"
            return 0.0
        if self.prediction is None:
            self.failure = "no <answer> tag"
            return 0.0
        if exact_match(self.prediction, self.task.answer):
            return 1.0
        self.failure = f"wrong answer: {self.prediction[:200]!r}"
        return 0.0


class SearchEnv(Environment):
    """The search domain. See the module docstring for the data and the splits."""

    name = "search"
    splits: dict[str, str | None] = {"train": None, "test": "nq", "single_hop": "single_hop", "multi_hop": "multi_hop"}

    def __init__(self, worlds=None, seed: int = 0):
        self.worlds = worlds if worlds is not None else WorldsConfig()
        self.seed = seed
        self.topk = self.worlds.search_topk
        self.data_root = Path(self.worlds.data_dir) / "search" if self.worlds.data_dir else None
        self._retriever = None
        self._real_pools: dict[str, list[dict]] = {}
        if self.data_root is None:
            w = self.worlds
            self.world = build_world(seed, world_scale(w.n_train, w.n_test, w.n_ood), w.n_test, w.n_ood)
        else:
            self.world = None

    # -- corpus and retrieval --
    @property
    def documents(self) -> list[dict]:
        """The generated corpus (``id``, ``contents``); empty for real data (the corpus stays on disk)."""
        return self.world.documents if self.world else []

    @property
    def retriever(self):
        """HTTP client if ``worlds.retriever_url`` is set, else a local bm25s index (built on first use)."""
        if self._retriever is None:
            if self.worlds.retriever_url:
                self._retriever = HTTPRetriever(self.worlds.retriever_url)
            elif self.world is not None:
                if self.world.retriever is None:  # one index per world, shared by every env built on it
                    self.world.retriever = BM25Retriever.from_documents(self.world.documents)
                self._retriever = self.world.retriever
            else:
                self._retriever = BM25Retriever.from_corpus_file(find_corpus(self.data_root))
        return self._retriever

    def search(self, query: str, k: int | None = None) -> str:
        """Run one search as the tool would (for notebooks): the formatted passages."""
        docs = self.retriever.search(query, k or self.topk)
        return format_passages(docs) if docs else "No results found."

    # -- tasks --
    def _pool(self, split: str) -> list[dict]:
        if split not in self.splits:
            raise ValueError(f"unknown split {split!r} for search (valid: {', '.join(self.splits)})")
        if self.world is not None:
            return self.world.pools[split]
        if split not in self._real_pools:
            rows = []
            for dataset, stem in REAL_DATASETS[split]:
                path = _real_file(self.data_root, dataset, stem)
                if path is not None:
                    rows += [{"id": f"{dataset}/{r['id']}", "source": dataset, "question": r["question"],
                              "golden_answers": r["golden_answers"]} for r in load_question_file(path)]
            if not rows:
                expected = ", ".join(f"{d}/{s}.jsonl" for d, s in REAL_DATASETS[split])
                raise FileNotFoundError(
                    f"no question file for split {split!r} under {self.data_root} (expected {expected})")
            self._real_pools[split] = rows
        return self._real_pools[split]

    def tasks(self, split: str, n: int, seed: int = 0) -> list[Task]:
        """``min(n, pool size)`` tasks of ``split``, drawn without replacement with ``seed``."""
        pool = self._pool(split)
        idx = list(range(len(pool)))
        random.Random(f"search-{split}-{seed}").shuffle(idx)
        bench = self.splits[split] or "nq"
        out = []
        for i in idx[: max(0, n)]:
            q = pool[i]
            question = q["question"].strip()
            if question and not question.endswith("?"):
                question += "?"  # as Search-R1 prepares its prompts
            meta = {"split": split}
            if "hops" in q:
                meta.update(kind=q["kind"], hops=q["hops"])
                tid = f"search/{split}/{i:05d}"
            else:
                meta["source"] = q["source"]
                tid = f"search/{split}/{q['id']}"
            out.append(Task(id=tid, domain=self.name, benchmark=bench, system_prompt=SYSTEM_PROMPT,
                            user_prompt=question, tools=[SEARCH_TOOL], answer=list(q["golden_answers"]), meta=meta))
        return out

    def start(self, task: Task, max_turns: int = 16) -> SearchEpisode:
        return SearchEpisode(task, self.retriever, self.topk, max_turns=max_turns)


def document_texts(source=None, seed: int = 0) -> list[str]:
    """The generated corpus as plain texts (``Title\\ntext``) for base pretraining.

    ``source`` is a ``SearchEnv`` or a ``WorldsConfig`` (None: the default config) with world ``seed``.
    """
    env = source if isinstance(source, SearchEnv) else SearchEnv(source, seed=seed)
    return [d["contents"] for d in env.documents]


def read_fact(passages: list[tuple[str, str]], subject: str, relation: str) -> str | None:
    """The value of ``relation`` for ``subject`` read off a retrieved passage titled ``subject``, or None."""
    pattern = re.compile(READERS[relation])
    for title, text in passages:
        if title == subject:
            m = pattern.search(text)
            if m:
                return m.group(1).strip()
    return None


def _expert_queries(subject: str, relation: str) -> list[str]:
    return [f"{subject} {QUERY_HINTS[relation]}", subject]


def _reader_turn(task: Task, observations: list[str]) -> str:
    """Expert for real-data questions, which have no hop plan: search the question, then once more with
    the question expanded by the top passage's text (pseudo-relevance feedback, which reaches the second
    hop of many bridge questions); answer the first gold answer that occurs in the retrieved passages,
    else ``unknown``. It only answers what retrieval supports, so its demonstrations are grounded."""
    seen = " ".join(normalize_answer(o) for o in observations)
    found = [g for g in task.answer if normalize_answer(g) and f" {normalize_answer(g)} " in f" {seen} "]
    if found:
        return f"<answer>{found[0]}</answer>"
    if not observations:
        return format_tool_call("search", {"query": task.user_prompt})
    passages = parse_passages(observations[0])
    if len(observations) == 1 and passages:
        return format_tool_call("search", {"query": f"{task.user_prompt} {passages[0][1]}"})
    return "<answer>unknown</answer>"


def scripted_expert(task: Task, messages: list[dict]) -> str:
    """The next assistant turn of a policy that searches and reads like a careful human.

    Generated tasks: for each hop it searches for the subject (and the fact wanted), reads the returned
    passage titled with the subject, and extracts the value with the passage-template regex; the value of
    the first hop of a multi-hop question is the subject of the second. If the passage was not retrieved
    it retries with a plainer query. After the last hop it answers ``<answer>value</answer>``.

    Real-data tasks (no hop plan): see ``_reader_turn``.
    """
    observations = [m.get("content") or "" for m in messages if m.get("role") == "tool"]
    hops = (task.meta or {}).get("hops")
    if not hops:
        return _reader_turn(task, observations)

    hop, subject, tries = 0, hops[0]["subject"], 0
    for obs in observations:
        value = read_fact(parse_passages(obs), subject, hops[hop]["relation"])
        if value is None:
            tries += 1
            if tries >= len(_expert_queries(subject, hops[hop]["relation"])):
                return "<answer>unknown</answer>"
            continue
        hop, subject, tries = hop + 1, value, 0
        if hop == len(hops):
            return f"<answer>{value}</answer>"
    return format_tool_call("search", {"query": _expert_queries(subject, hops[hop]["relation"])[tries]})
