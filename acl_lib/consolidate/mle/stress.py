"""MLE's stress cases: the worlds' test tasks shown in ways that test the router (``stress_episodes``):
ambiguous contexts (tool schemas removed, ``ViewEpisode``; a blank system prompt), a desk that changes mid-episode
(``SwitchEpisode``) and a request that needs two skills (``TwoSkillEpisode``); scored for both routers and each
oracle (``run_stress``; ``<spec>_stress/stress.json``)."""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING

from acl_lib import pipeline
from acl_lib.consolidate.mle.routers import make_router, run_router
from acl_lib.consolidate.mle.serving import make_mle_policy
from acl_lib.consolidate.mle.specs import ROUTERS, STRESS_JSON, MLESpec, mle_run, router_run
from acl_lib.envs import BENCHMARKS, IN_DOMAIN
from acl_lib.eval.harness import PASS_EPS, run_episodes, world
from acl_lib.eval.policies import make_policy
from acl_lib.runs import Run, run_once
from acl_lib.seeding import seed_and_threads
from acl_lib.steps import require_complete

if TYPE_CHECKING:
    from acl_lib.config import Config


class ViewEpisode:
    """An episode shown to the policy with another task view (``shown``: tools removed, a blank system prompt),
    scored by the inner episode on the real task."""

    def __init__(self, inner, shown):
        self.inner, self.task = inner, shown
        if not shown.system_prompt and inner.messages and inner.messages[0].get("role") == "system":
            del inner.messages[0]  # the conversation the policy sees opens without the system prompt

    messages = property(lambda self: self.inner.messages)
    done = property(lambda self: self.inner.done)
    failure = property(lambda self: self.inner.failure)
    turns = property(lambda self: self.inner.turns)

    def step(self, text):
        return self.inner.step(text)

    def end(self, reason=None):
        self.inner.end(reason)

    def reward(self):
        return self.inner.reward()


class SwitchEpisode:
    """After ``k`` assistant turns in episode ``a`` (or when it ends), the conversation continues in another
    desk: the system prompt and tool schemas become ``b``'s, ``b``'s user opening follows the turns so far, and
    ``b`` scores the episode. ``messages`` stays one list object (the policy keys episodes on it)."""

    def __init__(self, a, b, k: int):
        self.a, self.b, self.k = a, b, k
        self.messages = list(a.messages)
        self.switched = False
        self.history: list[dict] = []

    @property
    def cur(self):
        return self.b if self.switched else self.a

    task = property(lambda self: self.cur.task)
    done = property(lambda self: self.switched and self.b.done)
    turns = property(lambda self: self.a.turns + self.b.turns)

    @property
    def failure(self):
        return self.b.failure

    def _sync(self):
        if self.switched:
            sys_b = [m for m in self.b.messages if m.get("role") == "system"]
            rest_b = [m for m in self.b.messages if m.get("role") != "system"]
            self.messages[:] = sys_b + self.history + rest_b
        else:
            self.messages[:] = self.a.messages

    def step(self, text):
        obs = self.cur.step(text)
        if not self.switched and (self.a.done or self.a.turns >= self.k):
            self.switched = True
            self.history = [m for m in self.a.messages if m.get("role") != "system"]
        self._sync()
        return obs

    def end(self, reason=None):
        if not self.switched:
            self.switched = True
            self.history = [m for m in self.a.messages if m.get("role") != "system"]
        self.b.end(reason)
        self._sync()

    def reward(self):
        return self.b.reward()


_NUMBER = re.compile(r"-?\d+")


class TwoSkillEpisode:
    """A retail desk episode whose customer also asks for a sum: it passes when the desk task passes and one
    assistant turn states the sum's value."""

    def __init__(self, inner, value: int):
        self.inner, self.value = inner, value
        self.task = inner.task

    messages = property(lambda self: self.inner.messages)
    done = property(lambda self: self.inner.done)
    turns = property(lambda self: self.inner.turns)

    @property
    def failure(self):
        return self.inner.failure or ("the sum is missing" if not self.stated() else None)

    def stated(self) -> bool:
        return any(str(self.value) in _NUMBER.findall(m.get("content") or "")
                   for m in self.inner.messages if m.get("role") == "assistant")

    def step(self, text):
        return self.inner.step(text)

    def end(self, reason=None):
        self.inner.end(reason)

    def reward(self):
        return self.inner.reward() * float(self.stated())


def stress_episodes(cfg: Config) -> dict[str, tuple[str, list]]:
    """The stress benchmarks, built from the worlds' test tasks (``mle.stress_tasks`` episodes each):
    ``ambiguous_<d>_no_tools`` / ``ambiguous_<d>_no_system`` (each stage world with its tool schemas removed, or
    its system prompt blanked), ``switch_search_to_ecom`` / ``switch_ecom_to_search`` (the desk changes after
    ``mle.switch_turn`` turns; ``reroute`` is the policy's, recorded), ``two_skills`` (a retail task whose
    customer also asks for a sum). Returns ``{case: (benchmark whose turn budget it runs with, episodes)}``."""
    m = cfg.mle
    n = m.stress_tasks
    envs: dict = {}

    def env_of(key):
        b = BENCHMARKS[key]
        if b.env not in envs:
            envs[b.env] = world(cfg, b.env)
        return envs[b.env], b

    def tasks(key, k=n, offset=0):
        env, b = env_of(key)
        return env.tasks(b.split, k + offset, seed=cfg.worlds.seed + 1)[offset:]

    out: dict[str, list] = {}
    for d in cfg.pipeline.curriculum:
        key = IN_DOMAIN[d]
        env, b = env_of(key)
        lim = cfg.eval.limits_for(key)[0]
        out[f"ambiguous_{d}_no_tools"] = (key, [ViewEpisode(env.start(t, max_turns=lim), replace(t, tools=[]))
                                                 for t in tasks(key)])
        out[f"ambiguous_{d}_no_system"] = (key, [ViewEpisode(env.start(t, max_turns=lim),
                                                             replace(t, system_prompt="")) for t in tasks(key)])
    for a, b in (("nq", "retail"), ("retail", "nq")):
        ea, _ = env_of(a)
        eb, _ = env_of(b)
        la, lb = cfg.eval.limits_for(a)[0], cfg.eval.limits_for(b)[0]
        name = f"switch_{BENCHMARKS[a].domain}_to_{BENCHMARKS[b].domain}"
        out[name] = (b, [SwitchEpisode(ea.start(ta, max_turns=la), eb.start(tb, max_turns=lb), m.switch_turn)
                         for ta, tb in zip(tasks(a), tasks(b, offset=n))])
    er, _ = env_of("retail")
    rng = random.Random(f"mle-two-skills:{cfg.seed}")
    two = []
    for t in tasks("retail"):
        x, y, z = rng.randint(10, 99), rng.randint(10, 99), rng.randint(2, 9)
        ask = f" Also, I need a quick sum for my budget: what is {x} + {y} * {z}? Please tell me the number."
        t2 = replace(t, user_prompt=t.user_prompt + ask)
        two.append(TwoSkillEpisode(er.start(t2, max_turns=cfg.eval.limits_for("retail")[0]), x + y * z))
    out["two_skills"] = ("retail", two)
    return out


def stress_scores(cfg: Config, policy, reroute: bool = False) -> dict:
    """Pass rate (%) of ``policy`` on every stress benchmark, and (for a routed policy) the experts it chose."""
    cases = stress_episodes(cfg)
    out = {}
    for name, (key, eps) in cases.items():
        max_new = cfg.eval.limits_for(key)[1]
        if hasattr(policy, "max_new_tokens"):
            policy.max_new_tokens = max_new
        before = len(getattr(policy, "route_log", []))
        run_episodes(policy, eps, batch_size=max(cfg.eval.batch_size, 1) * 4)
        passed = [ep.reward() >= 1.0 - PASS_EPS for ep in eps]
        row = {"score": 100.0 * sum(passed) / max(1, len(passed)), "n": len(eps), "reroute": reroute,
               "failures": dict(Counter((ep.failure or "").split(":")[0][:80] for ep in eps if ep.failure))}
        log = getattr(policy, "route_log", None)
        if log is not None:
            row["routes"] = [f"{d} ({how})" for d, how in log[before:]]
        out[name] = row
    return out


def stress_run(cfg: Config, spec: MLESpec, oracles: bool, reroute: bool):
    inputs = [mle_run(cfg, spec)]
    if spec.router != "learned":
        inputs.append(router_run(cfg))
    if oracles:
        inputs += [pipeline.oracle_run(cfg, d) for d in cfg.pipeline.curriculum]
    extra = {"spec": spec.name, "n": cfg.mle.stress_tasks, "k": cfg.mle.switch_turn, "reroute": reroute}
    return Run(cfg, f"{spec.name}_stress", sections=("worlds", "eval"), inputs=inputs, extra=extra)


def run_stress(cfg: Config, spec: MLESpec, oracles: bool = True, reroute: bool = False) -> dict:
    """Both routers (context, learned; the switch cases with and without re-routing) and, with ``oracles``, each
    ``oracle_<d>`` on the stress benchmarks; ``<spec>_stress/stress.json``."""
    run_router(cfg)
    run = stress_run(cfg, spec, oracles, reroute)
    require_complete(run.inputs, "the MLE stress cases")

    def fn(r) -> None:
        res: dict = {}
        for kind in ROUTERS:
            for rr in ((False, True) if kind == "context" else (reroute,)):
                seed_and_threads(cfg.seed, cfg.torch_threads)
                policy = make_mle_policy(cfg, spec, make_router(cfg, kind), reroute=rr)
                try:
                    res[f"mle_{kind}" + ("_reroute" if rr else "")] = stress_scores(cfg, policy, rr)
                finally:
                    policy.close()
        if oracles:
            for d in cfg.pipeline.curriculum:
                seed_and_threads(cfg.seed, cfg.torch_threads)
                policy = make_policy(str(pipeline.model_dir(pipeline.oracle_run(cfg, d))), cfg)
                try:
                    res[f"oracle_{d}"] = stress_scores(cfg, policy)
                finally:
                    policy.close()
        r.write_json(STRESS_JSON, res)

    run_once(run, fn)
    return run.read_json(STRESS_JSON)
