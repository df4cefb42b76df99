"""Rejection-sampled SFT cold start (TRL ``SFTTrainer``, loss on assistant tokens only).

    rows, stats = collect_demos(env, policy, tasks, max_turns=8)   # policy(task, messages) -> raw turn text
    summary = train_sft(cfg, model_dir, rows, out_dir)

``collect_demos`` drives ``samples_per_task`` episodes per task with a teacher policy (the world's
``scripted_expert`` at mini scale; any callable ``(task, messages) -> text``, or a model through the evaluator's
batched policies) and keeps a trajectory only if it scored reward 1.0 with no protocol error (malformed / unknown
/ badly-argued tool calls) and, with ``dedup``, is not a duplicate: a sample of a task whose ``assistant_text``
(every assistant turn's text and tool calls, lowercased, whitespace collapsed) equals that of a sample of the same
task kept before it. Kept episodes become chat rows for
``SFTTrainer``: ``messages`` as the episode keeps them (assistant ``tool_calls`` with JSON-string
``arguments``, ``tool`` results, simulated-user turns) and ``tools`` as a JSON string. Both are strings on
purpose: Arrow merges dict columns across rows into one struct, so a dict-valued row would render with the
other rows' keys as nulls (docs/stack-notes.md).

``train_sft`` trains with ``assistant_only_loss=True``: the chat template's ``{% generation %}`` spans (the
assistant's text, tool calls and closing ``<|im_end|>``) carry the loss; system, user, simulated-user and tool
tokens do not. Settings from ``cfg.sft``: ``max_steps``, ``batch_size`` (conversations per optimizer step, all
processes together), ``learning_rate``, ``max_length`` (tokens; longer conversations are truncated).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from acl_lib.envs.base import Environment, Task
from acl_lib.eval.harness import run_episodes
from acl_lib.train import common

if TYPE_CHECKING:
    from acl_lib.config import Config

logger = logging.getLogger("acl.train.sft")

TeacherPolicy = Callable[[Task, list[dict]], str]


def episode_row(messages: list[dict], tools: list[dict]) -> dict:
    """One SFT row from an episode's messages: only the keys the chat template reads, strings throughout."""
    out = []
    for m in messages:
        msg = {"role": m["role"], "content": m.get("content") or ""}
        if m.get("tool_calls"):
            msg["tool_calls"] = [
                {"type": "function", "function": {
                    "name": c["function"]["name"],
                    "arguments": a if isinstance(a := c["function"]["arguments"], str) else json.dumps(a)}}
                for c in m["tool_calls"]
            ]
        if m["role"] == "tool":
            msg["name"] = m.get("name") or ""
        out.append(msg)
    return {"messages": out, "tools": json.dumps(tools)}


def assistant_text(messages: list[dict]) -> str:
    """Every assistant turn's text and tool calls, lowercased with whitespace collapsed: what two trajectories are
    compared on for duplicates (the cold start: equality within a task; SDFT: n-gram similarity within a domain)."""
    parts = []
    for m in messages:
        if m.get("role") != "assistant":
            continue
        parts.append(m.get("content") or "")
        for c in m.get("tool_calls") or []:
            f = c["function"]
            args = f["arguments"] if isinstance(f["arguments"], str) else json.dumps(f["arguments"], sort_keys=True)
            parts.append(f"{f['name']} {args}")
    return " ".join(" ".join(parts).lower().split())


def collect_demos(env: Environment, policy: TeacherPolicy, tasks: list[Task], max_turns: int = 16,
                  num_demos: int | None = None, batched: bool = False, batch_size: int = 64,
                  samples_per_task: int = 1, dedup: bool = False,
                  progress: Callable[[int], None] | None = None) -> tuple[list[dict], dict]:
    """Rejection sampling: ``samples_per_task`` teacher episodes per task, an episode kept if reward == 1.0 with
    no protocol error and (``dedup``) it is not a duplicate of a sample of the same task kept before it
    (``assistant_text`` equal).

    ``policy`` is a teacher ``(task, messages) -> text`` (a scripted expert), or with ``batched=True`` a batch
    policy of the evaluator (``acl_lib.eval.policies``: ``HFPolicy`` for a model teacher, which keeps each
    episode's KV cache across its turns). Episodes run ``batch_size`` tasks (all their samples) at a time through
    the evaluator's ``run_episodes``, all active episodes one turn per round; collection stops after the block in
    which ``num_demos`` rows were kept (all tasks when None). ``progress(n)`` is told of each finished episode.

    Returns ``(rows, stats)``. ``stats``: ``tasks`` tried, ``samples_per_task``, ``tried`` (episodes: tasks x
    samples), ``kept`` (rows returned), ``kept_fraction`` (kept / tried), ``duplicates``, ``surplus`` (passed, not
    duplicates, beyond ``num_demos`` in the last block: not used), ``rejected`` (failure reason -> episodes) and
    ``rejected_total``; kept + surplus + duplicates + rejected_total == tried.
    """
    batch_policy = policy if batched else (lambda batch: [policy(task, messages) for task, messages in batch])
    rows, reasons = [], Counter()
    n_tasks = duplicates = surplus = 0
    for start in range(0, len(tasks), batch_size):
        if num_demos is not None and len(rows) >= num_demos:
            break
        block = tasks[start : start + batch_size]
        if num_demos is not None and not batched:  # a scripted teacher costs nothing: try no more than needed
            block = block[: num_demos - len(rows)]
        episodes = [[env.start(task, max_turns=max_turns) for _ in range(samples_per_task)] for task in block]
        run_episodes(batch_policy, [ep for eps in episodes for ep in eps], batch_size=batch_size * samples_per_task,
                     progress=progress)
        n_tasks += len(block)
        for task, eps in zip(block, episodes):
            seen: set[str] = set()  # assistant texts already kept among these samples
            for ep in eps:
                r = ep.reward()
                if r < 1.0:
                    reasons[ep.failure or "reward below 1"] += 1
                elif ep.protocol_errors:
                    reasons["protocol error: " + ep.protocol_errors[0]] += 1
                elif dedup and (key := assistant_text(ep.messages)) in seen:
                    duplicates += 1
                elif num_demos is not None and len(rows) >= num_demos:
                    surplus += 1
                else:
                    if dedup:
                        seen.add(key)
                    rows.append(episode_row(ep.messages, task.tools))
    tried = n_tasks * samples_per_task
    stats = {"tasks": n_tasks, "samples_per_task": samples_per_task, "tried": tried, "kept": len(rows),
             "kept_fraction": len(rows) / tried if tried else 0.0, "duplicates": duplicates, "surplus": surplus,
             "rejected": dict(reasons.most_common()), "rejected_total": sum(reasons.values())}
    return rows, stats


def write_rows(rows: list[dict], path: Path) -> Path:
    """Save SFT rows as jsonl (the form multi-process jobs read them back in)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_rows(dataset: list[dict] | str | Path) -> list[dict]:
    if isinstance(dataset, (str, Path)):
        return [json.loads(line) for line in Path(dataset).read_text().splitlines() if line.strip()]
    return list(dataset)


# --- the cold start's stopping criterion ------------------------------------------------------------------


def tool_call_counts(episodes) -> dict:
    """The tool calls of finished ``episodes``: ``attempts`` (calls written, parsed or not), ``well_formed`` (calls
    that parsed, named a tool of the task and whose arguments fit its schema: attempts minus protocol errors),
    ``episodes_calling`` (episodes with at least one attempt) and ``well_formed_share`` (episodes with at least one
    call and none malformed, as a share of all: a model that stops calling tools does not pass)."""
    def calls(ep) -> int:
        return sum(len(m.get("tool_calls") or []) + len(m.get("malformed_calls") or [])
                   for m in ep.messages if m.get("role") == "assistant")

    attempts = sum(calls(ep) for ep in episodes)
    errors = sum(len(ep.protocol_errors) for ep in episodes)
    calling = [ep for ep in episodes if calls(ep)]
    clean = sum(not ep.protocol_errors for ep in calling)
    return {"episodes": len(episodes), "attempts": attempts, "well_formed": attempts - errors,
            "episodes_calling": len(calling), "well_formed_share": clean / len(episodes) if episodes else 0.0}


def check_tool_syntax(model, tok, env, tasks: list[Task], max_turns: int, max_new_tokens: int,
                      batch_size: int = 16) -> dict:
    """``tool_call_counts`` of greedy episodes of ``model`` (as it is now: the trainer's, mid-training) on
    ``tasks``, through the evaluator's engine, plus their mean ``reward``."""
    import torch

    from acl_lib.eval.policies import HFPolicy

    was_training = model.training
    model.eval()
    try:
        policy = HFPolicy.of_model(model, tok, max_new_tokens, batch_size=batch_size, name="cold start check")
        episodes = [env.start(task, max_turns=max_turns) for task in tasks]
        with torch.no_grad():
            run_episodes(policy, episodes, batch_size=batch_size)
        policy.close()
    finally:
        model.train(was_training)
    out = tool_call_counts(episodes)
    out["reward"] = sum(ep.reward() for ep in episodes) / len(episodes) if episodes else 0.0
    return out


def read_tasks(path: str | Path) -> list[Task]:
    return [Task.from_dict(json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]


def _stop_callback():
    from transformers import TrainerCallback

    class WellFormedStop(TrainerCallback):
        """Stop the cold start once ``threshold`` of the held-out training tasks' greedy episodes make well-formed
        tool calls only (``tool_call_counts``), checked every ``every`` optimizer steps: the study's criterion ("so
        the model learns tool syntax"), fixed before any run, instead of a step count chosen from downstream
        scores. ``sft.max_steps`` stays the cap. Each check is appended to ``checks_path`` (jsonl). Under several
        processes rank 0 checks, with the parameters gathered where ZeRO-3 partitions them (every rank takes part
        in the gather), and broadcasts its decision."""

        def __init__(self, threshold: float, every: int, check, checks_path: Path):
            self.threshold, self.every, self.check, self.path = threshold, every, check, Path(checks_path)

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % self.every and state.global_step < state.max_steps:
                return control  # checked every `every` steps, and at the last for the record
            import torch.distributed as dist

            distributed = dist.is_available() and dist.is_initialized()
            rank0 = not distributed or dist.get_rank() == 0
            with _gathered(model):
                row = self.check(model) if rank0 else None
            if distributed:
                box = [row]
                dist.broadcast_object_list(box, src=0)
                row = box[0]
            row = {"step": state.global_step, **row, "threshold": self.threshold}
            stop = row["well_formed_share"] >= self.threshold
            if rank0:
                with self.path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                logger.info("cold start check at step %d: %.0f%% of %d held-out episodes make well-formed tool "
                            "calls only (stop at %.0f%%)%s", state.global_step, 100 * row["well_formed_share"],
                            row["episodes"], 100 * self.threshold, ": stopping" if stop else "")
            if stop:
                control.should_training_stop = True
            return control

    return WellFormedStop


def _gathered(model):
    """Every parameter whole for the duration (ZeRO-3 partitions them across ranks; elsewhere a no-op)."""
    import contextlib

    params = [p for p in model.parameters() if hasattr(p, "ds_id")]
    if not params:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)


STOP_CHECKS = "stop_checks.jsonl"
MIN_HELDOUT = 8  # held-out rows at least, when sft.heldout_fraction is set


def split_heldout(rows: list[dict], fraction: float) -> tuple[list[dict], list[dict]]:
    """``(train, heldout)``: ``fraction`` of ``rows`` (at least ``MIN_HELDOUT``, and half at most) held out, evenly
    spaced so the training rows keep their order (SDFT's presentation orders); all rows train when 0."""
    if fraction <= 0:
        return list(rows), []
    n = min(len(rows) // 2, max(MIN_HELDOUT, round(fraction * len(rows))))
    if n <= 0:
        return list(rows), []
    picked = {round(i * len(rows) / n) for i in range(n)}
    return [r for i, r in enumerate(rows) if i not in picked], [r for i, r in enumerate(rows) if i in picked]


def _heldout_stop():
    from transformers import TrainerCallback

    class HeldOutStop(TrainerCallback):
        """Stop once the held-out loss has not reached a new low for ``patience`` evaluations in a row (the
        trainer evaluates every ``eval_every`` steps, ``train_sft``'s argument); ``losses`` keeps ``[step, loss]``
        of each."""

        def __init__(self, patience: int):
            self.patience, self.best, self.bad, self.losses = patience, float("inf"), 0, []
            self.best_step: int | None = None
            self.stopped_at: int | None = None

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            loss = (metrics or {}).get("eval_loss")
            if loss is None:
                return control
            self.losses.append([state.global_step, round(float(loss), 5)])
            if loss < self.best - 1e-4:
                self.best, self.bad, self.best_step = float(loss), 0, state.global_step
            else:
                self.bad += 1
            if self.bad >= self.patience:
                self.stopped_at = state.global_step
                control.should_training_stop = True
                logger.info("sft: held-out loss %.4f at step %d, no new low for %d evaluations (best %.4f at step %d)"
                            ": stopping", loss, state.global_step, self.bad, self.best, self.best_step)
            return control

    return HeldOutStop


def read_checks(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()] if path.exists() else []


def stop_summary(cfg: Config, path: Path, steps: int) -> dict:
    """What ``train_summary.json`` says of the stopping criterion: the threshold, the step it was reached at (None
    when the run ran to ``sft.max_steps`` without), the share at the last check and every check's step and share."""
    checks = read_checks(path)
    reached = next((c["step"] for c in checks if c["well_formed_share"] >= c["threshold"]), None)
    if reached is None and checks:
        logger.warning("cold start: %d steps without reaching %.0f%% well-formed episodes (last check %.0f%%)",
                       steps, 100 * cfg.sft.stop_at_well_formed, 100 * checks[-1]["well_formed_share"])
    return {"stop_at_well_formed": cfg.sft.stop_at_well_formed, "stopped_at_step": reached,
            "last_well_formed_share": checks[-1]["well_formed_share"] if checks else None,
            "checks": [[c["step"], round(c["well_formed_share"], 4)] for c in checks]}


MIN_SHARED_PREFIX = 64  # tokens: below this, sharing the prefix saves less than the extra forward call costs


def shared_prefix_length(input_ids, attention_mask, labels) -> int:
    """Length ``L`` of the prefix every row of a (right-padded) batch has in common, unpadded, and carrying no loss
    up to and including position ``L`` (the token after the prefix is predicted by the prefix's last position,
    which the shared forward does not keep). 0 when there is none."""
    import torch

    same = (input_ids == input_ids[:1]).all(0) & attention_mask.bool().all(0) & (labels == -100).all(0)
    if same.all():
        return max(0, int(same.numel()) - 1)
    first_diff = int(torch.nonzero(~same)[0, 0])
    return max(0, first_diff - 1)


def _prefix_shared_trainer():
    from trl import SFTTrainer

    class PrefixSharedSFTTrainer(SFTTrainer):
        """``SFTTrainer`` that encodes a batch's common prefix once (``sft.share_prefix``).

        The retail desk's conversations all open with the same ~1.9k tokens (the policy and 16 tool schemas) and
        differ after them; the loss sits on the assistant turns only. Encoding the prefix once per batch and
        attending to its key/value cache from every row gives the same loss and gradients (the cache stays in the
        autograd graph; a test checks both against the plain path) for a fraction of the compute. TRL's
        ``compute_loss`` cannot be told to do this; the subclass computes the same token-mean cross-entropy on the
        rows' suffixes and logs the metrics TRL logs (entropy, token accuracy, tokens). Batches with no shared
        prefix, and runs with activation checkpointing (which drops the cache), take TRL's own path.
        """

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            import torch

            ids, mask, labels = inputs.get("input_ids"), inputs.get("attention_mask"), inputs.get("labels")
            L = 0 if ids is None or mask is None or labels is None or ids.size(0) < 2 else \
                shared_prefix_length(ids, mask, labels)
            if return_outputs or L < MIN_SHARED_PREFIX or self.args.activation_checkpointing:
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            mode = "train" if self.model.training else "eval"
            head = model(input_ids=ids[:1, :L], attention_mask=mask[:1, :L], use_cache=True)
            cache = head.past_key_values
            cache.batch_repeat_interleave(ids.size(0))
            tail = model(input_ids=ids[:, L:], attention_mask=mask, cache=cache, use_cache=False)
            logp = torch.log_softmax(tail.logits[:, :-1].float(), dim=-1)
            target = labels[:, L + 1:]
            valid = target != -100
            tok = logp.gather(-1, target.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            n = valid.sum() if num_items_in_batch is None else num_items_in_batch
            loss = -(tok * valid).sum() / torch.as_tensor(n).clamp(min=1)
            if self.args.average_tokens_across_devices and num_items_in_batch is not None:
                loss = loss * self.accelerator.num_processes
            with torch.no_grad():
                entropy = -(logp.exp() * logp).sum(-1)
                correct = (logp.argmax(-1) == target) & valid
                num_valid = self.accelerator.gather_for_metrics(valid.sum()).sum()
                ent = self.accelerator.gather_for_metrics((entropy * valid).sum()).sum()
                hit = self.accelerator.gather_for_metrics(correct.sum()).sum()
            self._metrics[mode]["entropy"].append((ent / num_valid).item() if num_valid > 0 else 0.0)
            self._metrics[mode]["mean_token_accuracy"].append((hit / num_valid).item() if num_valid > 0 else 0.0)
            if mode == "train":
                self._total_train_tokens += self.accelerator.gather_for_metrics(mask.sum()).sum().item()
            self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
            self._metrics[mode]["shared_prefix_tokens"].append(float(L))
            return loss

    return PrefixSharedSFTTrainer


def sft_args(cfg: Config, out_dir, sequential: bool = False, by_length: bool = False, max_steps: int | None = None,
             eval_every: int = 0):
    """``SFTConfig`` from ``cfg.sft``. ``sequential``: present the rows in dataset order (transformers'
    ``train_sampling_strategy="sequential"``; TRL's ``shuffle_dataset`` is off already) instead of the trainer's
    random sampler: SDFT's presentation orders (``acl_lib.consolidate.sdft``). ``by_length``: batches of rows of
    similar length (``"group_by_length"``), so a mixture of 100-token and 2,000-token rows is not padded to the
    longest in every batch (mid-training, ``acl_lib.train.midtrain``). ``eval_every``: the held-out rows' loss
    every that many steps (``train_sft``'s ``heldout_fraction``; 0: no evaluation)."""
    from trl import SFTConfig

    s = cfg.sft
    kw = common.trainer_kwargs(cfg, out_dir, max_steps=s.max_steps if max_steps is None else max_steps,
                               batch_size=s.batch_size, learning_rate=s.learning_rate, scheduler="cosine")
    if sequential and by_length:
        raise ValueError("an SFT run is presented either in order or grouped by length, not both")
    if sequential:
        kw["train_sampling_strategy"] = "sequential"
    elif by_length:
        kw["train_sampling_strategy"] = "group_by_length"
    if eval_every:
        kw.update(eval_strategy="steps", eval_steps=eval_every,
                  per_device_eval_batch_size=kw["per_device_train_batch_size"])
    return SFTConfig(**kw, assistant_only_loss=True, max_length=s.max_length, packing=False,
                     dataset_num_proc=None)


def sft_steps(s, n_rows: int) -> int:
    """The optimizer steps an SFT run on ``n_rows`` conversations takes: ``s.max_steps``, capped at ``s.max_epochs``
    passes over the rows where that is set (``sft.max_epochs``)."""
    if s.max_epochs <= 0 or n_rows <= 0:
        return s.max_steps
    return min(s.max_steps, max(1, math.ceil(s.max_epochs * n_rows / s.batch_size)))


def train_sft(cfg: Config, model_dir: str | Path, dataset: list[dict] | str | Path, out_dir: str | Path,
              sequential: bool = False, by_length: bool = False, domain: str | None = None,
              check_tasks: str | Path | None = None, heldout_fraction: float = 0.0, eval_every: int = 10,
              patience: int = 2) -> dict:
    """SFT the model in ``model_dir`` on chat rows (a list, or a jsonl path) into ``<out_dir>/model``;
    ``sequential``: in the rows' order rather than shuffled; ``by_length``: in batches of similar length (``sft_args``).
    With ``check_tasks`` (a jsonl of tasks of world ``domain``) and ``sft.stop_at_well_formed`` set, the run stops
    at the first check where that share of their greedy episodes makes well-formed tool calls only
    (``WellFormedStop``; the checks in ``stop_checks.jsonl``). With ``heldout_fraction`` (SDFT's "until its SFT
    loss stops falling on held-out samples") that share of the rows (``split_heldout``) is held out, its loss
    measured every ``eval_every`` steps, and the run stops after ``patience`` measurements without a new low
    (``HeldOutStop``); ``sft.max_steps`` stays the cap.

    Writes ``train_log.jsonl``, ``train_summary.json``, ``checkpoints/`` (resumed from) and ``model/`` into
    ``out_dir``; returns the summary.
    """
    from datasets import Dataset
    from trl import SFTTrainer

    common.set_threads(cfg)
    rows = read_rows(dataset)
    if not rows:
        raise ValueError("no SFT rows: rejection sampling kept nothing")
    rows, heldout = split_heldout(rows, heldout_fraction)
    steps = sft_steps(cfg.sft, len(rows))
    # The arguments first: under ZeRO-3 they register the DeepSpeed config, so the model loads partitioned.
    args = sft_args(cfg, out_dir, sequential, by_length, max_steps=steps,
                    eval_every=eval_every if heldout else 0)
    model, tok = common.load_model_and_tokenizer(model_dir, cfg)
    zero3_loaded = common.zero3_loaded(model)
    log = common.make_jsonl_logger(Path(out_dir) / common.TRAIN_LOG, extra={"job": "sft"})
    cls = _prefix_shared_trainer() if cfg.sft.share_prefix else SFTTrainer
    callbacks, stopper, early = [log], None, None
    s = cfg.sft
    if heldout:
        early = _heldout_stop()(patience)
        callbacks.append(early)
    if check_tasks is not None and s.stop_at_well_formed > 0:
        from acl_lib.train.trl_env import make_env  # the trainers' layer: imported when a check is asked for

        env, tasks = make_env(domain, cfg), read_tasks(check_tasks)
        check = lambda m: check_tool_syntax(m, tok, env, tasks, cfg.grpo.max_turns,  # noqa: E731
                                            cfg.grpo.max_new_tokens, batch_size=len(tasks))
        stopper = _stop_callback()(s.stop_at_well_formed, s.stop_check_every, check,
                                   Path(out_dir) / STOP_CHECKS)
        callbacks.append(stopper)
    trainer = cls(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                  callbacks=callbacks, eval_dataset=Dataset.from_list(heldout) if heldout else None)
    trainer.acl_zero3_loaded = zero3_loaded
    common.show_progress(trainer, "sft")
    if len(trainer.train_dataset) == 0:  # TRL drops rows whose assistant turns were all cut off
        raise ValueError(f"all {len(rows)} SFT conversations lost every assistant token to truncation at "
                         f"sft.max_length={cfg.sft.max_length} tokens; raise sft.max_length")
    n_tokens = sum(len(x) for x in trainer.train_dataset["input_ids"])
    # Conversations longer than max_length lose their ends (often the final answer): count them.
    n_cut = sum(len(x) >= cfg.sft.max_length for x in trainer.train_dataset["input_ids"])
    if n_cut:
        logger.warning("SFT: %d of %d conversations truncated at sft.max_length=%d tokens",
                           n_cut, len(rows), cfg.sft.max_length)
    t0 = time.perf_counter()
    trainer.train(resume_from_checkpoint=common.last_checkpoint(out_dir))
    wall = time.perf_counter() - t0
    common.save_final_model(trainer, tok, out_dir)
    stop = stop_summary(cfg, Path(out_dir) / STOP_CHECKS, trainer.state.global_step) if stopper else {}
    if early is not None:
        stop.update(heldout_rows=len(heldout), heldout_losses=early.losses, heldout_best_step=early.best_step,
                    stopped_at_step=early.stopped_at)
    summary = common.summarize(common.read_log(Path(out_dir) / common.TRAIN_LOG), wall, job="sft", **stop,
                               rows_per_step=cfg.sft.batch_size,
                               rows=len(rows), dataset_tokens=n_tokens, truncated_rows=n_cut, planned_steps=steps,
                               epochs=round(steps * cfg.sft.batch_size / len(rows), 3),
                               **common.distributed_info(trainer))
    return common.write_summary(trainer, out_dir, summary)
