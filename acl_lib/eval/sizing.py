"""How big an evaluation is: what one will do before it starts, and limits sized from what the experts need.

``evaluation_estimate`` / ``format_estimate``: per benchmark the episodes and the tokens one evaluation under a
config may generate, and its hours at ``eval.tokens_per_s`` (logged before each pipeline evaluation).
``expert_needs``: the turns and tokens the scripted experts need per benchmark, and the evaluation limits that follow
(``benchmarks/expert_needs.py`` prints them).
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

from acl_lib.envs import BENCHMARKS, benchmarks_for, scripted_expert
from acl_lib.eval.harness import benchmark_size, sampling_plan, world

if TYPE_CHECKING:
    from acl_lib.config import Config

_TASK_COUNTS: dict[tuple[str, str], int] = {}  # evaluation_estimate's, per (settings, benchmark)


def evaluation_estimate(cfg: Config, benchmarks: list[str] | None = None, history: dict | None = None) -> dict:
    """What one evaluation under ``cfg`` will do, before it starts: per benchmark the episodes (tasks x k) and the
    tokens it may generate, and the whole run's time at ``eval.tokens_per_s`` per shard (``eval.shards`` of them).

    Tokens per episode come from ``history`` (an earlier evaluation's ``metrics.json`` in the same store: its
    generated tokens per episode of that benchmark) where it has them, else from the caps (every turn to
    ``max_new_tokens``, ``max_turns`` turns: an upper bound, often far above what a model writes). Retrieval,
    tool and simulator time are not in it."""
    benches = [BENCHMARKS[b] for b in benchmarks] if benchmarks else benchmarks_for(cfg.eval.suites)
    sampling = sampling_plan(cfg, benches)
    envs: dict[str, object] = {}
    rows = {}
    # the task counts depend on the worlds and eval settings only: drawn once per process, not per evaluation
    settings = json.dumps([cfg.worlds.model_dump(mode="json"), cfg.eval.model_dump(mode="json")], sort_keys=True)
    for b in benches:
        key = (settings, b.key)
        try:
            if key not in _TASK_COUNTS:
                env = envs.setdefault(b.env, world(cfg, b.env))
                _TASK_COUNTS[key] = len(env.tasks(b.split, benchmark_size(cfg, b), seed=cfg.worlds.seed))
            n = _TASK_COUNTS[key]
        except (FileNotFoundError, ValueError) as exc:  # the data is not there yet: the estimate says so
            rows[b.key] = {"episodes": None, "tokens": None, "basis": f"no tasks ({exc})"}
            continue
        episodes = n * sampling[b.key][0]
        max_turns, max_new_tokens = cfg.eval.limits_for(b.key)
        seen = (history or {}).get("generated_tokens_by_benchmark", {}).get(b.key)
        seen_eps = ((history or {}).get("n_tasks", {}).get(b.key) or 0) * \
            ((history or {}).get("k_by_benchmark", {}).get(b.key) or 0)
        if seen is not None and seen_eps:
            per, basis = seen / seen_eps, "measured"
        else:
            per, basis = max_turns * max_new_tokens, "cap"
        rows[b.key] = {"episodes": episodes, "tokens": int(episodes * per), "basis": basis}
    total = sum(r["tokens"] or 0 for r in rows.values())
    rate = cfg.eval.tokens_per_s * cfg.eval.shards
    return {"benchmarks": rows, "episodes": sum(r["episodes"] or 0 for r in rows.values()), "tokens": total,
            "shards": cfg.eval.shards, "tokens_per_s": cfg.eval.tokens_per_s,
            "hours": total / rate / 3600 if rate else None,
            "upper_bound": any(r["basis"] == "cap" for r in rows.values())}


def format_estimate(est: dict) -> str:
    """One paragraph for the log: episodes, tokens (measured or capped), the hours at the configured rate."""
    parts = []
    for key, r in est["benchmarks"].items():
        if r["episodes"] is None:
            parts.append(f"{key}: {r['basis']}")
        else:
            parts.append(f"{key} {r['episodes']:,} episodes ~{r['tokens'] / 1e6:.2f}M tokens"
                         + (" (caps)" if r["basis"] == "cap" else ""))
    head = (f"evaluation estimate: {est['episodes']:,} episodes, "
            f"{'at most ' if est['upper_bound'] else '~'}{est['tokens'] / 1e6:.1f}M generated tokens")
    if est["hours"] is not None:
        head += (f", {'at most ' if est['upper_bound'] else '~'}{est['hours']:.1f} h at {est['tokens_per_s']:,.0f} "
                 f"tokens/s on each of {est['shards']} shard(s) (generation only: retrieval and simulated customers "
                 "come on top)")
    return head + ". " + "; ".join(parts)


def expert_needs(cfg: Config, tokenizer, benchmarks: list[str], turn_margin: int, token_margin: float) -> list[dict]:
    """Per benchmark: the scripted expert driven through the tasks the evaluator scores, with no limit that binds
    (64 turns); its assistant turns per episode and the tokens of each turn (+ 1 for the end-of-turn token a
    model must also write), and the limits that follow: the longest episode plus ``turn_margin`` turns, the
    longest turn times (1 + ``token_margin``), rounded up."""
    rows, envs = [], {}
    for key in benchmarks:
        b = BENCHMARKS[key]
        env = envs.setdefault(b.env, world(cfg, b.env))
        expert = scripted_expert(b.env)
        n = cfg.worlds.n_test if b.suite == "in_domain" else cfg.worlds.n_ood
        turns, tokens, passed = [], [], 0
        for task in env.tasks(b.split, n, seed=cfg.worlds.seed):
            ep, said = env.start(task, max_turns=64), []
            while not ep.done:
                said.append(expert(task, ep.messages))  # the raw text a model would have to write
                ep.step(said[-1])
            passed += ep.reward() >= 1.0
            turns.append(len(said))
            tokens += [len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1 for text in said]
        tokens.sort()
        rows.append({
            "benchmark": key, "episodes": len(turns), "expert_pass": passed, "max_turns": max(turns),
            "max_tokens": tokens[-1], "p99_tokens": tokens[min(len(tokens) - 1, int(0.99 * len(tokens)))],
            "limit_turns": max(turns) + turn_margin, "limit_tokens": math.ceil(tokens[-1] * (1 + token_margin)),
        })
    return rows
