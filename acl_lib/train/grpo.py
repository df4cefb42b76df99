"""GRPO from an incoming checkpoint with a world's verifiable reward (TRL ``GRPOTrainer``).

    summary = train_grpo(cfg, model_dir, domain, out_dir)   # tasks: env.tasks("train", cfg.worlds.n_train, seed)

Single-turn worlds (math, IF) train on a prompt dataset with ``trl_env.EpisodeReward``; tool worlds (search,
retail) on multi-turn rollouts by ``trl_env.EpisodeRollout`` + ``trl_env.environment_factory`` (the module
docstring of ``trl_env`` says why not TRL's own tool loop). Settings come from ``cfg.grpo``:
``batch_size`` completions per optimizer step (= prompts x ``num_generations``), ``max_completion_length``
tokens per single-turn completion, ``max_episode_tokens`` per multi-turn rollout (TRL counts a multi-turn
completion whole: policy + observation tokens of every turn; each turn is also capped at
``cfg.grpo.max_new_tokens``). A training episode may take ``cfg.grpo.max_turns`` assistant turns (the
profiles set these to the evaluation limits, so a stage never trains for conversations it may not finish at
test time, nor stops short of them; they are training keys so that re-scoring never retrains). A rollout cut off
by a budget scores 0 and stays in the loss (TRL's ``mask_truncated_completions`` is off): the policy learns to
finish in budget.

Writes into ``out_dir``: ``train_log.jsonl`` (per step: reward, reward_std, loss, completion length,
wall time, generated tokens/s), ``train_summary.json``, checkpoints under ``<out_dir>/checkpoints`` (a crashed job
resumes from the last one), and the final model in ``model/``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from acl_lib.eval.policies import stop_token_ids
from acl_lib.train import common, trl_env

if TYPE_CHECKING:
    from acl_lib.config import Config


def vllm_kwargs(cfg: Config, multi_turn: bool, stop_ids: list[int] | None) -> dict:
    """``GRPOConfig`` fields of vLLM rollouts (``grpo.use_vllm``): the engine's context is the model's
    (``model.max_position_embeddings``, not vLLM's guess from the checkpoint), every call stops at a turn's end
    (``stop_ids``: eos and ``<|im_end|>``, since a hub base model's eos is ``<|endoftext|>``), and a multi-turn
    call generates one turn (``grpo.max_new_tokens``), not the whole rollout budget ``max_completion_length``.

    Sleep mode (``grpo.vllm_sleep_mode``) applies to single-turn rollouts only: TRL's colocated engine sleeps
    after every ``generate`` call and re-pushes the weights on the next, a collective under ZeRO-3, and a multi-turn
    rollout calls it once per turn, a different number of times on each rank (``tests/test_paper_vllm_sleep.py``).
    """
    if not cfg.grpo.use_vllm:
        return {}
    gen: dict = {"stop_token_ids": list(stop_ids)} if stop_ids else {}
    if multi_turn:
        gen["max_tokens"] = cfg.grpo.max_new_tokens  # overrides TRL's max_completion_length per vLLM call
    return {"vllm_max_model_length": cfg.model.max_position_embeddings, "generation_kwargs": gen or None,
            "vllm_enable_sleep_mode": cfg.grpo.vllm_sleep_mode and not multi_turn}


def grpo_args(cfg: Config, out_dir, multi_turn: bool = False, stop_ids: list[int] | None = None):
    """The ``trl.GRPOConfig`` of a stage (CPU-safe settings from ``common.trainer_kwargs``; vLLM settings from
    ``vllm_kwargs``)."""
    from trl import GRPOConfig

    g = cfg.grpo
    if g.batch_size % g.num_generations:
        raise ValueError(f"grpo.batch_size ({g.batch_size}) must be a multiple of "
                         f"grpo.num_generations ({g.num_generations})")
    kw = common.trainer_kwargs(cfg, out_dir, max_steps=g.max_steps, batch_size=g.batch_size,
                               learning_rate=g.learning_rate, scheduler="constant",
                               micro_batch_size=g.micro_batch_size)
    kw.update(vllm_kwargs(cfg, multi_turn, stop_ids))
    return GRPOConfig(
        **kw,
        num_generations=g.num_generations,
        max_completion_length=g.max_episode_tokens if multi_turn else g.max_completion_length,
        temperature=g.temperature,
        beta=g.beta,
        loss_type=g.loss_type,
        use_vllm=g.use_vllm,
        # Colocated vLLM (paper profile): generation shares each training GPU, no separate server to run.
        vllm_mode="colocate",
        shuffle_dataset=True,
        log_completions=False,
    )


def build_trainer(cfg: Config, model_dir, env, tasks, out_dir, *, policy=None, callbacks=(), model=None, tokenizer=None,
                  **trainer_kw):
    """A ready ``GRPOTrainer`` for ``tasks`` of ``env`` starting from ``model_dir``.

    ``policy``: override the rollout generator of multi-turn worlds (tests); ignored for single-turn worlds.
    ``model`` and ``tokenizer``: an already loaded model (and its tokenizer) to train instead of ``model_dir``'s
    (MLE: a PEFT adapter on a frozen backbone); ``trainer_kw`` go to ``GRPOTrainer`` (e.g. ``peft_config``).
    """
    from trl import GRPOTrainer

    from acl_lib.train.shared_prompt import trainer_class

    # On CPU each group's prompt is encoded once in the loss (shared_prompt); vLLM runs keep TRL's trainer as it is.
    GRPOTrainer = GRPOTrainer if cfg.grpo.use_vllm else trainer_class()  # noqa: N806
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func / environment_factory are "experimental"
    if model is not None and tokenizer is None:
        raise ValueError("build_trainer: a loaded model needs its tokenizer")
    tok = tokenizer if tokenizer is not None else common.load_tokenizer(model_dir)
    multi = trl_env.is_multi_turn(tasks)
    # The arguments first: under ZeRO-3 they register the DeepSpeed config, so the model loads partitioned.
    args = grpo_args(cfg, out_dir, multi_turn=multi, stop_ids=stop_token_ids(tok))
    if model is None:
        model, tok = common.load_model_and_tokenizer(model_dir, cfg)
    zero3_loaded = common.zero3_loaded(model)
    data = trl_env.grpo_dataset(tasks)
    if multi:
        max_turns = cfg.grpo.max_turns
        rollout = trl_env.EpisodeRollout(policy, max_new_tokens=cfg.grpo.max_new_tokens)
        rollout.chat_template(tok)  # a template rollouts cannot render with fails here, before any step
        trainer = GRPOTrainer(
            model=model, args=args, train_dataset=data, processing_class=tok, callbacks=list(callbacks),
            environment_factory=trl_env.environment_factory(env, max_turns), rollout_func=rollout, **trainer_kw,
        )
    else:
        # On CPU the suite's engine samples the completions (each prompt encoded once for its group); vLLM keeps
        # TRL's.
        rollout = {} if cfg.grpo.use_vllm else {"rollout_func": trl_env.SingleTurnRollout()}
        trainer = GRPOTrainer(
            model=model, args=args, train_dataset=data, processing_class=tok, callbacks=list(callbacks),
            reward_funcs=[trl_env.EpisodeReward(env, tok)], **rollout, **trainer_kw,
        )
    trainer.acl_zero3_loaded = zero3_loaded
    return trainer


def train_grpo(cfg: Config, model_dir: str | Path, domain: str, out_dir: str | Path, env=None, tasks=None) -> dict:
    """Run GRPO for ``domain`` from ``model_dir`` into ``<out_dir>/model``; returns the summary.

    ``env`` / ``tasks`` default to the domain's world (``cfg.worlds``) and its first ``cfg.worlds.n_train``
    training tasks; pass them to train on something else (tests, ablations).
    """
    common.set_threads(cfg)
    env = env if env is not None else trl_env.make_env(domain, cfg)
    tasks = tasks if tasks is not None else env.tasks("train", cfg.worlds.n_train, seed=cfg.seed)
    log = common.make_jsonl_logger(Path(out_dir) / common.TRAIN_LOG, extra={"job": "grpo", "domain": domain})
    trainer = build_trainer(cfg, model_dir, env, tasks, out_dir, callbacks=[log])
    common.show_progress(trainer, "grpo")
    t0 = time.perf_counter()
    trainer.train(resume_from_checkpoint=common.last_checkpoint(out_dir))
    wall = time.perf_counter() - t0
    common.save_final_model(trainer, trainer.processing_class, out_dir)
    summary = common.summarize(common.read_log(Path(out_dir) / common.TRAIN_LOG), wall, job="grpo",
                               rollouts_per_step=cfg.grpo.batch_size, num_generations=cfg.grpo.num_generations,
                               domain=domain, tasks=len(tasks), multi_turn=trl_env.is_multi_turn(tasks),
                               **common.distributed_info(trainer))
    return common.write_summary(trainer, out_dir, summary)

