"""Mid-training (phase 3 of the small base): the four domains' expert transcripts with assistant-only loss.

    rows, stats = midtrain_demos(cfg)                       # the mixture, from worlds of other seeds
    summary = train_midtrain(cfg, model_dir, out_dir)       # SFT into <out_dir>/model

A modern base such as Qwen3-8B-Base has seen math solutions, tool calls, customer-service dialogues and
instruction-following data during its mid-training, so RL *elicits* skills it already has. The mini base imitates
that: after the copy warm-up and the corpus (``acl_lib.train.pretrain``), it is trained on rejection-sampled
scripted-expert transcripts of the four training worlds (``pretrain.midtrain_demos`` episodes per domain), drawn
from worlds built with the seeds ``pretrain.world_seeds`` (never ``worlds.seed``, the evaluated world), with the
loss on assistant tokens only, as the stages' cold starts train. The mixture and its budget
(``pretrain.midtrain_*``) are the knobs that set how competent the base is: enough to score on every in-domain
benchmark, far enough below its oracle that the stages have something to elicit.

**No evaluated task leaks in.** Worlds of other seeds hold other entities (customers, orders, documents); tasks
drawn from a small space (a math problem on digits, an instruction template) may still coincide with an
evaluated one by chance, so every candidate task whose prompt equals a prompt of the evaluated world's test
split (``evaluated_prompts``) is dropped before the expert plays it; ``stats["dropped_as_evaluated"]`` counts
them.

Writes into ``out_dir``: ``demos.jsonl`` and ``demos.json`` (the rows and their statistics per domain and world),
then ``train_sft``'s ``train_log.jsonl``, ``train_summary.json``, ``checkpoints/`` (resumed from) and ``model/``.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

from acl_lib.atomic import write_json
from acl_lib.config import Config
from acl_lib.envs import BENCHMARKS, STAGE_ENV, make_env, scripted_expert
from acl_lib.train import common, sft

logger = logging.getLogger("acl.train.midtrain")

# Task seeds of the mid-training draw, offset from those the corpus (acl_lib.model.corpus) and the cold starts use.
TASK_SEED_OFFSET = 5000


def enabled(cfg: Config) -> bool:
    """Whether the recipe has a mid-training phase (some demos and some steps)."""
    p = cfg.pretrain
    return p.midtrain_steps > 0 and sum(p.midtrain_demos.values()) > 0


def evaluated_prompts(cfg: Config) -> set[str]:
    """The user prompts of every task the suite scores on the evaluated world (``worlds.seed``): each in-domain
    and out-of-domain benchmark's test tasks, drawn as the harness draws them."""
    from acl_lib.eval.harness import benchmark_size, world  # the harness's own draw, not a copy of it

    prompts: set[str] = set()
    envs: dict[str, object] = {}
    for bench in BENCHMARKS.values():
        try:
            env = envs.setdefault(bench.env, world(cfg, bench.env))
        except (FileNotFoundError, ValueError):  # a real-data benchmark without its files (paper profile)
            continue
        prompts.update(t.user_prompt for t in env.tasks(bench.split, benchmark_size(cfg, bench), seed=cfg.worlds.seed))
    return prompts


def midtrain_demos(cfg: Config) -> tuple[list[dict], dict]:
    """``(rows, stats)``: ``pretrain.midtrain_demos[d]`` expert episodes of each domain ``d`` (rejection-sampled:
    reward 1, no protocol error), split evenly over the worlds of ``pretrain.world_seeds``, shuffled."""
    p = cfg.pretrain
    seeds = list(p.world_seeds)
    if not seeds:
        raise ValueError("pretrain.world_seeds is empty: mid-training needs worlds to draw from")
    if cfg.worlds.seed in seeds:
        raise ValueError(f"pretrain.world_seeds {seeds} contains the evaluated world's seed {cfg.worlds.seed}")
    banned = evaluated_prompts(cfg)
    rows: list[dict] = []
    stats: dict = {"world_seeds": seeds, "domains": {}}
    for domain, total in p.midtrain_demos.items():
        if total <= 0:
            continue
        name = STAGE_ENV[domain]
        dstats = {"kept": 0, "tried": 0, "dropped_as_evaluated": 0, "rejected": {}}
        for i, s in enumerate(seeds):
            want = total // len(seeds) + (1 if i < total % len(seeds) else 0)
            if want == 0:
                continue
            # the evaluated world's shape, another seed; IF on the wide vocabulary: words no world's train pool holds
            options = {"vocab": p.midtrain_if_vocab} if name == "instruct" else {}
            env = make_env(name, cfg.pretraining_worlds(), seed=s, **options)
            drawn = env.tasks("train", 2 * want, seed=s + TASK_SEED_OFFSET + cfg.seed)
            tasks = [t for t in drawn if t.user_prompt not in banned]
            dstats["dropped_as_evaluated"] += len(drawn) - len(tasks)
            got, st = sft.collect_demos(env, scripted_expert(name), tasks, max_turns=p.max_turns, num_demos=want)
            rows += got
            dstats["kept"] += st["kept"]
            dstats["tried"] += st["tried"]
            for reason, n in st["rejected"].items():
                dstats["rejected"][reason] = dstats["rejected"].get(reason, 0) + n
        stats["domains"][domain] = dstats
    random.Random(cfg.seed * 7919 + 41).shuffle(rows)
    stats["rows"] = len(rows)
    return rows, stats


def midtrain_config(cfg: Config) -> Config:
    """``cfg`` with its ``sft`` section set to the mid-training's budget (the SFT trainer reads ``cfg.sft``). Batches
    are grouped by length (``train_midtrain``), so the retail rows meet in batches and their common ~1.9k-token
    opening (policy, tool schemas) is encoded once per batch (``sft.share_prefix``)."""
    p = cfg.pretrain
    tree = cfg.to_dict()
    tree["sft"].update(max_steps=p.midtrain_steps, batch_size=p.midtrain_batch_size, learning_rate=p.midtrain_lr,
                       max_length=p.midtrain_max_length, share_prefix=True)
    return Config.model_validate(tree)


def train_midtrain(cfg: Config, model_dir: str | Path, out_dir: str | Path) -> dict:
    """Mid-train the model in ``model_dir`` into ``<out_dir>/model``; returns the SFT summary with the demos'
    statistics under ``demos``. A restart resumes the SFT from its last checkpoint (the demos are redrawn: the
    draw is deterministic)."""
    out_dir = Path(out_dir)
    rows, stats = midtrain_demos(cfg)
    logger.info("mid-training: %d expert episodes (%s)", len(rows),
                {d: s["kept"] for d, s in stats["domains"].items()})
    if common.is_main_process():
        sft.write_rows(rows, out_dir / "demos.jsonl")
        write_json(out_dir / "demos.json", stats)
    summary = sft.train_sft(midtrain_config(cfg), model_dir, rows, out_dir, by_length=True)
    summary["demos"] = stats
    return common.write_summary_main(summary, out_dir)


def read_demos(out_dir: str | Path) -> list[dict]:
    """The rows a mid-training wrote (``demos.jsonl``)."""
    path = Path(out_dir) / "demos.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no mid-training demos at {path}")
    return sft.read_rows(path)
