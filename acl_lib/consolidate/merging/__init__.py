"""Weight merging of the sequential checkpoints (notebook 10): task arithmetic, TIES and DARE, as runs.

    theta = theta_0 + sum_k lambda_k (theta_k - theta_0)      theta_0: the base; theta_k: seq_math .. seq_if

The study's *uniform merge* takes lambda_k = 1/K (the average of the K checkpoints). Beside it: coefficients
grid-searched on a validation split (the candidate with the best mean validation score over the domains), and
capability-balanced ones (the candidate whose worst domain is best, each domain's validation score relative to its
own oracle's); the four oracles as theta_k (a variant); beyond the study TIES (magnitude pruning to ``density``,
sign election, disjoint mean) and DARE (random drop to ``density``, rescaled by 1 / density), with the tensor
operations of ``peft.utils.merge_utils``.

    spec = MergeSpec("merge_uniform", sources=("seq_math", ...), weights=(0.25,) * 4)
    run = run_merge(cfg, spec)        # <seed_dir>/merge_uniform/model (HF checkpoint) + merge_uniform/eval/metrics.json
    search = run_validation_search(cfg, sources, [0.25, 0.5], n_tasks=8)   # merge_validation/validation.json
    chosen = {k: c["weights"] for k, c in search["chosen"].items()}         # grid-searched, capability-balanced
    for spec in merge_specs(cfg, chosen):     # merge_uniform, merge_grid, merge_balanced, merge_ties, merge_dare, ...
        run_merge(cfg, spec)

Merging goes tensor by tensor over the checkpoints' safetensors files and writes the merged file as it goes
(``write_safetensors_streamed``): memory stays near one tensor per checkpoint, also for 8B-parameter models. Each
merge is a run keyed on its spec and the completion records of its input checkpoints (skipped when complete; the
model directory is written atomically) and is scored on the whole suite by the pipeline's evaluation run
(``<merge>/eval``), like every stage. Coefficients are chosen on held-out draws of the training split, never on
the test tasks the tables report (``search.py``).

Modules, each one job (every name is importable from here):

    specs.py   MergeSpec, the study's set of merges (merge_specs), the checkpoints a merge may take
               (checkpoint_runs) and the run each merge is keyed on (merge_run)
    merge.py   the merge: tensors (merge_tensor: task arithmetic, TIES, DARE), the streamed safetensors file,
               merge_checkpoints, and run_merge (a complete twin copied, not merged again)
    search.py  the validation grid search (run_validation_search: candidates, oracles, the two choices)
    tables.py  what notebook 10 shows: the validation search, the merges run, a reading (merge_reading)
"""

from __future__ import annotations

from acl_lib.consolidate.merging.merge import (
    BLOCK_ELEMENTS,
    merge_checkpoints,
    merge_tensor,
    merge_twin,
    run_merge,
    tensor_seed,
    write_safetensors_streamed,
)
from acl_lib.consolidate.merging.search import (
    VALIDATION_RUN,
    VALIDATION_SECTIONS,
    VALIDATION_SEED,
    VALIDATION_SPLIT,
    candidate_grid,
    choose,
    domain_benchmark,
    relative_scores,
    run_validation_search,
    search_weights,
    validation_run,
    validation_scores,
    validation_seed,
    validation_tasks,
)
from acl_lib.consolidate.merging.specs import (
    MERGE_SECTIONS,
    METHODS,
    MergeSpec,
    checkpoint_runs,
    complete_inputs,
    merge_run,
    merge_specs,
    uniform_weights,
)
from acl_lib.consolidate.merging.tables import OTHER_CONSOLIDATIONS, merge_reading, specs_frame, validation_frame

__all__ = [
    # specs
    "MERGE_SECTIONS", "METHODS", "MergeSpec", "checkpoint_runs", "complete_inputs", "merge_run", "merge_specs",
    "uniform_weights",
    # merge
    "BLOCK_ELEMENTS", "merge_checkpoints", "merge_tensor", "merge_twin", "run_merge", "tensor_seed",
    "write_safetensors_streamed",
    # search
    "VALIDATION_RUN", "VALIDATION_SECTIONS", "VALIDATION_SEED", "VALIDATION_SPLIT", "candidate_grid", "choose",
    "domain_benchmark", "relative_scores", "run_validation_search", "search_weights", "validation_run",
    "validation_scores", "validation_seed", "validation_tasks",
    # tables
    "OTHER_CONSOLIDATIONS", "merge_reading", "specs_frame", "validation_frame",
]
