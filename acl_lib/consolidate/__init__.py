"""Consolidations of the sequential endpoint: ways to win back what earlier stages lost.

    mmopd.py     multi-teacher mixed on-policy distillation (notebook 08): the launcher's job ``mmopd``, the teachers
                 routed by domain, the memory plan written beside each job
    sdft/        self-distilled fine-tuning (notebook 09): the oracles' filtered rollouts (reward, protocol,
                 near-duplicates) as an HF dataset, mixed and ordered, SFT'd into seq_final (and the base), the
                 ablations of mixture and order, and the update-direction check; runs scored like every stage
    merging.py   weight merging (notebook 10): task arithmetic with uniform, grid-searched and capability-balanced
                 coefficients, TIES and DARE; each merge a run holding an HF checkpoint, scored by the pipeline's
                 evaluation runs
    figures.py   what notebook 10 shows: the merges beside seq_final and the oracles, and a reading
    mle/         modular LoRA experts (notebook 11): a frozen backbone, one LoRA expert per domain, routed by the
                 agent's context; the launcher's jobs ``lora_sft`` / ``lora_grpo``

This layer sits above ``train``, ``eval``, ``diagnostics`` and the run store: the launcher reaches its jobs through
``acl_lib.train.launcher.JOBS`` (``"module:function"`` strings), never by importing them.
"""
