"""Shared pieces for the training tests: a tiny tokenizer + model on disk, a config, and a tiny tool world.

A helper module, not a test module: tests import it (``from train_kit import DeskEnv``) and conftest.py builds
the session's ``base_dir`` with ``make_base``; its own tests are in test_train_kit.py.

``DeskEnv`` is a two-observation-kind world in the shape of retail: the agent must ask the simulated user
which city they mean (a ``user`` turn comes back), look its population up with a tool (a ``tool`` turn comes
back), then answer. Its ``scripted_expert`` solves every task. It exists so the multi-turn machinery is tested
on both kinds of observation whatever state the real worlds are in.
"""

from __future__ import annotations

import functools
import random

from acl_lib.chat import format_tool_call
from acl_lib.config import load_config
from acl_lib.envs.base import Environment, Task, ToolEpisode, ToolError, function_schema

CITIES = {"Paris": "2100000", "Lyon": "520000", "Nice": "340000", "Lille": "230000", "Brest": "140000",
          "Metz": "120000", "Caen": "105000", "Dijon": "157000"}

LOOKUP = function_schema("lookup", "Population of a city.", {"city": {"type": "string", "description": "city name"}})


class DeskEpisode(ToolEpisode):
    def tool_functions(self):
        def lookup(city: str) -> str:
            if city not in CITIES:
                raise ToolError(f"unknown city '{city}'")
            return f"population of {city}: {CITIES[city]}"

        return {"lookup": lookup}

    def on_text(self, content: str) -> list[dict]:
        if content.rstrip().endswith("?"):  # a question to the simulated user: they answer, the episode goes on
            return [{"role": "user", "content": f"I mean {self.task.meta['city']}."}]
        self.answer = content
        self.done = True
        return []

    def _score(self) -> float:
        ok = getattr(self, "answer", None) is not None and self.task.answer in self.answer
        if not ok:
            self.failure = "wrong or missing answer"
        return float(ok)


class DeskEnv(Environment):
    name = "desk"
    splits = {"train": None}

    def __init__(self, worlds=None, seed: int = 0):
        self.seed = seed

    def tasks(self, split, n, seed=0):
        rng = random.Random(f"{self.seed}/{split}/{seed}")
        out = []
        for i in range(n):
            city = rng.choice(sorted(CITIES))
            out.append(Task(id=f"desk-{split}-{i}", domain="desk", benchmark="desk", system_prompt="You run a desk.",
                            user_prompt="How many people live in my city?", tools=[LOOKUP], answer=CITIES[city],
                            meta={"city": city}))
        return out

    def start(self, task, max_turns=16):
        return DeskEpisode(task, max_turns=max_turns)


def desk_expert(task: Task, messages: list[dict]) -> str:
    """The desk's scripted expert: ask which city, look it up, answer."""
    last = messages[-1]
    if last["role"] == "user" and len([m for m in messages if m["role"] == "user"]) == 1:
        return "Which city do you mean?"
    if last["role"] == "user":
        city = last["content"].removeprefix("I mean ").rstrip(".")
        return format_tool_call("lookup", {"city": city})
    return f"It has {last['content'].rsplit(': ', 1)[1]} inhabitants."


def tiny_cfg(tmp_path, **overrides):
    """The smoke profile writing under ``tmp_path``, one torch thread."""
    ov = {"output_dir": str(tmp_path / "outputs"), "torch_threads": 1, **overrides}
    return load_config("smoke", overrides=ov)


@functools.lru_cache(maxsize=1)
def desk_corpus() -> tuple[str, ...]:
    from acl_lib.model.chat_template import render_chat

    env = DeskEnv()
    docs = []
    for t in env.tasks("train", 40, seed=99):
        ep = env.start(t)
        while not ep.done:
            ep.step(desk_expert(t, ep.messages))
        docs.append(render_chat(ep.messages, tools=t.tools))
    docs += [f"{a}+{b}={a + b}" for a in range(10) for b in range(10)]
    return tuple(docs)


def make_base(path, cfg):
    """Tokenizer (trained on desk transcripts) + a freshly initialised smoke-sized Qwen3, saved at ``path``."""
    import torch

    from acl_lib.model import build_model, save, train_tokenizer

    torch.manual_seed(0)
    tok = train_tokenizer(list(desk_corpus()), cfg.model.vocab_size, model_max_length=cfg.model.max_position_embeddings)
    model = build_model(cfg.model, tok)
    save(model, tok, path)
    return path


def expert_policy(tok, expert=desk_expert):
    """A scripted expert as a token-level policy: its raw text, tokenized, plus the eos that ends a turn."""

    def policy(reqs):
        outs = []
        for r in reqs:
            text = expert(r.episode.task, r.episode.messages)
            outs.append(tok.encode(text, add_special_tokens=False) + [tok.eos_token_id])
        return outs, None

    return policy
