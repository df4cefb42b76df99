"""MLE's routers: one interface (``route(context) -> domain``) over a ``Context`` (system prompt, tool schemas, the
first user turn: what the agent is shown; never a task's id, benchmark, answer or meta):

* ``ContextRouter``: a rule. Tool schemas offered: a ``search`` tool and nothing else that acts -> search; any
  other tool set (a desk's) -> ecom. No tools: a system prompt of a desk or of a search engine -> that; an output
  contract of the form ``Answer: $...`` (the math prompts' last-line format) -> math; else ``mle.fallback`` (if).
* ``LearnedRouter``: multinomial logistic regression (torch) on hashed bag-of-words and bigram counts
  (``mle.router_features`` buckets, log(1 + count), L2-normalised) of the same context text, trained on
  ``mle.router_train`` training-split contexts per stage world and scored on ``mle.router_heldout`` others of
  the same split (ids and texts disjoint from the training ones, asserted).

``RecordingRouter`` keeps a router's decisions (``decisions_json``: the evaluation's ``routes.json``);
``run_router`` trains the learned router and writes both routers' accuracy and confusion (``router.json``).
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from acl_lib.consolidate.mle.specs import ROUTER_FILE, ROUTER_JSON, ROUTER_SEED, router_run
from acl_lib.envs import BENCHMARKS, STAGE_ENV
from acl_lib.eval.harness import benchmark_size, world
from acl_lib.runs import run_once
from acl_lib.steps import require_complete

if TYPE_CHECKING:
    from acl_lib.config import Config


@dataclass(frozen=True)
class Context:
    """What the agent is shown when an episode starts (or now): system prompt, tool schemas, first user turn."""

    system: str = ""
    tools: tuple = ()
    user: str = ""

    @classmethod
    def of(cls, task, messages: Sequence[Mapping] | None = None) -> Context:
        """From the tools a policy renders (``task.tools``) and the conversation (default: the task's opening).
        Reads nothing else of the task."""
        messages = messages if messages is not None else task.initial_messages()
        system = next((m.get("content") or "" for m in messages if m.get("role") == "system"), "")
        user = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
        tools = tuple(json.dumps(t, sort_keys=True) for t in (task.tools or []))
        return cls(system, tools, user)

    def tool_names(self) -> list[str]:
        return [json.loads(t).get("function", {}).get("name", "") for t in self.tools]

    def text(self) -> str:
        """The text the learned router reads: tool names and descriptions, system prompt, first user turn."""
        parts = []
        for t in self.tools:
            f = json.loads(t).get("function", {})
            parts.append(f"tool {f.get('name', '')} {f.get('description', '')}")
        return "\n".join(parts + [self.system, self.user])


class Router:
    """``route(context) -> domain`` (one of ``cfg.pipeline.curriculum``); ``route_task`` routes an episode's
    opening from the rendered context only."""

    name = "router"

    def route(self, context: Context) -> str:
        raise NotImplementedError

    def route_task(self, task, messages=None) -> str:
        return self.route(Context.of(task, messages))


class RecordingRouter(Router):
    """``router``, keeping every decision it makes (``decisions``: ``(Context, expert)``). The evaluation of an
    MLE system records them in ``routes.json`` so that another router can be checked against the very contexts it
    would see (``routes_agree``)."""

    def __init__(self, router: Router):
        self.router = router
        self.name = router.name
        self.decisions: list[tuple[Context, str]] = []

    def route(self, context: Context) -> str:
        d = self.router.route(context)
        self.decisions.append((context, d))
        return d


def decisions_json(decisions: Sequence[tuple[Context, str]]) -> dict:
    """``{"strings": [...], "rows": [[system, tools, user, expert], ...]}``: each distinct system prompt, tool list
    and user turn stored once (the rows index ``strings``; ``tools`` is the JSON list of the tool schemas)."""
    strings: dict[str, int] = {}

    def ix(text: str) -> int:
        return strings.setdefault(text, len(strings))

    rows = [[ix(c.system), ix(json.dumps(list(c.tools))), ix(c.user), d] for c, d in decisions]
    return {"strings": list(strings), "rows": rows}


def decisions_from_json(obj: Mapping) -> list[tuple[Context, str]]:
    s = obj["strings"]
    return [(Context(s[a], tuple(json.loads(s[b])), s[c]), d) for a, b, c, d in obj["rows"]]


def routes_agree(router: Router, decisions: Sequence[tuple[Context, str]]) -> bool:
    """Whether ``router`` makes every one of ``decisions`` (and there is at least one)."""
    return bool(decisions) and all(router.route(c) == d for c, d in decisions)


_SEARCH_WORDS = re.compile(r"search engine|search tool|knowledge corpus|`search`", re.I)
_DESK_WORDS = re.compile(r"customer|support agent|service agent|agent policy|desk policy|\border\b|refund", re.I)
_ANSWER_CONTRACT = re.compile(r"Answer:\s*\$", re.I)
_SEARCH_TOOLS = {"search", "retrieve", "lookup_passages"}


class ContextRouter(Router):
    """The rule of the module docstring: tool schemas first, then the system prompt, then the output contract."""

    name = "context"

    def __init__(self, fallback: str = "if"):
        self.fallback = fallback

    def route(self, context: Context) -> str:
        names = set(context.tool_names())
        if names:
            return "search" if names <= _SEARCH_TOOLS else "ecom"
        if context.system and _DESK_WORDS.search(context.system):
            return "ecom"
        if context.system and _SEARCH_WORDS.search(context.system):
            return "search"
        if _ANSWER_CONTRACT.search(context.system + "\n" + context.user):
            return "math"
        return self.fallback


_WORD = re.compile(r"[a-z0-9_$]+")


def features(text: str, n: int):
    """Hashed bag of words and bigrams (crc32 buckets), log(1 + count), L2-normalised: a float tensor (n,)."""
    import torch

    words = _WORD.findall(text.lower())
    grams = words + [a + " " + b for a, b in zip(words, words[1:])]
    v = torch.zeros(n)
    for g, c in Counter(grams).items():
        v[zlib.crc32(g.encode()) % n] += math.log1p(c)
    norm = v.norm()
    return v / norm if norm > 0 else v


class LearnedRouter(Router):
    """Multinomial logistic regression on ``features`` of ``Context.text()`` (torch, full-batch Adam with an L2
    penalty)."""

    name = "learned"

    def __init__(self, domains: Sequence[str], n_features: int, weight=None, bias=None):
        import torch

        self.domains = list(domains)
        self.n_features = int(n_features)
        self.weight = weight if weight is not None else torch.zeros(len(self.domains), self.n_features)
        self.bias = bias if bias is not None else torch.zeros(len(self.domains))

    def _x(self, contexts: Sequence[Context]):
        import torch

        return torch.stack([features(c.text(), self.n_features) for c in contexts]) if contexts else \
            torch.zeros(0, self.n_features)

    def fit(self, contexts: Sequence[Context], labels: Sequence[str], steps: int = 300, l2: float = 1e-3,
            lr: float = 0.5, seed: int = 0) -> list[float]:
        import torch

        x = self._x(contexts)
        y = torch.tensor([self.domains.index(lbl) for lbl in labels])
        g = torch.Generator().manual_seed(seed)
        w = (0.01 * torch.randn(len(self.domains), self.n_features, generator=g)).requires_grad_()
        b = torch.zeros(len(self.domains), requires_grad=True)
        opt = torch.optim.Adam([w, b], lr=lr)
        losses = []
        for _ in range(steps):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(x @ w.T + b, y) + l2 * (w * w).sum()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        self.weight, self.bias = w.detach(), b.detach()
        return losses

    def predict(self, contexts: Sequence[Context]) -> list[str]:
        if not contexts:
            return []
        logits = self._x(contexts) @ self.weight.T + self.bias
        return [self.domains[i] for i in logits.argmax(-1).tolist()]

    def route(self, context: Context) -> str:
        return self.predict([context])[0]

    def save(self, path) -> Path:
        import torch

        torch.save({"domains": self.domains, "n_features": self.n_features, "weight": self.weight,
                    "bias": self.bias}, str(path))
        return Path(path)

    @classmethod
    def load(cls, path) -> LearnedRouter:
        import torch

        d = torch.load(str(path))
        return cls(d["domains"], d["n_features"], d["weight"], d["bias"])


def router_contexts(cfg: Config, n_train: int, n_heldout: int, envs: dict | None = None):
    """Training-split contexts of every stage world: ``(train, heldout)``, each a list of ``(task id, Context,
    domain)``; held-out ids and context texts are disjoint from the training ones (duplicates dropped)."""
    envs = {} if envs is None else envs
    train, held = [], []
    for d in cfg.pipeline.curriculum:
        name = STAGE_ENV.get(d, d)
        if name not in envs:
            envs[name] = world(cfg, name)
        tasks = envs[name].tasks("train", n_train + n_heldout, seed=ROUTER_SEED + cfg.seed)
        train += [(t.id, Context.of(t), d) for t in tasks[:n_train]]
        held += [(t.id, Context.of(t), d) for t in tasks[n_train:]]
    seen_ids = {i for i, _, _ in train}
    seen_text = {c.text() for _, c, _ in train}
    held = [h for h in held if h[0] not in seen_ids and h[1].text() not in seen_text]
    return train, held


def accuracy(router: Router, items) -> float:
    if not items:
        return float("nan")
    return sum(router.route(c) == d for _, c, d in items) / len(items)


def benchmark_tasks(cfg: Config, envs: dict | None = None) -> dict[str, list]:
    """Every benchmark's evaluation tasks, as ``evaluate`` draws them."""
    envs = {} if envs is None else envs
    out = {}
    for b in BENCHMARKS.values():
        if b.env not in envs:
            envs[b.env] = world(cfg, b.env)
        out[b.key] = envs[b.env].tasks(b.split, benchmark_size(cfg, b), seed=cfg.worlds.seed)
    return out


def confusion(router: Router, tasks_by_benchmark: Mapping[str, list], domains: Sequence[str]) -> dict:
    """``{benchmark: {expert: episodes}}``: which expert each benchmark's episodes get from their first context."""
    out = {}
    for key, tasks in tasks_by_benchmark.items():
        c = Counter(router.route_task(t) for t in tasks)
        out[key] = {d: c.get(d, 0) for d in domains}
    return out


def run_router(cfg: Config):
    """Train the learned router (skipped when complete); ``router.json`` has its training and held-out accuracy
    and both routers' confusion on every benchmark."""
    m = cfg.mle

    def fn(r) -> None:
        envs: dict = {}
        train, held = router_contexts(cfg, m.router_train, m.router_heldout, envs)
        assert not {i for i, _, _ in train} & {i for i, _, _ in held}
        router = LearnedRouter(cfg.pipeline.curriculum, m.router_features)
        losses = router.fit([c for _, c, _ in train], [d for _, _, d in train], m.router_steps, m.router_l2,
                            seed=cfg.seed)
        router.save(r.path / ROUTER_FILE)
        ctx = ContextRouter(m.fallback)
        tasks = benchmark_tasks(cfg, envs)
        info = {"train": len(train), "heldout": len(held),
                "train_ids": [i for i, _, _ in train], "heldout_ids": [i for i, _, _ in held],
                "learned": {"train_accuracy": accuracy(router, train), "heldout_accuracy": accuracy(router, held),
                            "first_loss": losses[0], "last_loss": losses[-1],
                            "confusion": confusion(router, tasks, cfg.pipeline.curriculum)},
                "context": {"train_accuracy": accuracy(ctx, train), "heldout_accuracy": accuracy(ctx, held),
                            "confusion": confusion(ctx, tasks, cfg.pipeline.curriculum)}}
        r.write_json(ROUTER_JSON, info)
        r.logger.info("mle router: learned train %.3f held-out %.3f; context held-out %.3f",
                      info["learned"]["train_accuracy"], info["learned"]["heldout_accuracy"],
                      info["context"]["heldout_accuracy"])

    return run_once(router_run(cfg), fn)


def make_router(cfg: Config, kind: str) -> Router:
    if kind == "context":
        return ContextRouter(cfg.mle.fallback)
    run = router_run(cfg)
    require_complete([run], "the learned router")
    return LearnedRouter.load(run.path / ROUTER_FILE)
