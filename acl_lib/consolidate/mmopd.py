"""Multi-teacher mixed on-policy distillation (MMOPD, notebook 08): the sequential endpoint learns back from the
frozen stage checkpoints on its own rollouts.

    student  seq_final (the last stage of the curriculum)
    teachers seq_math, seq_search, seq_ecom, seq_if (frozen); each prompt is scored by the one that owns its domain
    prompts  a mixture of every stage's training prompts (``mmopd.mixture``)
    loss     per policy token: KL(student || teacher) over the vocabulary (reverse KL), plus
             ``forward_weight`` x KL(teacher_top_q || student) where the teacher's entropy exceeds ``alpha``

    run = run_mmopd(cfg, mmopd_spec(cfg))                      # <seed_dir>/mmopd/model + mmopd/eval/metrics.json
    run = run_mmopd(cfg, mmopd_spec(cfg, "mmopd_rkl", alpha=None))   # alpha = infinity: plain reverse-KL OPD
    run = run_mmopd(cfg, single_teacher_spec(cfg))             # teacher seq_search, student seq_ecom, search prompts

**On-policy, multi-turn.** The student generates whole episodes in the real environments (search and the retail
desk call tools and talk to the simulated customer) through the rollout machinery the stages' GRPO uses
(``trl_env.EpisodeRollout``: policy tokens carry ``env_mask`` 1, tool results and simulated-user turns 0). The
routed teacher is run on the student's own tokens; the loss is taken at policy tokens only, so environment
tokens carry no distillation loss, exactly as they carry no policy-gradient loss in the stages.

**Why a ``GRPOTrainer`` subclass, not TRL's ``DistillationTrainer``.** ``DistillationTrainer`` has one teacher and
TRL's own tool loop, which ends a rollout at the first turn without a tool call and cannot insert a simulated
user's reply (the retail desk needs both; ``trl_env``'s docstring). ``GRPOTrainer`` already runs our multi-turn
``rollout_func`` and keeps its tool mask; ``MMOPDTrainer`` adds the per-row domain to the generation batch (so the
batch can be shuffled and split as GRPO does) and replaces the policy-gradient loss by the routed hybrid KL. The
rewards GRPO computes for the rollouts are kept as a log of the student's on-policy success; advantages are unused.

**The hybrid loss** (``hybrid_kl``), at each policy position t with student distribution p and teacher q:

    reverse(t) = sum_v p(v) (log p(v) - log q(v))                         (every position)
    forward(t) = sum_{v in top_q(q)} q~(v) (log q~(v) - log p(v))         (q~: q renormalised over its top q tokens)
    loss       = mean_t [ reverse(t) + forward_weight * 1{H(q)_t > alpha} * forward(t) ]

alpha = None is infinity: no position qualifies and the loss is plain reverse KL.

**Memory** (``memory_plan``): one trained student plus four frozen teachers. ``teacher_placement: resident`` keeps
every teacher on the training device (mini, and any model small enough); ``offload`` keeps them on the CPU and
moves one teacher to the device for the rows routed to it, then back, so the device holds one teacher at a time
(the paper profile's plan for four 8B teachers beside an 8B student under ZeRO-3). ``run_mmopd`` writes the
rendered plan beside the job before it launches (``write_memory_plan``: ``<run>/launch/memory_plan.md``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from acl_lib import pipeline
from acl_lib.config import setting_text
from acl_lib.consolidate.merging import checkpoint_runs
from acl_lib.diagnostics.weights import checkpoint_parameter_count, weight_change
from acl_lib.envs import STAGE_ENV
from acl_lib.envs.llm_user import outside_zero3
from acl_lib.eval.policies import stop_token_ids
from acl_lib.runs import Run, run_once
from acl_lib.train import common, trl_env
from acl_lib.train.common import read_log
from acl_lib.train.grpo import grpo_args
from acl_lib.train.launcher import LAUNCH_DIR, launch
from acl_lib.train.trl_env import make_env

logger = logging.getLogger("acl.consolidate.mmopd")

MMOPD_SECTIONS = ("model", "worlds", "grpo", "mmopd")  # what a distillation run depends on besides its checkpoints
NUM_GENERATIONS = 2  # rollouts per prompt: GRPO's bookkeeping needs >= 2; distillation needs no group baseline
PROMPT_SEED_OFFSET = 2  # prompts: each domain's training split drawn with cfg.seed + 2 (stages use seed, seed + 1)


# --- the loss ------------------------------------------------------------------------------------------------


def hybrid_terms(student_logits, teacher_logits, alpha: float | None, top_q: int, forward_weight: float):
    """Per position (any leading shape, vocabulary last): ``(per_token, reverse, forward, high, entropy)`` of the
    mixed KL (module docstring); ``high`` is 1 where the teacher's entropy exceeds ``alpha`` (0 everywhere for
    alpha None or no forward weight), ``forward`` the forward term there."""
    import torch

    log_p = torch.log_softmax(student_logits.float(), dim=-1)
    with torch.no_grad():
        log_q = torch.log_softmax(teacher_logits.float(), dim=-1)
        entropy = -(log_q.exp() * log_q).sum(-1)
    reverse = (log_p.exp() * (log_p - log_q)).sum(-1)
    if alpha is None or forward_weight == 0.0:
        high = torch.zeros_like(entropy)
        forward = torch.zeros_like(reverse)
    else:
        high = (entropy > alpha).to(entropy.dtype)
        k = min(int(top_q), log_q.size(-1))
        top_logq, top_idx = log_q.topk(k, dim=-1)
        log_qt = top_logq - torch.logsumexp(top_logq, dim=-1, keepdim=True)  # the teacher renormalised over top q
        forward = (log_qt.exp() * (log_qt - log_p.gather(-1, top_idx))).sum(-1)
    return reverse + forward_weight * high * forward, reverse, forward, high, entropy


def _stats(sums, n, n_high) -> dict:
    """The logged statistics from sums over masked positions (``reverse``, ``forward`` over high ones, ``entropy``)."""
    return {"reverse": float(sums["reverse"] / max(n, 1.0)),
            "forward": float(sums["forward"] / max(n_high, 1.0)),
            "high_entropy_share": float(n_high / max(n, 1.0)),
            "teacher_entropy": float(sums["entropy"] / max(n, 1.0))}


def hybrid_kl(student_logits, teacher_logits, mask, alpha: float | None, top_q: int, forward_weight: float):
    """The mixed KL of the module docstring on whole logits. ``*_logits``: (B, T, V) at the positions predicting
    the completion tokens; ``mask``: (B, T), 1 at policy tokens. Returns ``(loss, stats)``: the mean over masked
    positions, and floats ``reverse`` (mean reverse KL), ``forward`` (mean forward term where it applies, 0 if
    nowhere), ``high_entropy_share`` (share of masked positions above ``alpha``), ``teacher_entropy``. The trainer
    uses ``chunked_hybrid_kl`` (the same loss without the full logits)."""
    per_token, reverse, forward, high, entropy = hybrid_terms(student_logits, teacher_logits, alpha, top_q,
                                                              forward_weight)
    m = mask.to(per_token.dtype)
    high = high * m
    n = float(m.sum())
    loss = (per_token * m).sum() / max(n, 1.0)
    sums = {"reverse": float((reverse.detach() * m).sum()), "forward": float((forward.detach() * high).sum()),
            "entropy": float((entropy * m).sum())}
    return loss, _stats(sums, n, float(high.sum()))


def chunked_hybrid_kl(student_hidden, student_head, teacher_hidden, teacher_heads, row_teacher, mask,
                      alpha: float | None, top_q: int, forward_weight: float, chunk_tokens: int):
    """``hybrid_kl`` from hidden states: the (B, T, V) logits of student and teacher never exist whole.

    ``*_hidden``: (B, T, H) final hidden states (after the last norm) at the positions predicting the completion
    tokens; ``student_head``: the student's output-embedding module; ``teacher_heads``: teacher name -> its head
    module; ``row_teacher``: each row's teacher name; ``mask``: (B, T). The masked positions of each teacher's rows
    are projected ``chunk_tokens`` at a time through both heads, inside activation checkpointing, so the backward
    recomputes a chunk's logits instead of keeping them: memory is a chunk's (chunk_tokens x V) logits, not the
    batch's (the paper profile's memory plan counts it). The heads are called as modules, so ZeRO-3 gathers the
    student's head for each call as it does in a plain forward. Same loss and gradients as ``hybrid_kl``."""
    import torch
    from torch.utils.checkpoint import checkpoint

    def chunk_sums(hs, ht, head_t):
        logits_s = student_head(hs)
        with torch.no_grad():
            logits_t = head_t(ht.to(head_t.weight.dtype))
        per_token, reverse, forward, high, entropy = hybrid_terms(logits_s, logits_t, alpha, top_q, forward_weight)
        detached = torch.stack([reverse.detach().sum(), (forward.detach() * high).sum(), entropy.sum(), high.sum()])
        return per_token.sum(), detached

    n = float(mask.sum())
    total = student_hidden.new_zeros((), dtype=torch.float32)
    sums = {"reverse": 0.0, "forward": 0.0, "entropy": 0.0}
    n_high = 0.0
    for name in dict.fromkeys(row_teacher):
        rows = torch.tensor([i for i, t in enumerate(row_teacher) if t == name], device=mask.device)
        sub = torch.zeros_like(mask, dtype=torch.bool)
        sub[rows] = mask[rows].bool()
        pos = sub.nonzero(as_tuple=True)
        for start in range(0, len(pos[0]), chunk_tokens):
            b, t = pos[0][start:start + chunk_tokens], pos[1][start:start + chunk_tokens]
            hs = student_hidden[b, t]
            ht = teacher_hidden[b, t]
            part, d = checkpoint(chunk_sums, hs, ht, teacher_heads[name], use_reentrant=False)
            total = total + part
            sums["reverse"] += float(d[0])
            sums["forward"] += float(d[1])
            sums["entropy"] += float(d[2])
            n_high += float(d[3])
    return total / max(n, 1.0), _stats(sums, n, n_high)


# --- routing and teachers ------------------------------------------------------------------------------------


def route(domains: Sequence[str], teacher_of: Mapping[str, str]) -> dict[str, list[int]]:
    """``{teacher: [row indices]}``: each row goes to the one teacher that owns its domain (no ensembling). A row
    whose domain has no teacher is an error naming it (a prompt mixture and a teacher map that disagree)."""
    groups: dict[str, list[int]] = {}
    for i, d in enumerate(domains):
        if d not in teacher_of:
            raise KeyError(f"row {i} has domain {d!r} and no teacher owns it (teachers: {dict(teacher_of)})")
        groups.setdefault(teacher_of[d], []).append(i)
    return groups


class TeacherPool:
    """Frozen teacher models by name. ``placement``: "resident" (on ``device`` from the start) or "offload" (kept
    on the CPU; ``logits`` moves the routed teacher to ``device`` for its rows and back).

    Every rank holds its teachers whole. They are loaded outside ZeRO-3 (``llm_user.outside_zero3``): the MMOPD job
    builds its ``GRPOConfig(deepspeed=...)`` first, which registers the ZeRO-3 config with transformers, and a
    ``from_pretrained`` after it gets ``zero.Init`` placeholders that no DeepSpeed engine ever gathers (the first
    teacher forward failed: "'weight' must be 2-D"). A teacher is not trained: its forward needs no collective."""

    def __init__(self, model_dirs: Mapping[str, str], device, placement: str = "resident", dtype: str = "float32"):
        from acl_lib.model import load_model_and_tokenizer  # acl_lib.model.build loads torch and transformers

        if placement not in ("resident", "offload"):
            raise ValueError(f"teacher placement must be resident or offload, got {placement!r}")
        self.placement, self.device = placement, device
        self.models = {}
        for name, path in model_dirs.items():
            with outside_zero3():
                model, _ = load_model_and_tokenizer(path, dtype=dtype)
            model.eval().requires_grad_(False)
            self.models[name] = model.to(device if placement == "resident" else "cpu")

    def vocab_size(self, name: str) -> int:
        return self.models[name].config.get_text_config().vocab_size

    def head(self, name: str):
        """The teacher's output-embedding module, on the training device (an offloaded teacher's head stays there:
        the chunked loss's backward recomputes its logits after the body has gone back to the CPU)."""
        head = self.models[name].get_output_embeddings()
        if self.placement == "offload":
            head.to(self.device)
        return head

    def _on_device(self, name: str):
        model = self.models[name]
        if self.placement == "offload":
            model.to(self.device)
        return model

    def _back(self, name: str) -> None:
        if self.placement == "offload":
            model = self.models[name]
            head = model.get_output_embeddings()
            model.to("cpu")
            head.to(self.device)  # tied or not, the head is needed on the device by the chunked loss

    def logits(self, name: str, input_ids, attention_mask, logits_to_keep: int):
        """The teacher's logits at the last ``logits_to_keep`` positions (no gradient)."""
        import torch

        model = self._on_device(name)
        try:
            with torch.no_grad():
                return model(input_ids=input_ids, attention_mask=attention_mask,
                             logits_to_keep=logits_to_keep).logits
        finally:
            self._back(name)

    def hidden(self, name: str, input_ids, attention_mask, keep: int):
        """The teacher's final hidden states (after its last norm) at the last ``keep`` positions (no gradient)."""
        import torch

        model = self._on_device(name)
        try:
            with torch.no_grad():
                return model.get_decoder()(input_ids=input_ids,
                                           attention_mask=attention_mask).last_hidden_state[:, -keep:]
        finally:
            self._back(name)


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


def prompt_tasks(cfg, mixture: Mapping[str, float], n: int) -> list:
    """The prompt mixture: each stage domain's training split (its world built as the stage builds it), drawn
    with ``cfg.seed + PROMPT_SEED_OFFSET``, ``prompts_per_domain`` of each, interleaved by a seeded shuffle."""
    tasks = []
    for domain, k in prompts_per_domain(mixture, n).items():
        tasks += make_env(domain, cfg).tasks("train", k, seed=cfg.seed + PROMPT_SEED_OFFSET)
    random.Random(f"mmopd-prompts:{cfg.seed}").shuffle(tasks)
    return tasks


# --- the trainer ---------------------------------------------------------------------------------------------


def _trainer_class():
    from trl import GRPOTrainer

    class MMOPDTrainer(GRPOTrainer):
        """GRPO's on-policy multi-turn machinery with the routed hybrid KL as the loss (module docstring)."""

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


def distill_cfg(cfg):
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


def train_mmopd(cfg, out_dir, student_dir: str, teacher_dirs: Mapping[str, str], teacher_of: Mapping[str, str],
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
    model, tok = common.load_model_and_tokenizer(student_dir, cfg)
    args = grpo_args(dcfg, out_dir, multi_turn=True, stop_ids=stop_token_ids(tok))
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
    common.show_progress(trainer, "mmopd")
    t0 = time.perf_counter()
    trainer.train(resume_from_checkpoint=common.last_checkpoint(out_dir))
    wall = time.perf_counter() - t0
    common.save_final_model(trainer, tok, out_dir)
    summary = common.summarize(common.read_log(out_dir / common.TRAIN_LOG), wall, job="mmopd", prompts=len(tasks),
                               prompts_per_domain=prompts_per_domain(mixture, cfg.mmopd.n_prompts),
                               **common.distributed_info(trainer))
    return common.write_summary(trainer, out_dir, summary)


# --- specs and runs ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DistillSpec:
    """One distillation run: its name, the student run, ``teachers`` (stage domain -> teacher run name), the prompt
    ``mixture`` (stage domain -> weight) and alpha (None = infinity: plain reverse KL)."""

    name: str
    student: str
    teachers: dict = field(default_factory=dict)
    mixture: dict = field(default_factory=dict)
    alpha: float | None = None

    def __post_init__(self):
        missing = [d for d, w in self.mixture.items() if w > 0 and d not in self.teachers]
        if missing:
            raise ValueError(f"{self.name}: prompts of {missing} but no teacher for them (teachers: {self.teachers})")
        if not any(w > 0 for w in self.mixture.values()):
            raise ValueError(f"{self.name}: the prompt mixture {self.mixture} has no positive weight")

    def to_dict(self) -> dict:
        return asdict(self)


def _seq_name(cfg, domain: str) -> str:
    return pipeline.sequential_run(cfg, cfg.pipeline.curriculum.index(domain) + 1).name


def mmopd_spec(cfg, name: str = "mmopd", **changes) -> DistillSpec:
    """The study's MMOPD: student ``seq_final``, the four stage checkpoints as teachers, ``mmopd.mixture``,
    ``mmopd.alpha``; ``changes`` replace fields (``alpha=None`` for the reverse-KL ablation)."""
    cur = cfg.pipeline.curriculum
    spec = {"name": name, "student": _seq_name(cfg, cur[-1]), "teachers": {d: _seq_name(cfg, d) for d in cur},
            "mixture": dict(cfg.mmopd.mixture), "alpha": cfg.mmopd.alpha}
    spec.update(changes)
    return DistillSpec(**spec)


def single_teacher_spec(cfg, name: str = "mmopd_single") -> DistillSpec:
    """The study's single-teacher ablation: teacher ``seq_search``, student ``seq_ecom`` (the stage after search in
    the study's order), search prompts only."""
    return DistillSpec(name=name, student=_seq_name(cfg, "ecom"), teachers={"search": _seq_name(cfg, "search")},
                       mixture={"search": 1.0}, alpha=cfg.mmopd.alpha)


def distill_run(cfg, spec: DistillSpec):
    """The run of ``spec`` (``<seed_dir>/<spec.name>``), keyed on its spec, the sections it reads and its inputs."""
    known = checkpoint_runs(cfg)
    names = [spec.student, *dict.fromkeys(spec.teachers.values())]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"{spec.name}: {unknown} is not a checkpoint of this pipeline (known: {list(known)})")
    return Run(cfg, spec.name, sections=MMOPD_SECTIONS, inputs=[known[n] for n in names],
               extra={"distill": spec.to_dict()})


def run_mmopd(cfg, spec: DistillSpec, evaluate: bool = True):
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


# --- the memory plan -----------------------------------------------------------------------------------------


DIVERGENCE_COPIES = 8  # float32 (chunk x vocabulary) tensors alive at once in a chunk of chunked_hybrid_kl: both
# heads' logits, both log-softmaxes, p and q, the reverse-KL product and its gradient


def memory_plan(cfg, n_params: int, n_teachers: int = 4, vocab_size: int | None = None,
                hidden_size: int | None = None) -> dict:
    """Per-GPU memory of one student and ``n_teachers`` teachers of ``n_params`` parameters each, for
    ``cfg.launcher`` (GPUs = nodes x processes) and ``cfg.mmopd.teacher_placement``; GiB, weights and optimizer
    state only (activations, KV caches and the vLLM engine come on top).

    Student under ZeRO-3: bf16 weights and gradients, fp32 master weights and Adam moments (16 bytes per parameter),
    sharded over every GPU. Resident teachers: bf16 weights, whole on every GPU (each rank holds its own
    ``TeacherPool``, loaded outside ZeRO-3). Offloaded teachers: bf16 weights in CPU memory, a copy per process,
    one teacher whole on the GPU while its rows are scored, and every teacher's head kept there (the chunked loss's
    backward recomputes teacher logits). With ``vocab_size`` and ``hidden_size``: the divergence's working memory,
    ``DIVERGENCE_COPIES`` float32 (``mmopd.chunk_tokens`` x vocabulary) tensors (``chunked_hybrid_kl``), and those
    teacher heads."""
    gib = 1024**3
    gpus = cfg.launcher.num_nodes * cfg.launcher.num_processes
    student = 16 * n_params / (gpus if cfg.launcher.zero_stage == 3 else 1) / gib
    one_teacher = 2 * n_params / gib
    if cfg.mmopd.teacher_placement == "resident":
        teachers_gpu = n_teachers * one_teacher
        cpu = 0.0
    else:
        teachers_gpu = one_teacher
        cpu = cfg.launcher.num_processes * n_teachers * one_teacher
    divergence = heads = 0.0
    if vocab_size and hidden_size:
        divergence = DIVERGENCE_COPIES * cfg.mmopd.chunk_tokens * vocab_size * 4 / gib
        if cfg.mmopd.teacher_placement == "offload":
            heads = (n_teachers - 1) * 2 * vocab_size * hidden_size / gib  # the routed one's is in one_teacher
    return {"gpus": gpus, "zero_stage": cfg.launcher.zero_stage, "placement": cfg.mmopd.teacher_placement,
            "n_params": n_params, "student_gib_per_gpu": student, "teachers_gib_per_gpu": teachers_gpu + heads,
            "divergence_gib_per_gpu": divergence, "chunk_tokens": cfg.mmopd.chunk_tokens,
            "total_gib_per_gpu": student + teachers_gpu + heads + divergence, "teachers_cpu_gib_per_node": cpu}


def memory_plan_for(cfg, n_teachers: int = 4) -> dict:
    """``memory_plan`` for this profile's student: ``seq_final``'s checkpoint when it exists, else the base model's."""
    final = pipeline.sequential_run(cfg, len(cfg.pipeline.curriculum))
    source = final.path / "model" if final.is_complete() else pipeline.model_dir(pipeline.base_run(cfg))
    return memory_plan(cfg, checkpoint_parameter_count(source), n_teachers, *_vocab_and_width(source))


def _vocab_and_width(model_dir) -> tuple[int | None, int | None]:
    """(vocab_size, hidden_size) from a checkpoint's config.json (its text config), or Nones when it has none."""
    path = Path(model_dir) / "config.json"
    conf = json.loads(path.read_text()) if path.is_file() else {}
    conf = conf.get("text_config", conf)
    return conf.get("vocab_size"), conf.get("hidden_size")


def specs_frame(specs: Sequence[DistillSpec]):
    """The distillation runs: student, teacher of each domain, prompt mixture, alpha."""
    import pandas as pd

    return pd.DataFrame([{"run": s.name, "student": s.student,
                          "teachers": ", ".join(f"{d}: {t}" for d, t in s.teachers.items()),
                          "mixture": ", ".join(f"{d} {w:g}" for d, w in s.mixture.items() if w > 0),
                          "alpha": "inf (reverse KL only)" if s.alpha is None else setting_text(s.alpha)}
                         for s in specs]
                        ).set_index("run")


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}k"


def render_memory_plan(plan: Mapping) -> str:
    """The plan as the markdown ``write_memory_plan`` writes (``launch/memory_plan.md``) and notebook 08 shows."""
    how = ("every teacher stays on the GPU" if plan["placement"] == "resident" else
           "teachers stay in CPU memory; the routed teacher is moved to the GPU for its rows, then back")
    return "\n".join([
        f"# MMOPD memory plan ({plan['gpus']} GPUs, ZeRO-{plan['zero_stage']}, teachers {plan['placement']})",
        "",
        f"Student and teachers of {_count(plan['n_params'])} parameters each; {how}.",
        "",
        "| what | GiB |",
        "|---|---:|",
        f"| student (weights, gradients, Adam) per GPU | {plan['student_gib_per_gpu']:.3g} |",
        f"| teachers per GPU | {plan['teachers_gib_per_gpu']:.3g} |",
        f"| divergence, {plan.get('chunk_tokens', '?')} positions at a time (float32 logits of both heads) | "
        f"{plan.get('divergence_gib_per_gpu', 0.0):.3g} |",
        f"| total per GPU (before activations, KV cache, vLLM) | {plan['total_gib_per_gpu']:.3g} |",
        f"| teachers in CPU memory per node (a copy per process) | {plan['teachers_cpu_gib_per_node']:.3g} |",
        "",
    ])


def write_memory_plan(cfg, out_dir, model_dir, n_teachers: int) -> Path:
    """``<out_dir>/launch/memory_plan.md`` (and ``.json``): the per-GPU memory of a distillation job's student and
    teachers for ``cfg.launcher`` and ``cfg.mmopd.teacher_placement`` (``memory_plan``), sized from the student
    checkpoint's tensor headers; ``run_mmopd`` writes it beside the job before any weight loads."""
    plan = memory_plan(cfg, checkpoint_parameter_count(model_dir), n_teachers, *_vocab_and_width(model_dir))
    d = Path(out_dir) / LAUNCH_DIR
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory_plan.json").write_text(json.dumps(plan, indent=2) + "\n")
    path = d / "memory_plan.md"
    path.write_text(render_memory_plan(plan))
    return path
