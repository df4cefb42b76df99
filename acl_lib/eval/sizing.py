"""Evaluation limits sized from what the scripted experts need (``benchmarks/expert_needs.py`` prints them)."""

from __future__ import annotations

import math

from acl_lib.envs import BENCHMARKS, scripted_expert
from acl_lib.eval.harness import world


def expert_needs(cfg, tokenizer, benchmarks: list[str], turn_margin: int, token_margin: float) -> list[dict]:
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
