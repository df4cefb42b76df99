"""The stage recipe: one training stage of the curriculum (or an oracle) from an incoming checkpoint.

    summary = run_stage(cfg, "search", init_model_dir, out_dir)    # the model: <out_dir>/model

* ``cfg.pipeline.cold_start[domain]``: a rejection-sampled SFT cold start on scripted-expert trajectories
  (the study's recipe for search and e-commerce; the mini profile cold-starts every domain);
* then GRPO from the incoming (or cold-started) checkpoint on the world's verifiable reward, multi-turn with
  tool use for the tool worlds.

Every training job goes through ``launcher.launch``, so the same call runs in-process, on several processes
or on several nodes as ``cfg.launcher`` says. Layout of ``out_dir``::

    model/                      the stage's final model (atomic)
    stage.json                  recipe, inputs, demo statistics, both phases' summaries
    train_log.jsonl, train_summary.json, checkpoints/checkpoint-N     the GRPO phase
    checkpoints/sft/            the cold start: demos.jsonl, demos.json, train_log.jsonl, model/, ...

The cold start lives under ``checkpoints/`` because the run store keeps that folder when a crashed run is
restarted under the same config: a finished cold start is not redone, and GRPO resumes from its checkpoint.
This module knows nothing of the run store.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from acl_lib.atomic import atomic_dir, write_json
from acl_lib.envs import STAGE_ENV, scripted_expert
from acl_lib.train import common, sft
from acl_lib.train.launcher import launch
from acl_lib.train.trl_env import make_env

SFT_DIR = "checkpoints/sft"
logger = logging.getLogger("acl.train.stage")


def demo_tasks(env, cfg):
    """Tasks the teacher is run on: twice ``cfg.sft.num_demos`` training tasks (rejections leave room), drawn
    with a seed offset so the demos are not the GRPO tasks themselves."""
    return env.tasks("train", 2 * cfg.sft.num_demos, seed=cfg.seed + 1)


def cold_start(cfg, domain: str, init_model_dir: str, out_dir: str | Path) -> str:
    """Rejection-sampled SFT from the scripted expert into ``<out_dir>/checkpoints/sft``; returns its model dir."""
    sft_dir = Path(out_dir) / SFT_DIR
    model = sft_dir / "model"
    if model.exists():  # finished before a restart of this run (same config: the run store kept it)
        return str(model)
    env = make_env(domain, cfg)
    rows, stats = sft.collect_demos(env, scripted_expert(STAGE_ENV.get(domain, domain)), demo_tasks(env, cfg),
                                    max_turns=cfg.grpo.max_turns, num_demos=cfg.sft.num_demos)
    logger.info("cold start %s: kept %d of %d expert episodes", domain, stats["kept"], stats["tried"])
    demos = sft.write_rows(rows, sft_dir / "demos.jsonl")
    write_json(sft_dir / "demos.json", stats)
    launch(cfg, "sft", sft_dir, model_dir=str(init_model_dir), dataset=str(demos))
    return str(model)


def run_stage(cfg, domain: str, init_model_dir: str | Path, out_dir: str | Path) -> dict:
    """Train stage ``domain`` from ``init_model_dir`` into ``<out_dir>/model``; returns ``stage.json``'s content."""
    out_dir = Path(out_dir)
    start = str(init_model_dir)
    info: dict = {"domain": domain, "init_model": start, "cold_start": bool(cfg.pipeline.cold_start.get(domain))}
    if info["cold_start"]:
        start = cold_start(cfg, domain, start, out_dir)
        sft_dir = out_dir / SFT_DIR
        info["sft_model"] = start
        info["demos"] = json.loads((sft_dir / "demos.json").read_text())
        info["sft"] = json.loads((sft_dir / common.TRAIN_SUMMARY).read_text())
    if cfg.grpo.max_steps > 0:
        info["grpo"] = launch(cfg, "grpo", out_dir, model_dir=start, domain=domain)
    else:  # no RL steps: the stage's model is its starting point
        with atomic_dir(out_dir / "model") as tmp:
            shutil.copytree(start, tmp, dirs_exist_ok=True)
    write_json(out_dir / "stage.json", info)
    return info
