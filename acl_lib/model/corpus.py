"""The base pretraining corpus of the small profiles, drawn from the four training worlds.

A web-pretrained base (the study's Qwen3-8B-Base) has seen text of every kind, right and wrong, but was
never trained on our benchmarks. The mini base imitates that:

- only the *training* worlds (math, search, retail, instruct) and only their ``train`` splits, of worlds
  built with other seeds than the evaluation world (``pretrain.world_seeds``; ``worlds.seed`` is refused):
  no test task, no fact or entity of the evaluated world, and nothing from the OOD domains (mock, telecom,
  multiple-choice sets, unseen IF constraints). Entities drawn fresh per world mean that only reading the
  context predicts them, as for a web-pretrained model facing a benchmark it never saw;
- chat-rendered transcripts of a *noisy* scripted expert: each assistant turn is, with probability
  ``pretrain.noise``, corrupted (a digit changed in a tool argument or an answer, an answer swapped for
  another task's, a single-turn solution replaced by a plausible wrong one). Tools and users answer the
  corrupted turn for real, so errors and their consequences are in the corpus too;
- the search world's knowledge documents as plain text.

So the base starts with the formats and some skill, low but not zero (measured, not assumed: see the
base run's ``metrics.json``).
"""

from __future__ import annotations

import random
import re
import sys
from collections.abc import Callable

from acl_lib.config import Config
from acl_lib.envs import STAGE_ENV, make_env, scripted_expert
from acl_lib.envs.base import Task
from acl_lib.model.chat_template import render_chat

_DIGIT = re.compile(r"\d")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


def corrupt_turn(text: str, rng: random.Random, pool: list[str]) -> str:
    """A plausible wrong version of one assistant turn (never the same text when it can be helped)."""
    digits = [m.start() for m in _DIGIT.finditer(text)]
    tags = list(_ANSWER_TAG.finditer(text))
    if tags and pool and rng.random() < 0.5:
        other = [m.group(1) for p in pool for m in _ANSWER_TAG.finditer(p) if m.group(1) != tags[-1].group(1)]
        if other:
            m = tags[-1]
            return text[: m.start(1)] + rng.choice(other) + text[m.end(1):]
    if digits:
        i = rng.choice(digits)
        new = rng.choice([d for d in "0123456789" if d != text[i]])
        return text[:i] + new + text[i + 1:]
    others = [p for p in pool if p != text]
    return rng.choice(others) if others else text


def noisy(expert: Callable[[Task, list[dict]], str], noise: float, rng: random.Random,
          wrong_solutions: dict[str, str] | None = None) -> Callable:
    """Wrap a scripted expert: each turn is corrupted with probability ``noise``.

    ``wrong_solutions`` (task id -> text), where given, is the corrupted turn of a single-turn task: a
    plausible wrong solution (a digit flip would often leave an inconsistent but "right" answer line).
    """
    pool: list[str] = []
    wrong_solutions = wrong_solutions if wrong_solutions is not None else {}

    def policy(task: Task, messages: list[dict]) -> str:
        text = expert(task, messages)
        pool.append(text)
        del pool[:-64]
        if rng.random() < noise:
            wrong = wrong_solutions.get(task.id)
            text = wrong if wrong is not None else corrupt_turn(text, rng, pool)
        return text

    return policy


def transcript(env, policy, task: Task, max_turns: int) -> list[dict]:
    """Play one episode with ``policy``; returns the messages."""
    episode = env.start(task, max_turns=max_turns)
    while not episode.done:
        episode.step(policy(task, episode.messages))
    return episode.messages


def base_corpus(cfg: Config) -> tuple[list[str], dict[str, dict]]:
    """``(documents, stats per source)``: about ``cfg.pretrain.corpus_chars`` characters, split evenly over the
    worlds of ``cfg.pretrain.world_seeds`` (see ``world_corpus``), shuffled."""
    seeds = cfg.pretrain.world_seeds
    if not seeds:
        raise ValueError("pretrain.world_seeds is empty: the corpus needs at least one world")
    docs: list[str] = []
    stats: dict[str, dict] = {}
    share = cfg.pretrain.corpus_chars // len(seeds)
    for s in seeds:
        tree = cfg.to_dict()
        tree["worlds"] = cfg.pretraining_worlds().model_dump(mode="json")
        tree["worlds"]["seed"] = s
        tree["pretrain"]["corpus_chars"] = max(1000, share)
        tree["pretrain"]["world_seeds"] = [x for x in seeds if x != s]
        part, part_stats = world_corpus(Config.model_validate(tree))
        docs += part
        for source, st in part_stats.items():
            agg = stats.setdefault(source, {})
            for k, v in st.items():
                agg[k] = agg.get(k, 0) + v
    random.Random(cfg.seed * 7919 + 29).shuffle(docs)
    stats["worlds"] = {"seeds": list(seeds)}
    return docs, stats


def world_corpus(cfg: Config) -> tuple[list[str], dict[str, dict]]:
    """``(documents, stats per source)`` of the one world ``cfg.worlds`` (with its seed): about
    ``cfg.pretrain.corpus_chars`` characters of chat-rendered transcripts, shared between the training
    worlds as ``cfg.pretrain.mix`` says, plus the search world's knowledge documents.

    Tasks come from each world's ``train`` split, drawn with the world seed plus an offset so they are not
    the very tasks RL trains on later; a small pool is cycled (each pass with fresh noise).
    """
    rng = random.Random(cfg.seed * 7919 + 17)
    mix = {d: w for d, w in cfg.pretrain.mix.items() if w > 0}
    total = sum(mix.values())
    docs: list[str] = []
    stats: dict[str, dict] = {}
    search_env = None
    for domain, share in mix.items():
        name = STAGE_ENV[domain]
        env = make_env(name, cfg.worlds, seed=cfg.worlds.seed)
        if name == "search":
            search_env = env
        module = sys.modules[type(env).__module__]  # the environment's own module (loaded: env is its instance)
        wrong_fn = getattr(module, "wrong_solution_text", None)
        wrong: dict[str, str] = {}
        policy = noisy(scripted_expert(name), cfg.pretrain.noise, rng, wrong)
        target = int(cfg.pretrain.corpus_chars * share / total)

        # this iteration's env, policy, wrong and wrong_fn bound as defaults (render is only called in it)
        def render(task: Task, env=env, policy=policy, wrong=wrong, wrong_fn=wrong_fn) -> str:
            if wrong_fn is not None and not task.tools:
                wrong[task.id] = wrong_fn(task, rng)
            return render_chat(transcript(env, policy, task, cfg.pretrain.max_turns), tools=task.tools or None)

        probe = env.tasks("train", 16, seed=cfg.worlds.seed + 1000 + cfg.seed)
        per_doc = max(1, sum(len(render(t)) for t in probe) // max(1, len(probe)))
        tasks = env.tasks("train", int(1.2 * target / per_doc) + 1, seed=cfg.worlds.seed + 1000 + cfg.seed)
        chars, n = 0, 0
        while chars < target and tasks:
            for task in tasks:
                if chars >= target:
                    break
                doc = render(task)
                docs.append(doc)
                chars += len(doc)
                n += 1
        stats[domain] = {"docs": n, "chars": chars, "distinct_tasks": min(n, len(tasks))}
    if search_env is not None:
        knowledge = [d["contents"] for d in search_env.documents]
        docs.extend(knowledge)
        stats["search_documents"] = {"docs": len(knowledge), "chars": sum(map(len, knowledge))}
    rng.shuffle(docs)
    return docs, stats
