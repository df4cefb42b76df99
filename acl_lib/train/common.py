"""What the three trainers (pretrain, SFT, GRPO) share: trainer arguments, logging, checkpoints, saving.

Trainers know nothing of the run store: each takes an output directory ``out_dir`` and returns a summary
(``train_summary.json``). The caller that owns the directory (``acl_lib.pipeline``) marks and cleans it.

- ``trainer_kwargs(cfg, out_dir, ...)``: the ``TrainingArguments`` fields every job sets the same way (CPU-safe
  precision, activation checkpointing as ``launcher.activation_checkpointing`` says, checkpoints under
  ``<out_dir>/checkpoints``, the DeepSpeed config when the job runs under the ``deepspeed`` launcher, logging
  every step, no external reporters).
- ``JsonlLogger``: a ``TrainerCallback`` that appends every ``Trainer.log`` record to ``train_log.jsonl`` in the
  run directory with wall time and throughput; the loss / reward curves are read from there.
- ``save_final_model``: the end of every job: the trained model and tokenizer written atomically to
  ``<out_dir>/model`` (collective under ZeRO-3, written by the main process only).

Heavy imports (torch, transformers) stay inside functions so importing ``acl_lib.train`` is instant.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from acl_lib.atomic import atomic_dir, write_json
from acl_lib.config import micro_batches  # one split rule: the config checks it at load, the trainers use it
from acl_lib.progress import Progress
from acl_lib.seeding import follow_thread_share, set_torch_threads

if TYPE_CHECKING:
    from acl_lib.config import Config

log = logging.getLogger(__name__)

# Set by the launcher in every worker process of a multi-process / multi-node job: the DeepSpeed config the
# trainers pass to ``TrainingArguments(deepspeed=...)``. Unset in-process.
DS_CONFIG_ENV = "ACL_DEEPSPEED_CONFIG"

TRAIN_LOG = "train_log.jsonl"
TRAIN_SUMMARY = "train_summary.json"
CHECKPOINTS = "checkpoints"  # resumable checkpoint-N folders inside a job's output directory


def checkpoint_dir(out_dir: str | Path) -> Path:
    """``<out_dir>/checkpoints`` (created): where a job writes and resumes from ``checkpoint-N`` folders."""
    d = Path(out_dir) / CHECKPOINTS
    d.mkdir(parents=True, exist_ok=True)
    return d


def world_size() -> int:
    """Number of training processes of this job (``WORLD_SIZE`` set by torchrun / deepspeed / accelerate)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def set_threads(cfg: Config) -> None:
    """Cap intra-op threads at this rank's share of its node's ``cfg.torch_threads`` (``seeding.threads_per_rank``:
    divided by the ranks on this node, not the whole job; 0 = all cores). Oversubscribed cores slow every process
    down several-fold; a single thread per rank starves the CPU-side work of a GPU job (data collation, tokenising,
    the reward functions, the environments' tool calls)."""
    set_torch_threads(cfg.torch_threads)


def trainer_kwargs(cfg: Config, out_dir, *, max_steps: int, batch_size: int, learning_rate: float,
                   warmup_steps: int = 0, scheduler: str = "linear", save_steps: int | None = None,
                   micro_batch_size: int = 0) -> dict:
    """Keyword arguments shared by ``TrainingArguments`` / ``SFTConfig`` / ``GRPOConfig``.

    ``batch_size`` is the global number of sequences per optimizer step; it is split evenly over the
    processes of the job (each process gets ``batch_size // world_size``), taken ``micro_batch_size`` at a time
    with gradient accumulation where that is set (``micro_batches``).
    """
    ws = world_size()
    per_device, accumulation = micro_batches(batch_size, ws, micro_batch_size)
    bf16 = cfg.launcher.mixed_precision == "bf16"
    fp16 = cfg.launcher.mixed_precision == "fp16"
    kw: dict[str, Any] = dict(
        output_dir=str(checkpoint_dir(out_dir)),
        max_steps=max_steps,
        per_device_train_batch_size=per_device,
        gradient_accumulation_steps=accumulation,
        learning_rate=learning_rate,
        warmup_steps=warmup_steps,
        lr_scheduler_type=scheduler,
        # Set explicitly: GRPOConfig turns checkpointing on and autodetects bf16 (docs/stack-notes.md).
        # transformers 5.24 renamed gradient_checkpointing; the old name (TRL's default True) mirrors this one.
        activation_checkpointing=cfg.launcher.activation_checkpointing,
        bf16=bf16,
        fp16=fp16,
        use_cpu=not has_cuda(),
        logging_steps=1,
        save_strategy="steps",
        save_steps=save_steps or max(1, max_steps // 4),
        save_total_limit=2,
        report_to="none",
        seed=cfg.seed,
        data_seed=cfg.seed,
        dataloader_num_workers=0,
        disable_tqdm=True,  # progress: show_progress() (one line per job, not a redraw per step)
        ddp_timeout=cfg.launcher.collective_timeout_s,
    )
    if cfg.launcher.activation_checkpointing:
        # Non-reentrant checkpointing: works with frozen inputs (LoRA, PEFT) and under ZeRO-3's parameter hooks.
        kw["activation_checkpointing_kwargs"] = {"use_reentrant": False}
    ds_config = os.environ.get(DS_CONFIG_ENV)
    if ds_config:
        kw["deepspeed"] = ds_config
    return kw


def checkpoint_problem(ckpt: str | Path) -> str | None:
    """Why ``ckpt`` (a ``checkpoint-<step>`` folder) is not a checkpoint whose save completed, or None.

    ``Trainer._save_checkpoint`` writes the weights (``save_model``), then the optimizer, scheduler and RNG
    states (under DeepSpeed: ``engine.save_checkpoint`` into ``global_step<N>/``, whose ``latest`` tag file is
    written only after every rank's shards, then a barrier), and ``trainer_state.json`` last. So a save cut off
    anywhere lacks a readable ``trainer_state.json``; a DeepSpeed checkpoint must also have its ``latest`` tag
    naming an existing folder (what ``engine.load_checkpoint`` opens), and one without DeepSpeed state a weights
    file (what ``Trainer._load_from_checkpoint`` loads: full or sharded, safetensors or bin, or a PEFT adapter).
    """
    from transformers import utils as hf
    from transformers.trainer import TRAINER_STATE_NAME

    ckpt = Path(ckpt)
    try:
        json.loads((ckpt / TRAINER_STATE_NAME).read_text())
    except (OSError, ValueError):
        return f"no readable {TRAINER_STATE_NAME}"
    if any(ckpt.glob("global_step*")):  # DeepSpeed state
        latest = ckpt / "latest"
        if not latest.is_file():
            return "DeepSpeed state without its 'latest' tag file"
        tag = latest.read_text().strip()
        if not tag or not (ckpt / tag).is_dir():
            return f"DeepSpeed 'latest' tag {tag!r} names no folder"
        return None
    weights = (hf.SAFE_WEIGHTS_NAME, hf.SAFE_WEIGHTS_INDEX_NAME, hf.WEIGHTS_NAME, hf.WEIGHTS_INDEX_NAME,
               hf.ADAPTER_SAFE_WEIGHTS_NAME, hf.ADAPTER_WEIGHTS_NAME)
    if not any((ckpt / w).is_file() for w in weights):
        return "no model weights file"
    return None


def last_checkpoint(out_dir) -> str | None:
    """The newest ``checkpoint-<step>`` folder under ``<out_dir>/checkpoints`` whose save completed
    (``checkpoint_problem``): a crashed job resumes from it. Newer folders whose save was cut off are skipped
    with a warning naming them and left in place (the next save of that step writes over them)."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    d = Path(out_dir) / CHECKPOINTS
    if not d.is_dir():
        return None
    steps = {}
    for c in d.iterdir():
        m = re.fullmatch(PREFIX_CHECKPOINT_DIR + r"-(\d+)", c.name)
        if m and c.is_dir():
            steps[int(m.group(1))] = c
    for step in sorted(steps, reverse=True):
        problem = checkpoint_problem(steps[step])
        if problem is None:
            return str(steps[step])
        log.warning("not resuming from %s: its save did not complete (%s)", steps[step], problem)
    return None


class _Timer:
    def __init__(self):
        self.t0 = time.perf_counter()

    def __call__(self) -> float:
        return time.perf_counter() - self.t0


def make_jsonl_logger(path: Path, tokens_per_step: int | None = None, extra: dict | None = None):
    """A ``TrainerCallback`` appending each ``Trainer.log`` record to ``path`` (one JSON object per line).

    Every record gets ``step``, ``wall_s`` (seconds since training began) and throughput over the wall-clock
    seconds since the previous record: ``tokens_per_s`` (training tokens: ``tokens_per_step`` when given, as
    for packed pretraining, else the growth of TRL's cumulative ``num_tokens``) and, for GRPO,
    ``gen_tokens_per_s`` (completion tokens: ``completions/mean_length`` x completions per step; the seconds
    include generation and update). Only the main process writes.
    """
    from transformers import TrainerCallback

    class JsonlLogger(TrainerCallback):
        def __init__(self):
            self.path = Path(path)
            self.timer = None
            self.last_t = 0.0
            self.last_step = 0
            self.last_tokens = 0.0

        def on_train_begin(self, args, state, control, **kw):
            self.timer = _Timer()
            self.last_step = state.global_step
            self.last_tokens = float(state.num_input_tokens_seen or 0)

        def on_log(self, args, state, control, logs=None, **kw):
            if not state.is_world_process_zero or not logs:
                return
            t = self.timer() if self.timer else 0.0
            rec = {"step": state.global_step, "wall_s": round(t, 3), **(extra or {})}
            rec.update({k: (float(v) if isinstance(v, (int, float)) else v) for k, v in logs.items()})
            dt, dsteps = t - self.last_t, state.global_step - self.last_step
            if dt > 0 and dsteps > 0:
                if tokens_per_step:
                    rec["tokens_per_s"] = tokens_per_step * dsteps / dt
                elif "num_tokens" in logs:  # TRL logs the cumulative tokens seen (all processes)
                    rec["tokens_per_s"] = (logs["num_tokens"] - self.last_tokens) / dt
                if "completions/mean_length" in logs:  # GRPO: tokens the policy generated
                    n = args.per_device_train_batch_size * args.world_size
                    rec["gen_tokens_per_s"] = logs["completions/mean_length"] * n * dsteps / dt
            if "num_tokens" in logs:
                self.last_tokens = logs["num_tokens"]
            self.last_t, self.last_step = t, state.global_step
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(json.dumps(rec) + "\n")

    return JsonlLogger()


def show_progress(trainer, desc: str):
    """Replace the trainer's own progress display (a tqdm bar in a terminal, a table of every logged step in a
    notebook) and its printer of log dicts by one ``acl_lib.progress.Progress`` line: steps done of the total,
    the last loss or reward, the time left. The log records themselves are in ``train_log.jsonl``."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from transformers.utils.notebook import NotebookProgressCallback

    class ProgressLine(TrainerCallback):
        def __init__(self):
            self.bar = None

        def on_train_begin(self, args, state, control, **kw):
            if state.is_world_process_zero:
                self.bar = Progress(state.max_steps, desc, unit="step", initial=state.global_step)

        def on_step_begin(self, args, state, control, **kw):
            follow_thread_share()  # both cores once the notebook beside this one has ended (acl run --jobs)

        def on_step_end(self, args, state, control, **kw):
            if self.bar is not None:
                self.bar.set(state.global_step, log=False)  # the log line waits for the step's loss (on_log)

        def on_log(self, args, state, control, logs=None, **kw):
            if self.bar is not None and logs:
                stats = {k: float(logs[k]) for k in ("loss", "reward") if isinstance(logs.get(k), (int, float))}
                if stats:
                    self.bar.set(state.global_step, **stats)

        def on_train_end(self, args, state, control, **kw):
            if self.bar is not None:
                self.bar.close()
                self.bar = None

    for cb in (PrinterCallback, ProgressCallback, NotebookProgressCallback):
        trainer.remove_callback(cb)
    trainer.add_callback(ProgressLine())
    return trainer


def read_log(path: Path) -> list[dict]:
    """The records of a ``train_log.jsonl`` (empty list if absent)."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(log: list[dict], wall_s: float, **extra) -> dict:
    """``train_summary.json``: first/last loss, steps, wall seconds, mean throughput (from the log records)."""
    losses = [r["loss"] for r in log if "loss" in r]
    tps = [r["tokens_per_s"] for r in log if "tokens_per_s" in r]
    gtps = [r["gen_tokens_per_s"] for r in log if "gen_tokens_per_s" in r]
    rewards = [r["reward"] for r in log if "reward" in r]
    out = {
        "steps": max((r["step"] for r in log), default=0),
        "wall_s": round(wall_s, 3),
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "tokens_per_s": sum(tps) / len(tps) if tps else None,
        "gen_tokens_per_s": sum(gtps) / len(gtps) if gtps else None,
        "first_reward": rewards[0] if rewards else None,
        "last_reward": rewards[-1] if rewards else None,
    }
    out.update(extra)
    return out


def distributed_info(trainer) -> dict:
    """How the job ran: processes, device, DeepSpeed ZeRO stage (None without DeepSpeed), precision."""
    ds = getattr(trainer.args, "hf_deepspeed_config", None) if trainer.is_deepspeed_enabled else None
    return {
        "world_size": trainer.args.world_size,
        "device": str(trainer.args.device),
        "deepspeed_zero_stage": ds.config["zero_optimization"]["stage"] if ds is not None else None,
        "bf16": bool(trainer.args.bf16),
        # ZeRO-3: whether the weights were loaded partitioned (zero.Init) rather than whole on every rank
        "zero3_partitioned_load": getattr(trainer, "acl_zero3_loaded", None),
    }


def save_final_model(trainer, tokenizer, out_dir, rel: str = "model") -> Path:
    """Write the trained model + tokenizer to ``<out_dir>/<rel>`` atomically; returns that path.

    Every process calls this: under ZeRO-3 ``save_model`` gathers the sharded weights (a collective); only the
    main process writes, through ``atomic_dir`` so a crash never leaves a half-written model looking done.
    """
    main = trainer.is_world_process_zero()
    ctx = atomic_dir(Path(out_dir) / rel) if main else nullcontext(None)
    with ctx as tmp:
        # Non-main ranks only take part in the gather; ``save_model`` writes on the main process only.
        trainer.save_model(str(tmp) if tmp is not None else str(Path(out_dir) / f".{rel}.rank"))
        if main:
            tokenizer.save_pretrained(str(tmp))
            # The generation config carries eos = <|im_end|>: generation must stop where the template ends a turn.
            gc = trainer.model.generation_config if hasattr(trainer.model, "generation_config") else None
            if gc is not None:
                gc.save_pretrained(str(tmp))
    trainer.accelerator.wait_for_everyone()
    return Path(out_dir) / rel


def load_model_and_tokenizer(model_dir: str | Path, cfg: Config | None = None):
    """``(model, tokenizer)`` from a saved directory or hub id, in ``cfg.model.dtype``, with the chat
    conventions the trainers rely on (eos ``<|im_end|>``, left padding, response template).

    A trainer's arguments must exist before this is called under DeepSpeed ZeRO-3 (``TrainingArguments``
    registers the DeepSpeed config): the weights then load partitioned (``deepspeed.zero.Init``) instead of a
    whole copy in every rank's host memory (16 GB a rank for an 8B model in bf16). ``zero3_loaded`` says which.
    ``zero.Init`` reads the world size from DeepSpeed's own communication layer, which is set up by
    ``deepspeed.init_distributed`` only (torch's process group, which accelerate starts, is not enough: without it
    DeepSpeed sees one process and fails its batch-size check), so that is called first.
    """
    from transformers.integrations import is_deepspeed_zero3_enabled

    from acl_lib.model.build import load_model_and_tokenizer as load  # torch and transformers: loaded with a model

    if is_deepspeed_zero3_enabled():
        import deepspeed

        deepspeed.init_distributed()  # a no-op when DeepSpeed's layer is up; joins torch's group when that is
    return load(model_dir, dtype=cfg.model.dtype if cfg is not None else "float32")


def load_tokenizer(model_dir: str | Path):
    """The tokenizer alone (``load_model_and_tokenizer``'s), to build a trainer's arguments before its model."""
    from acl_lib.model.build import load_tokenizer as load

    return load(model_dir)


def zero3_loaded(model) -> bool:
    """Whether ``model``'s weights were loaded partitioned by ZeRO-3 (each parameter a DeepSpeed shard)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def write_summary(trainer, out_dir, summary: dict) -> dict:
    """Write ``<out_dir>/train_summary.json`` (main process) and return the summary."""
    if trainer.is_world_process_zero():
        write_json(Path(out_dir) / TRAIN_SUMMARY, summary)
    return summary


def write_summary_main(summary: dict, out_dir) -> dict:
    """Write ``<out_dir>/train_summary.json`` from the main process (no trainer at hand) and return it."""
    if is_main_process():
        write_json(Path(out_dir) / TRAIN_SUMMARY, summary)
    return summary
