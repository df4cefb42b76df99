"""The stage recipe: one training stage of the curriculum (or an oracle) from an incoming checkpoint.

    summary = run_stage(cfg, "search", init_model_dir, out_dir)    # the model: <out_dir>/model

* ``cfg.pipeline.cold_start[domain]``: a rejection-sampled SFT cold start (the study's recipe for search and
  e-commerce; the mini profile cold-starts every domain) on trajectories of the teacher ``cfg.sft.teacher``
  (``cold_start_demos``): the world's scripted expert (smoke, mini), or a model sampled ``sft.samples_per_task``
  times per task at ``sft.teacher_temperature`` / ``teacher_top_p`` with the stage's turn limits
  (``grpo.max_turns``, ``grpo.max_new_tokens``): the base checkpoint (``base``; the paper profile), the stage's
  incoming checkpoint (``incoming``), a model directory or hub id, or a model an OpenAI-compatible endpoint serves
  (``sft.teacher_url``). An episode is kept when it scores 1 with no protocol error and is not a duplicate of a
  sample of the same task kept before it (``sft.assistant_text`` equal: the assistant turns' text and tool calls,
  lowercased, whitespace collapsed). ``demos.json`` says who the teacher was and counts tried / kept / duplicates /
  rejections by reason; when nothing is kept the stage fails (``ColdStartError``) before any training. With
  ``sft.stop_at_well_formed`` the cold start stops at a criterion fixed in advance, the study's "so the model learns
  tool syntax": the first check (every ``sft.stop_check_every`` steps) where that share of greedy episodes on
  ``sft.stop_check_tasks`` held-out training tasks (``check_tasks``) make tool calls, none malformed;
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
from typing import TYPE_CHECKING

from acl_lib.atomic import atomic_dir, write_json
from acl_lib.config import ConfigError, project_root
from acl_lib.envs import STAGE_ENV, scripted_expert
from acl_lib.eval.endpoint import EndpointPolicy
from acl_lib.eval.harness import model_dir_problem
from acl_lib.eval.policies import make_policy
from acl_lib.model import base_checkpoint
from acl_lib.processes import call_in_child
from acl_lib.progress import Progress
from acl_lib.seeding import seed_everything
from acl_lib.train import common, sft
from acl_lib.train.launcher import launch
from acl_lib.train.trl_env import make_env

if TYPE_CHECKING:
    from acl_lib.config import Config

SFT_DIR = "checkpoints/sft"
MIN_CHECK_TASKS = 8  # held-out tasks the stopping check needs at least (check_tasks)
logger = logging.getLogger("acl.train.stage")


def demo_tasks(env, cfg: Config):
    """Tasks the teacher is run on: twice ``cfg.sft.num_demos`` training tasks (rejections leave room), drawn
    with a seed offset so the demos are not the GRPO tasks themselves."""
    return env.tasks("train", 2 * cfg.sft.num_demos, seed=cfg.seed + 1)


def check_tasks(env, cfg: Config, demos: list) -> list:
    """The held-out training tasks the cold start's stopping criterion is checked on (``sft.stop_at_well_formed``):
    ``sft.stop_check_tasks`` training tasks drawn with another seed offset, none of them a task the teacher was run
    on. Empty when the criterion is off or the world's tasks have no tools (nothing to check: ``max_steps`` rules).
    A small real training split the teacher used whole (tau2 retail: 74 tasks) leaves fewer: the check runs on
    what is left if that is at least ``MIN_CHECK_TASKS``, and is off otherwise (a warning says which)."""
    s = cfg.sft
    if s.stop_at_well_formed <= 0:
        return []
    seen = {t.id for t in demos}
    pool = [t for t in env.tasks("train", s.stop_check_tasks + len(seen), seed=cfg.seed + 2) if t.id not in seen]
    if pool and not pool[0].tools:
        return []
    if len(pool) < s.stop_check_tasks:
        use = len(pool) >= MIN_CHECK_TASKS
        logger.warning("cold start of %s: only %d training tasks are not demos' (sft.stop_check_tasks=%d): %s",
                       env.name, len(pool), s.stop_check_tasks,
                       "the stopping check runs on those" if use else
                       f"too few to check on (fewer than {MIN_CHECK_TASKS}): the cold start trains its max_steps")
        return pool if use else []
    return pool[: s.stop_check_tasks]


class ColdStartError(RuntimeError):
    """Rejection sampling kept no demo: the cold start has nothing to train on."""


def teacher_model(cfg: Config, init_model_dir: str) -> str:
    """The model a model teacher (``sft.teacher`` other than ``expert``) samples from: the base checkpoint
    (``base``), the stage's incoming checkpoint (``incoming``), or ``sft.teacher`` itself (a directory, relative
    ones taken from the checkout, or a hub id; with ``sft.teacher_url`` the served model's name)."""
    t = cfg.sft.teacher
    if t == "base":
        return str(base_checkpoint(cfg))
    if t == "incoming":
        return str(init_model_dir)
    local = project_root() / t
    return str(local) if not cfg.sft.teacher_url and not Path(t).is_absolute() and local.is_dir() else t


def teacher_policy(cfg: Config, model: str):
    """A batched policy sampling ``model`` with the teacher's settings and the stage's turn budget: an
    ``EndpointPolicy`` with ``sft.teacher_url`` (one request per episode's turn, ``eval.batch_size`` in flight),
    else the evaluator's model policy (``HFPolicy``, or ``VLLMPolicy`` where ``eval.backend`` is vllm)."""
    s = cfg.sft
    if s.teacher_url:
        return EndpointPolicy(s.teacher_url, model, s.teacher_api_key_env, s.teacher_temperature, s.teacher_top_p,
                              cfg.grpo.max_new_tokens, concurrency=cfg.eval.batch_size)
    problem = model_dir_problem(model)
    if problem:
        raise ConfigError(f"sft.teacher={s.teacher!r}: {problem.removeprefix(f'--model {model}: ')} ({model})")
    return make_policy(model, cfg, max_new_tokens=cfg.grpo.max_new_tokens, temperature=s.teacher_temperature,
                       top_p=s.teacher_top_p)


def cold_start_demos(cfg: Config, domain: str, init_model_dir: str, env=None, tasks=None) -> tuple[list[dict], dict]:
    """The cold start's rows and ``demos.json``'s statistics: ``sft.collect_demos`` over ``demo_tasks`` with the
    teacher of ``cfg.sft.teacher`` (the module docstring), plus who the teacher was and how it sampled. ``env`` /
    ``tasks``: the domain's world and its demo tasks, where the caller has built them already."""
    s = cfg.sft
    env = env if env is not None else make_env(domain, cfg)
    tasks = tasks if tasks is not None else demo_tasks(env, cfg)
    if s.teacher == "expert":
        rows, stats = sft.collect_demos(env, scripted_expert(STAGE_ENV.get(domain, domain)), tasks,
                                        max_turns=cfg.grpo.max_turns, num_demos=s.num_demos, dedup=True)
        return rows, {"teacher": "expert", "source": "the scripted expert", "teacher_model": None, **stats}
    model = teacher_model(cfg, init_model_dir)
    if cfg.launcher.eval_subprocess and not s.teacher_url:
        # a local teacher's engine in a process of its own: its GPU memory is free when the SFT job starts
        rows, stats = call_in_child(_sampled_demos, cfg, domain, model)
    else:
        rows, stats = _sampled_demos(cfg, domain, model, env, tasks)
    if s.teacher_url:
        source = f"{model} served at {s.teacher_url}"
    else:
        source = f"the {s.teacher} checkpoint {model}" if s.teacher in ("base", "incoming") else model
    return rows, {"teacher": s.teacher, "source": source, "teacher_model": model, "teacher_url": s.teacher_url,
                  "temperature": s.teacher_temperature, "top_p": s.teacher_top_p,
                  "max_new_tokens": cfg.grpo.max_new_tokens, **stats}


def _sampled_demos(cfg: Config, domain: str, model: str, env=None, tasks=None) -> tuple[list[dict], dict]:
    """``sft.collect_demos`` with ``model`` as the teacher (``teacher_policy``) over ``demo_tasks``."""
    s = cfg.sft
    env = env if env is not None else make_env(domain, cfg)
    tasks = tasks if tasks is not None else demo_tasks(env, cfg)
    seed_everything(cfg.seed + 1)  # the samples do not depend on what ran before in this process
    policy = teacher_policy(cfg, model)
    try:
        with Progress(len(tasks) * s.samples_per_task, f"cold start {domain}: sampling", unit="episode") as bar:
            return sft.collect_demos(env, policy, tasks, max_turns=cfg.grpo.max_turns, num_demos=s.num_demos,
                                     batched=True, batch_size=cfg.eval.batch_size,
                                     samples_per_task=s.samples_per_task, dedup=True, progress=bar.update)
    finally:
        if hasattr(policy, "close"):
            policy.close()  # the accelerator's memory goes back before the SFT job starts


def cold_start(cfg: Config, domain: str, init_model_dir: str, out_dir: str | Path) -> str:
    """Rejection-sampled SFT from ``sft.teacher``'s demos into ``<out_dir>/checkpoints/sft``; returns its model dir.
    Raises ``ColdStartError`` (after writing ``demos.json``) when no demo was kept."""
    sft_dir = Path(out_dir) / SFT_DIR
    model = sft_dir / "model"
    if model.exists():  # finished before a restart of this run (same config: the run store kept it)
        return str(model)
    env = make_env(domain, cfg)
    tasks = demo_tasks(env, cfg)
    rows, stats = cold_start_demos(cfg, domain, str(init_model_dir), env, tasks)
    stats["max_turns"] = cfg.grpo.max_turns
    write_json(sft_dir / "demos.json", stats)
    logger.info("cold start %s: kept %d of %d episodes of %s (%d duplicates)", domain, stats["kept"],
                stats["tried"], stats["source"], stats["duplicates"])
    if not rows:
        top = ", ".join(f"{r} ({n})" for r, n in list(stats["rejected"].items())[:3]) or "none"
        raise ColdStartError(
            f"cold start of stage {domain} ({Path(out_dir).name}): rejection sampling kept no demo of "
            f"sft.teacher={cfg.sft.teacher} ({stats['source']}): 0 of {stats['tried']} episodes ({stats['tasks']} "
            f"tasks x {stats['samples_per_task']} samples) kept, {stats['rejected_total']} rejected, "
            f"{stats['duplicates']} duplicates; main reasons: {top}. Statistics: {sft_dir / 'demos.json'}. Sample "
            "more (sft.samples_per_task, sft.teacher_temperature) or take a stronger sft.teacher (a model, an "
            "endpoint, or expert); nothing was trained")
    demos = sft.write_rows(rows, sft_dir / "demos.jsonl")
    held_out = check_tasks(env, cfg, tasks)
    job = {"model_dir": str(init_model_dir), "dataset": str(demos)}
    if held_out:  # the stopping criterion's tasks, for the SFT job (which may run in other processes)
        path = sft_dir / "check_tasks.jsonl"
        path.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in held_out))
        job.update(domain=domain, check_tasks=str(path))
    launch(cfg, "sft", sft_dir, **job)
    return str(model)


def run_stage(cfg: Config, domain: str, init_model_dir: str | Path, out_dir: str | Path) -> dict:
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
