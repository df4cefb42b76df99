"""MMOPD, multi-teacher mixed on-policy distillation (notebook 08): the sequential endpoint learns back from the
frozen stage checkpoints on its own rollouts.

    student  seq_final (the last stage of the curriculum)
    teachers seq_math, seq_search, seq_ecom, seq_if (frozen); each prompt is scored by the one that owns its domain
    prompts  a mixture of every stage's training prompts (``mmopd.mixture``)
    loss     per policy token: KL(student || teacher) over the vocabulary (reverse KL), plus
             ``forward_weight`` x KL(teacher_top_q || student) where the teacher's entropy exceeds ``alpha``

    run = run_mmopd(cfg, mmopd_spec(cfg))                      # <seed_dir>/mmopd/model + mmopd/eval/metrics.json
    run = run_mmopd(cfg, mmopd_spec(cfg, "mmopd_rkl", alpha=None))   # alpha = infinity: plain reverse-KL OPD
    run = run_mmopd(cfg, single_teacher_spec(cfg))             # teacher seq_search, student seq_ecom, search prompts
    for spec in run_specs(cfg):                                # mmopd and the ablations the config turns on
        run_mmopd(cfg, spec)
    plan = memory_plan_for(cfg)                                # GiB per GPU and per node (render_memory_plan)

The student generates whole multi-turn episodes in the real environments through the stages' GRPO rollout
machinery; the routed teacher is run on the student's own tokens and the loss is taken at policy tokens only
(``training.py`` says why a ``GRPOTrainer`` subclass; ``loss.py`` gives the loss). ``run_mmopd`` writes the memory
plan beside the job before it launches (``<run>/launch/memory_plan.md``).

Modules, each one job (every name is importable from here):

    specs.py     DistillSpec, the study's distillation and its ablations (mmopd_spec, single_teacher_spec,
                 run_specs) and the run each is keyed on (distill_run)
    loss.py      the hybrid KL (hybrid_kl; chunked_hybrid_kl, from hidden states) and the routing of rows (route)
    teachers.py  TeacherPool: the frozen teachers, resident on the device or offloaded to the CPU
    training.py  the launcher's job mmopd (train_mmopd: the GRPOTrainer subclass, distill_cfg, distill_args, the
                 prompt mixture) and run_mmopd (memory plan, job, moved.json, evaluation)
    memory.py    the memory plan (memory_plan, memory_plan_for, render_memory_plan, write_memory_plan)
    tables.py    what notebook 08 shows: the specs, the training curves, the single-teacher ablation, a reading
"""

from __future__ import annotations

from acl_lib.consolidate.mmopd.loss import chunked_hybrid_kl, hybrid_kl, hybrid_terms, route
from acl_lib.consolidate.mmopd.memory import (
    DIVERGENCE_COPIES,
    VLLM_GPU_FRACTION,
    memory_plan,
    memory_plan_for,
    render_memory_plan,
    write_memory_plan,
)
from acl_lib.consolidate.mmopd.specs import (
    MMOPD_SECTIONS,
    DistillSpec,
    distill_run,
    mmopd_spec,
    run_specs,
    single_teacher_spec,
)
from acl_lib.consolidate.mmopd.tables import (
    distill_reading,
    single_teacher_frame,
    specs_frame,
    train_log_figure,
    train_log_frame,
)
from acl_lib.consolidate.mmopd.teachers import TeacherPool
from acl_lib.consolidate.mmopd.training import (
    NUM_GENERATIONS,
    PROMPT_SEED_OFFSET,
    RoutedEnvironment,
    distill_args,
    distill_cfg,
    movement,
    prompt_tasks,
    prompts_per_domain,
    run_mmopd,
    train_mmopd,
)

__all__ = [
    # specs
    "MMOPD_SECTIONS", "DistillSpec", "distill_run", "mmopd_spec", "run_specs", "single_teacher_spec",
    # loss
    "chunked_hybrid_kl", "hybrid_kl", "hybrid_terms", "route",
    # teachers
    "TeacherPool",
    # training
    "NUM_GENERATIONS", "PROMPT_SEED_OFFSET", "RoutedEnvironment", "distill_args", "distill_cfg", "movement",
    "prompt_tasks", "prompts_per_domain", "run_mmopd", "train_mmopd",
    # memory
    "DIVERGENCE_COPIES", "VLLM_GPU_FRACTION", "memory_plan", "memory_plan_for", "render_memory_plan",
    "write_memory_plan",
    # tables
    "distill_reading", "single_teacher_frame", "specs_frame", "train_log_figure", "train_log_frame",
]
