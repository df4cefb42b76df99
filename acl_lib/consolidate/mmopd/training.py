"""MMOPD's job: the launcher's ``mmopd`` (``train_mmopd``: the distillation trainer on the prompt mixture) and
the run that launches it (``run_mmopd``: memory plan, job, ``moved.json``, evaluation).

**On-policy, multi-turn.** The student generates whole episodes in the real environments (search and the retail
desk call tools and talk to the simulated customer) through the rollout machinery the stages' GRPO uses
(``trl_env.EpisodeRollout``: policy tokens carry ``env_mask`` 1, tool results and simulated-user turns 0). The
routed teacher is run on the student's own tokens; the loss is taken at policy tokens only, so environment
tokens carry no distillation loss, exactly as they carry no policy-gradient loss in the stages.

**Why a ``GRPOTrainer`` subclass, not TRL's ``DistillationTrainer``.** ``DistillationTrainer`` has one teacher and
TRL's own tool loop, which ends a rollout at the first turn without a tool call and cannot insert a simulated
user's reply (the retail desk needs both; ``trl_env``'s docstring). ``GRPOTrainer`` already runs our multi-turn
``rollout_func`` and keeps its tool mask; ``MMOPDTrainer`` adds the per-row domain to the generation batch (so the
batch can be shuffled and split as GRPO does) and replaces the policy-gradient loss by the routed hybrid KL
(``loss.py``). The rewards GRPO computes for the rollouts are kept as a log of the student's on-policy success;
advantages are unused.
"""

from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from acl_lib import pipeline
from acl_lib.consolidate.mmopd.loss import chunked_hybrid_kl, route
from acl_lib.consolidate.mmopd.memory import write_memory_plan
from acl_lib.consolidate.mmopd.specs import DistillSpec, distill_run
from acl_lib.consolidate.mmopd.teachers import TeacherPool
from acl_lib.diagnostics.weights import weight_change
from acl_lib.envs import STAGE_ENV
from acl_lib.eval.policies import stop_token_ids
from acl_lib.runs import run_once
from acl_lib.train import common, trl_env
from acl_lib.train.common import read_log
from acl_lib.train.grpo import grpo_args
from acl_lib.train.launcher import launch
from acl_lib.train.trl_env import make_env

if TYPE_CHECKING:
    from acl_lib.config import Config

NUM_GENERATIONS = 2  # rollouts per prompt: GRPO's bookkeeping needs >= 2; distillation needs no group baseline
PROMPT_SEED_OFFSET = 2  # prompts: each domain's training split drawn with cfg.seed + 2 (stages use seed, seed + 1)


class RoutedEnvironment:
    """One environment per domain behind the ``start(task, max_turns)`` of ``trl_env.EpisodeEnv``: a task starts
    in the world its ``domain`` names, so one GRPO dataset can mix every stage's prompts."""

    def __init__(self, envs: Mapping[str, object]):
        self.envs = dict(envs)  # env name (Task.domain) -> Environment

    def start(self, task, max_turns: int = 16):
        if task.domain not in self.envs:
            raise KeyError(f"task {task.id}: no environment for domain {task.domain!r} (have {sorted(self.envs)})")
        return self.envs[task.domain].start(task, max_turns=max_turns)


def prompts_per_domain(mixture: Mapping[str, float], n: int) -> dict[str, int]:
    """Prompts per domain: ``n`` split by the weights (largest remainders), each listed domain at least one."""
    total = sum(mixture.values())
    live = {d: w for d, w in mixture.items() if w > 0}
    raw = {d: n * w / total for d, w in live.items()}
    counts = {d: max(1, int(math.floor(v))) for d, v in raw.items()}
    for d in sorted(raw, key=lambda d: raw[d] - math.floor(raw[d]), reverse=True):
        if sum(counts.values()) >= n:
            break
        counts[d] += 1
    return counts


def prompt_tasks(cfg: Config, mixture: Mapping[str, float], n: int) -> list:
    """The prompt mixture: each stage domain's training split (its world built as the stage builds it), drawn
    with ``cfg.seed + PROMPT_SEED_OFFSET``, ``prompts_per_domain`` of each, interleaved by a seeded shuffle."""
    tasks = []
    for domain, k in prompts_per_domain(mixture, n).items():
        tasks += make_env(domain, cfg).tasks("train", k, seed=cfg.seed + PROMPT_SEED_OFFSET)
    random.Random(f"mmopd-prompts:{cfg.seed}").shuffle(tasks)
    return tasks


def _trainer_class():
    from trl import GRPOTrainer

    class MMOPDTrainer(GRPOTrainer):
        """GRPO's on-policy multi-turn machinery with the routed hybrid KL (``loss.py``) as the loss (module
        docstring)."""

        def __init__(self, *args, teachers: TeacherPool, teacher_of: Mapping[str, str], alpha, top_q: int,
                     forward_weight: float, chunk_tokens: int = 1024, **kwargs):
            super().__init__(*args, **kwargs)
            self.teachers, self.teacher_of, self.chunk_tokens = teachers, dict(teacher_of), chunk_tokens
            self.alpha, self.top_q, self.forward_weight = alpha, top_q, forward_weight
            self._domain_names = sorted(set(self.teacher_of))
            student_vocab = self.model.config.get_text_config().vocab_size
            for name in set(self.teacher_of.values()):
                if teachers.vocab_size(name) != student_vocab:
                    raise ValueError(f"teacher {name} has vocabulary {teachers.vocab_size(name)}, the student "
                                     f"{student_vocab}: distillation needs one tokenizer")

        def _generate_and_score_completions(self, inputs):
            import torch

            out = super()._generate_and_score_completions(inputs)
            # The environments hold this batch's episodes, one per row, in the rows' order (EpisodeRollout). The
            # domain travels as a tensor so GRPO's shuffle and split of the generation batch keep it row-aligned.
            domains = [e.episode.task.domain for e in self.environments]
            out["domain_index"] = torch.tensor([self._domain_names.index(d) for d in domains],
                                               device=out["completion_ids"].device)
            return out

        def _compute_loss(self, model, inputs):
            import torch

            prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
            completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
            input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
            attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
            keep = completion_ids.size(1)
            mask = completion_mask * inputs["tool_mask"] if "tool_mask" in inputs else completion_mask
            # Hidden states, not logits: the divergence is taken chunk by chunk through both heads
            # (chunked_hybrid_kl), so no (rows x positions x vocabulary) tensor exists. As TRL's distillation does,
            # the student's decoder is called directly; its head is called as a module inside the chunks.
            unwrapped = self.accelerator.unwrap_model(model)
            student = unwrapped.get_decoder()(input_ids=input_ids,
                                              attention_mask=attention_mask).last_hidden_state[:, -(keep + 1):-1]
            domains = [self._domain_names[i] for i in inputs["domain_index"].tolist()]
            groups = route(domains, self.teacher_of)
            teacher = None  # (B, T, H) in the teachers' dtype
            row_teacher = [""] * len(domains)
            for name, rows in groups.items():
                idx = torch.tensor(rows, device=input_ids.device)
                hid = self.teachers.hidden(name, input_ids[idx], attention_mask[idx], keep + 1)[:, :-1]
                if teacher is None:
                    teacher = hid.new_empty(student.shape[:2] + hid.shape[2:])
                teacher[idx] = hid.to(teacher.dtype)
                for r in rows:
                    row_teacher[r] = name
            heads = {name: self.teachers.head(name) for name in groups}
            loss, stats = chunked_hybrid_kl(student, unwrapped.get_output_embeddings(), teacher, heads, row_teacher,
                                            mask, self.alpha, self.top_q, self.forward_weight, self.chunk_tokens)
            mode = "train" if self.model.training else "eval"
            for k, v in stats.items():
                self._metrics[mode][f"mmopd/{k}"].append(v)
            for name, rows in route(domains, self.teacher_of).items():
                self._metrics[mode][f"mmopd/rows_{name}"].append(float(len(rows)))
            return loss

    return MMOPDTrainer


def distill_cfg(cfg: Config):
    """``cfg`` with the GRPO settings the distillation trainer runs under: ``mmopd``'s steps, batch, learning rate
    and sampling temperature, ``NUM_GENERATIONS`` per prompt, no reference-model KL. Rollout limits (turns, tokens
    per turn, tokens per episode) stay the stages' ``grpo`` ones: the student is distilled on the episodes it is
    trained and scored on."""
    m = cfg.mmopd
    if m.batch_size % NUM_GENERATIONS:
        raise ValueError(f"mmopd.batch_size ({m.batch_size}) must be a multiple of {NUM_GENERATIONS} "
                         "(rollouts per prompt)")
    grpo = cfg.grpo.model_copy(update={"max_steps": m.max_steps, "batch_size": m.batch_size,
                                       "learning_rate": m.learning_rate, "num_generations": NUM_GENERATIONS,
                                       "temperature": m.temperature, "beta": 0.0})
    return cfg.model_copy(update={"grpo": grpo})


def distill_args(dcfg, out_dir, stop_ids):
    """The ``GRPOConfig`` of a distillation job (``grpo_args`` of ``distill_cfg``'s settings, multi-turn), with
    vLLM's importance-sampling correction off: TRL computes it with a whole no-grad forward of the student over the
    batch at every step (the "old" log-probabilities), and the distillation loss never reads it (it compares the
    student with its teachers on the student's own samples)."""
    args = grpo_args(dcfg, out_dir, multi_turn=True, stop_ids=stop_ids)
    args.vllm_importance_sampling_correction = False
    return args


def train_mmopd(cfg: Config, out_dir, student_dir: str, teacher_dirs: Mapping[str, str], teacher_of: Mapping[str, str],
                mixture: Mapping[str, float], alpha: float | None = None, **_ignored) -> dict:
    """Distil into ``<out_dir>/model`` (the launcher's job ``mmopd``; arguments JSON-serialisable). ``teacher_dirs``:
    teacher name -> checkpoint; ``teacher_of``: stage domain -> teacher name; ``mixture``: stage domain -> weight.
    ``alpha`` is passed explicitly (None = infinity) so a spec can differ from ``cfg.mmopd.alpha``."""
    import torch

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func / environment_factory are "experimental"
    common.set_threads(cfg)
    dcfg = distill_cfg(cfg)
    out_dir = Path(out_dir)
    tasks = prompt_tasks(cfg, mixture, cfg.mmopd.n_prompts)
    envs = {STAGE_ENV[d]: trl_env.make_env(d, cfg) for d in mixture if mixture[d] > 0}
    env_teacher = {STAGE_ENV[d]: t for d, t in teacher_of.items()}
    # The arguments first: under ZeRO-3 they register the DeepSpeed config, so the student loads partitioned.
    args = distill_args(dcfg, out_dir, stop_token_ids(common.load_tokenizer(student_dir)))
    model, tok = common.load_model_and_tokenizer(student_dir, cfg)
    zero3_loaded = common.zero3_loaded(model)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if common.has_cuda() else torch.device("cpu")
    teachers = TeacherPool(teacher_dirs, device, cfg.mmopd.teacher_placement, dtype=cfg.model.dtype)
    rollout = trl_env.EpisodeRollout(max_new_tokens=cfg.grpo.max_new_tokens)
    rollout.chat_template(tok)
    log = common.make_jsonl_logger(out_dir / common.TRAIN_LOG, extra={"job": "mmopd"})
    trainer = _trainer_class()(
        model=model, args=args, train_dataset=trl_env.grpo_dataset(tasks), processing_class=tok, callbacks=[log],
        environment_factory=trl_env.environment_factory(RoutedEnvironment(envs), cfg.grpo.max_turns),
        rollout_func=rollout, teachers=teachers, teacher_of=env_teacher, alpha=alpha, top_q=cfg.mmopd.top_q,
        forward_weight=cfg.mmopd.forward_weight, chunk_tokens=cfg.mmopd.chunk_tokens,
    )
    trainer.acl_zero3_loaded = zero3_loaded
    common.show_progress(trainer, "mmopd")
    t0 = time.perf_counter()
    trainer.train(resume_from_checkpoint=common.last_checkpoint(out_dir))
    wall = time.perf_counter() - t0
    common.save_final_model(trainer, tok, out_dir)
    summary = common.summarize(common.read_log(out_dir / common.TRAIN_LOG), wall, job="mmopd", prompts=len(tasks),
                               rollouts_per_step=cfg.mmopd.batch_size,
                               prompts_per_domain=prompts_per_domain(mixture, cfg.mmopd.n_prompts),
                               **common.distributed_info(trainer))
    return common.write_summary(trainer, out_dir, summary)


def run_mmopd(cfg: Config, spec: DistillSpec, evaluate: bool = True):
    """Train ``spec`` (skipped when its run is complete; resumed from its last checkpoint after a crash), record
    how far it moved the student (``moved.json``), and score it on the whole suite (``<run>/eval/metrics.json``)."""
    run = distill_run(cfg, spec)
    missing = [r for r in run.inputs if not r.is_complete()]
    if missing:
        raise RuntimeError(f"{spec.name} needs complete checkpoints: missing "
                           + "; ".join(f"{r.name} ({r.status()}, {r.path})" for r in missing))
    by_name = {r.name: r for r in run.inputs}

    def fn(r) -> None:
        r.checkpoint_dir()
        student = str(pipeline.model_dir(by_name[spec.student]))
        teacher_dirs = {n: str(pipeline.model_dir(by_name[n])) for n in dict.fromkeys(spec.teachers.values())}
        # one student and its teachers on every GPU: the plan is written before any weight loads
        write_memory_plan(cfg, r.path, student, len(teacher_dirs))
        summary = launch(cfg, "mmopd", r.path, student_dir=student, teacher_dirs=teacher_dirs,
                         teacher_of=spec.teachers, mixture=spec.mixture, alpha=spec.alpha)
        r.write_json("moved.json", movement(student, r.path / "model", r.path / "train_log.jsonl"))
        r.logger.info("%s: %s", spec.name, {k: summary.get(k) for k in ("steps", "wall_s") if k in summary})

    run = run_once(run, fn)
    if evaluate:
        pipeline.evaluate_checkpoint(cfg, run)
    return run


def movement(before_dir, after_dir, train_log=None) -> dict:
    """Did training move the student? The L2 norm of the weight change, relative to the student's own norm
    (streamed over the safetensors files, ``diagnostics.weights``), and the first / last logged loss."""
    norm, ref = weight_change(before_dir, after_dir)
    out = {"update_norm": norm, "student_norm": ref, "relative_update": norm / ref if ref else 0.0}
    if train_log:
        losses = [r["loss"] for r in read_log(train_log) if "loss" in r]
        if losses:
            out.update(loss_first=losses[0], loss_last=losses[-1], loss_steps=len(losses))
    return out
