"""MMOPD's memory plan: one trained student plus four frozen teachers, per GPU and per node.

``teacher_placement: resident`` keeps every teacher on the training device (mini, and any model small enough);
``offload`` keeps them on the CPU and moves one teacher to the device for the rows routed to it, then back, so the
device holds one teacher at a time (the paper profile's plan for four 8B teachers beside an 8B student under
ZeRO-3). ``run_mmopd`` writes the rendered plan beside the job before it launches (``write_memory_plan``:
``<run>/launch/memory_plan.md``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from acl_lib import pipeline
from acl_lib.model.checkpoint_files import checkpoint_parameter_count
from acl_lib.train.launcher import LAUNCH_DIR

if TYPE_CHECKING:
    from acl_lib.config import Config

DIVERGENCE_COPIES = 8  # float32 (chunk x vocabulary) tensors alive at once in a chunk of chunked_hybrid_kl: both
# heads' logits, both log-softmaxes, p and q, the reverse-KL product and its gradient


VLLM_GPU_FRACTION = 0.3  # TRL's GRPOConfig.vllm_gpu_memory_utilization default: the colocated engine's share


def memory_plan(cfg: Config, n_params: int, n_teachers: int = 4, vocab_size: int | None = None,
                hidden_size: int | None = None) -> dict:
    """Per-GPU and per-node memory of one student and ``n_teachers`` teachers of ``n_params`` parameters each,
    for ``cfg.launcher`` (GPUs = nodes x processes) and ``cfg.mmopd.teacher_placement``; GiB. Activations and the
    KV cache of the student's own passes come on top (they depend on the sequence lengths).

    GPU: the student under ZeRO-3, bf16 weights and gradients, fp32 master weights and Adam moments (16 bytes per
    parameter) sharded over every GPU, and ZeRO-3's gather buffers (the parameters gathered at once for a forward,
    at most ``stage3_max_live_parameters`` of the shipped config, in bf16, and the prefetch bucket, transformers'
    ``auto``: 0.9 x hidden^2). Resident teachers: bf16 weights, whole on every GPU (each rank holds its own
    ``TeacherPool``, loaded outside ZeRO-3). Offloaded teachers: bf16 weights in CPU memory, a copy per process,
    one teacher whole on the GPU while its rows are scored, and every teacher's head kept there (the chunked loss's
    backward recomputes teacher logits). With ``vocab_size`` and ``hidden_size``: the divergence's working memory,
    ``DIVERGENCE_COPIES`` float32 (``mmopd.chunk_tokens`` x vocabulary) tensors (``chunked_hybrid_kl``), and those
    teacher heads. With vLLM rollouts (``grpo.use_vllm``): the colocated engine, awake for the whole multi-turn
    rollout (``grpo.vllm_kwargs``), holds ``VLLM_GPU_FRACTION`` of a GPU's ``launcher.gpu_memory_gib`` (its
    weights and KV cache).

    Host, per node: the offloaded teachers (a copy per process) and the student as each process loads it: its
    ZeRO-3 shard in bf16 (the trainer's arguments are made first, so transformers loads through ``zero.Init``;
    ``train_summary.json``'s ``zero3_partitioned_load`` says whether it did), a whole bf16 copy per process
    otherwise."""
    gib = 1024**3
    gpus = cfg.launcher.num_nodes * cfg.launcher.num_processes
    zero3 = cfg.launcher.zero_stage == 3
    student = 16 * n_params / (gpus if zero3 else 1) / gib
    one_teacher = 2 * n_params / gib
    if cfg.mmopd.teacher_placement == "resident":
        teachers_gpu = n_teachers * one_teacher
        cpu = 0.0
    else:
        teachers_gpu = one_teacher
        cpu = cfg.launcher.num_processes * n_teachers * one_teacher
    student_host = cfg.launcher.num_processes * 2 * n_params / (gpus if zero3 else 1) / gib
    divergence = heads = gather = 0.0
    if vocab_size and hidden_size:
        divergence = DIVERGENCE_COPIES * cfg.mmopd.chunk_tokens * vocab_size * 4 / gib
        if cfg.mmopd.teacher_placement == "offload":
            heads = (n_teachers - 1) * 2 * vocab_size * hidden_size / gib  # the routed one's is in one_teacher
        if zero3:
            zero = _zero3_settings(cfg)
            live = min(float(zero.get("stage3_max_live_parameters", n_params)), n_params)
            gather = 2 * (live + 0.9 * hidden_size**2) / gib
    gpu_gib = cfg.launcher.gpu_memory_gib
    vllm = VLLM_GPU_FRACTION * gpu_gib if cfg.grpo.use_vllm else 0.0
    total = student + teachers_gpu + heads + divergence + gather + vllm
    return {"gpus": gpus, "zero_stage": cfg.launcher.zero_stage, "placement": cfg.mmopd.teacher_placement,
            "n_params": n_params, "student_gib_per_gpu": student, "teachers_gib_per_gpu": teachers_gpu + heads,
            "divergence_gib_per_gpu": divergence, "chunk_tokens": cfg.mmopd.chunk_tokens,
            "zero3_gather_gib_per_gpu": gather, "vllm_gib_per_gpu": vllm, "gpu_gib": gpu_gib,
            "total_gib_per_gpu": total, "teachers_cpu_gib_per_node": cpu,
            "student_cpu_gib_per_node": student_host, "host_gib_per_node": cpu + student_host}


def _zero3_settings(cfg: Config) -> dict:
    """The ``zero_optimization`` section of the DeepSpeed config the launcher ships for ``cfg.launcher``."""
    from acl_lib.train.launcher import deepspeed_config

    return json.loads(deepspeed_config(cfg).read_text()).get("zero_optimization", {})


def memory_plan_for(cfg: Config, n_teachers: int = 4) -> dict:
    """``memory_plan`` for this profile's student: ``seq_final``'s checkpoint when it exists, else the base model's."""
    final = pipeline.final_run(cfg)
    source = final.path / "model" if final.is_complete() else pipeline.model_dir(pipeline.base_run(cfg))
    return memory_plan(cfg, checkpoint_parameter_count(source), n_teachers, *_vocab_and_width(source))


def _vocab_and_width(model_dir) -> tuple[int | None, int | None]:
    """(vocab_size, hidden_size) from a checkpoint's config.json (its text config), or Nones when it has none."""
    path = Path(model_dir) / "config.json"
    conf = json.loads(path.read_text()) if path.is_file() else {}
    conf = conf.get("text_config", conf)
    return conf.get("vocab_size"), conf.get("hidden_size")


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
        f"| ZeRO-3 gather buffers (live parameters and prefetch bucket, bf16) | "
        f"{plan.get('zero3_gather_gib_per_gpu', 0.0):.3g} |",
        f"| colocated vLLM engine, awake through a multi-turn rollout ({VLLM_GPU_FRACTION:g} of "
        f"{plan.get('gpu_gib', 80.0):g} GiB) | {plan.get('vllm_gib_per_gpu', 0.0):.3g} |",
        f"| total per GPU (before the student's activations and KV cache) | {plan['total_gib_per_gpu']:.3g} |",
        f"| teachers in CPU memory per node (a copy per process) | {plan['teachers_cpu_gib_per_node']:.3g} |",
        f"| student in CPU memory per node while loading (ZeRO-3: each process its shard) | "
        f"{plan.get('student_cpu_gib_per_node', 0.0):.3g} |",
        f"| host memory per node, in all | {plan.get('host_gib_per_node', plan['teachers_cpu_gib_per_node']):.3g} |",
        "",
    ])


def write_memory_plan(cfg: Config, out_dir, model_dir, n_teachers: int) -> Path:
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
