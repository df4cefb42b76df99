"""The stage recipe: one training stage of the curriculum (or an oracle) from an incoming checkpoint.

    run_stage(cfg, "search", init_model_dir, run)    # -> run.path / "model"

* math, if: GRPO from the incoming checkpoint on the world's verifiable reward.
* search, ecom (``cfg.pipeline.cold_start[domain]``): a rejection-sampled SFT cold start on scripted-expert
  trajectories, then GRPO with multi-turn tool use from the SFT model.

Every training job goes through ``launcher.launch``, so the same call runs in-process, on several processes
or on several nodes as ``cfg.launcher`` says. Layout of the run directory::

    model/                      the stage's final model (atomic)
    stage.json                  recipe, inputs, demo statistics, both phases' summaries
    train_log.jsonl, train_summary.json, checkpoints/checkpoint-N     the GRPO phase
    checkpoints/sft/            the cold start: demos.jsonl, demos.json, train_log.jsonl, model/, ...

The cold start lives under ``checkpoints/`` because the run store keeps that folder when a crashed run is
restarted under the same config: a finished cold start is not redone, and GRPO resumes from its checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from acl_lib.train import common

SFT_DIR = "checkpoints/sft"


def demo_tasks(env, cfg):
    """Tasks the teacher is run on: twice ``cfg.sft.num_demos`` training tasks (rejections leave room), drawn
    with a seed offset so the demos are not the GRPO tasks themselves."""
    return env.tasks("train", 2 * cfg.sft.num_demos, seed=cfg.seed + 1)


def cold_start(cfg, domain: str, init_model_dir: str, run) -> str:
    """Rejection-sampled SFT from the scripted expert; returns the SFT model directory."""
    from acl_lib.envs import STAGE_ENV, scripted_expert
    from acl_lib.train import sft
    from acl_lib.train.launcher import launch
    from acl_lib.train.trl_env import make_env

    sft_run = common.pinned_run(cfg, f"{run.name}/{SFT_DIR}", run.config_hash, Path(run.path) / SFT_DIR)
    model = Path(sft_run.path) / "model"
    if model.exists():  # finished before a restart of this run (same config: the run store kept it)
        return str(model)
    env = make_env(domain, cfg)
    rows, stats = sft.collect_demos(env, scripted_expert(STAGE_ENV.get(domain, domain)), demo_tasks(env, cfg),
                                    max_turns=cfg.eval.max_turns, num_demos=cfg.sft.num_demos)
    run.logger.info("cold start %s: kept %d of %d expert episodes", domain, stats["kept"], stats["tried"])
    demos = sft.write_rows(rows, Path(sft_run.path) / "demos.jsonl")
    sft_run.write_json("demos.json", stats)
    launch(cfg, "sft", sft_run, model_dir=str(init_model_dir), dataset=str(demos))
    return str(model)


def run_stage(cfg, domain: str, init_model_dir: str | Path, run) -> Path:
    """Train stage ``domain`` from ``init_model_dir`` into ``run``; returns ``run.path / "model"``."""
    from acl_lib.train.launcher import launch

    start = str(init_model_dir)
    info: dict = {"domain": domain, "init_model": start, "cold_start": bool(cfg.pipeline.cold_start.get(domain))}
    if info["cold_start"]:
        start = cold_start(cfg, domain, start, run)
        sft_dir = Path(run.path) / SFT_DIR
        info["sft_model"] = start
        info["demos"] = json.loads((sft_dir / "demos.json").read_text())
        info["sft"] = json.loads((sft_dir / common.TRAIN_SUMMARY).read_text())
    if cfg.grpo.max_steps > 0:
        launch(cfg, "grpo", run, model_dir=start, domain=domain)
        info["grpo"] = json.loads((Path(run.path) / common.TRAIN_SUMMARY).read_text())
    else:  # no RL steps: the stage's model is its starting point
        with run.atomic_dir("model") as tmp:
            shutil.copytree(start, tmp, dirs_exist_ok=True)
    run.write_json("stage.json", info)
    return Path(run.path) / "model"
