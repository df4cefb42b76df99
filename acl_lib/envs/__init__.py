"""The environments and the benchmark registry.

Every benchmark key of ``paper_results.yaml`` maps to one environment and one of its splits; the mini
counterparts use the same keys, so every table lines up. Which domain each environment and benchmark belongs to
is the study's table in ``acl_lib.domains``; ``STAGE_ENV``, ``IN_DOMAIN`` and ``BENCHMARKS`` are views of it.
Environment modules are imported lazily (``ENVIRONMENTS``, a registry of ``"module:Class"``: some build corpora
or indexes on construction).

Modules: ``base`` (Task, Episode, Environment, tool-call plumbing); one environment per domain:
``math`` (+ ``mcq``), ``search`` (+ ``retrievers``), ``instruct`` (+ ``ifeval_checks``, ``instruct_ood``),
``retail`` (+ ``retail_db``), ``telecom`` (+ ``tau2_telecom`` and ``tau2_phone``: tau2's real telecom domain,
the paper profile's), ``mock``; the three tool desks share ``desk`` (episode loop, toolkit, gold replay) and
``usersim`` (the rule-based simulated user); the real tau2 tasks' customer is the LLM user simulator of
``llm_user`` (with the phone's tools in telecom).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from acl_lib import domains

# environment name -> "module:Class"
ENVIRONMENTS = {
    "math": "acl_lib.envs.math:MathEnv",
    "search": "acl_lib.envs.search:SearchEnv",
    "retail": "acl_lib.envs.retail:RetailEnv",
    "instruct": "acl_lib.envs.instruct:InstructEnv",
    "mock": "acl_lib.envs.mock:MockEnv",
    "telecom": "acl_lib.envs.telecom:TelecomEnv",
}

# The study's names for its domains live in acl_lib.domains; these are views of that table.
STAGE_ENV = domains.STAGE_ENV  # training stage (config.DOMAINS) -> environment name
IN_DOMAIN = domains.IN_DOMAIN  # training stage -> its in-domain benchmark


@dataclass(frozen=True)
class Benchmark:
    key: str  # paper_results.yaml key
    env: str  # ENVIRONMENTS key
    split: str  # the environment's split
    suite: str  # "in_domain" or "ood"
    domain: str  # the stage whose skill it measures: math, search, ecom, if


# Where each out-of-domain benchmark is played: (environment, split). An in-domain benchmark is the test split of
# its domain's environment.
_OOD_PLAYED_ON = {
    "gpqa": ("math", "gpqa"),
    "mmlu_redux": ("math", "mmlu_redux"),
    "single_hop": ("search", "single_hop"),
    "multi_hop": ("search", "multi_hop"),
    "telecom": ("telecom", "test"),
    "mock": ("mock", "test"),
    "ifbench": ("instruct", "ifbench"),
}


def _benchmark(key: str, stage: str) -> Benchmark:
    d = domains.BY_STAGE[stage]
    if key == d.in_domain:
        return Benchmark(key, d.env, "test", "in_domain", stage)
    return Benchmark(key, *_OOD_PLAYED_ON[key], "ood", stage)


# In the tables' order: the in-domain benchmarks in the study's order, then each domain's OOD ones.
BENCHMARKS: dict[str, Benchmark] = {key: _benchmark(key, stage) for key, stage in domains.BENCHMARK_DOMAIN.items()}


def benchmarks_for(suites: str = "all") -> list[Benchmark]:
    """Benchmarks of ``suites``: ``in_domain``, ``ood`` or ``all`` (in the registry's order)."""
    if suites not in ("in_domain", "ood", "all"):
        raise ValueError(f"suites must be in_domain, ood or all, got {suites!r}")
    return [b for b in BENCHMARKS.values() if suites == "all" or b.suite == suites]


def env_class(name: str):
    if name not in ENVIRONMENTS:
        raise KeyError(f"unknown environment '{name}'; environments are {sorted(ENVIRONMENTS)}")
    module, cls = ENVIRONMENTS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def make_env(name: str, worlds=None, seed: int = 0, **options):
    """Instantiate environment ``name`` for a world config and a world seed; ``options`` go to its constructor
    (``instruct``'s ``vocab``), which checks them."""
    return env_class(name)(worlds, seed=seed, **options)


def scripted_expert(name: str):
    """The module-level ``scripted_expert(task, messages) -> str`` of environment ``name``."""
    module = ENVIRONMENTS[name].split(":")[0]
    return importlib.import_module(module).scripted_expert
