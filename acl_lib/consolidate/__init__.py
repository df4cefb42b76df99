"""Consolidations of the sequential endpoint: ways to win back what earlier stages lost.

Each is a package of one shape: its ``__init__`` sketches the usage and lists the modules (every name importable
from the package), the run specs in ``specs.py`` where it has specs, its jobs in modules named by job, and what
its notebook shows in ``tables.py``.

    mmopd/       multi-teacher mixed on-policy distillation (notebook 08): the launcher's job ``mmopd``, the teachers
                 routed by domain, the memory plan written beside each job (specs, loss, teachers, training,
                 memory, tables)
    sdft/        self-distilled fine-tuning (notebook 09): the oracles' filtered rollouts (reward, protocol,
                 near-duplicates) as an HF dataset, mixed and ordered, SFT'd into seq_final (and the base), the
                 ablations of mixture and order, and the update-direction check; runs scored like every stage
                 (sampling, filtering, mixture, training, directions, tables)
    merging/     weight merging (notebook 10): task arithmetic with uniform, grid-searched and capability-balanced
                 coefficients, TIES and DARE; each merge a run holding an HF checkpoint, scored by the pipeline's
                 evaluation runs (specs, merge, search, tables)
    mle/         modular LoRA experts (notebook 11): a frozen backbone, one LoRA expert per domain, routed by the
                 agent's context; the launcher's jobs ``lora_sft`` / ``lora_grpo`` (specs, experts, routers,
                 serving, measurements, stress, tables)
    compare.py   what notebooks 08-11 all show: their runs beside seq_final and the oracles, per benchmark, beside
                 the study's rows

This layer sits above ``train``, ``eval``, ``diagnostics`` and the run store: the launcher reaches its jobs through
``acl_lib.train.launcher.JOBS`` (``"module:function"`` strings), never by importing them. Inside it, MMOPD and SDFT
read merging's ``checkpoint_runs`` / ``validation_seed`` and MMOPD's reading applies merging's ``merge_reading``;
nothing imports back.
"""
