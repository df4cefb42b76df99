"""SDFT, self-distilled fine-tuning (notebook 09): the oracles' own filtered rollouts, SFT'd into one model.

    data = run_sdft_data(cfg)                    # sdft_data/dataset (HF Dataset on disk) + sdft_data/filter.json
    run = run_sdft(cfg, SDFTSpec("sdft"))        # SFT of seq_final on the union -> sdft/model + sdft/eval/metrics.json
    run_sdft(cfg, SDFTSpec("sdft_base", start="base"))       # the same SFT from the base
    for spec in ablation_specs(cfg, {"ecom": 2.0, "if": 2.0}):  # sdft_mix_*, sdft_staged, sdft_difficulty
        run_sdft(cfg, spec)
    directions = run_update_directions(cfg)      # sdft_directions/directions.json (the study's 0.77 vs 0.05)

Notebook 09 runs the specs through ``run_sdft_specs``, which skips (with a log line) a run whose union is empty
(``NoData``): the untrained oracles of the smoke profile solve nothing, so there only the sampling and the filter
run; ``run_update_directions(missing_ok=True)`` then returns None.

Modules, each one job (every name is importable from here):

    sampling.py    the oracles' rollouts on their training tasks, filtered, as one dataset (run_sdft_data)
    filtering.py   the filter: reward, protocol, near-duplicates (filter_episodes)
    mixture.py     the training union: rows per domain and presentation order (build_union)
    training.py    SDFTSpec, the ablations and the SFT on the union (run_sdft)
    directions.py  the update-direction check (run_update_directions)
    tables.py      what notebook 09 shows: DataFrames and a reading computed from the scores
"""

from __future__ import annotations

from acl_lib.consolidate.sdft.directions import DIRECTIONS_RUN, directions_run, run_update_directions
from acl_lib.consolidate.sdft.filtering import (
                                                assistant_text,
                                                dedup,
                                                episode_length,
                                                filter_episodes,
                                                jaccard,
                                                ngrams,
                                                protocol_violation,
                                                task_difficulty,
)
from acl_lib.consolidate.sdft.mixture import ORDERS, build_union, order_rows, rows_per_domain
from acl_lib.consolidate.sdft.sampling import (
                                                DATA_RUN,
                                                DATA_SECTIONS,
                                                DATASET_DIR,
                                                FILTER_JSON,
                                                SAMPLE_SEED,
                                                SAMPLING_FIELDS,
                                                _CutWatch,
                                                data_rows,
                                                data_run,
                                                domain_limits,
                                                load_rows,
                                                run_sdft_data,
                                                sample_domain,
                                                sample_seed,
                                                sampling_policy,
                                                save_rows,
)
from acl_lib.consolidate.sdft.tables import directions_frame, filter_frame, sdft_reading, training_frame
from acl_lib.consolidate.sdft.training import (
                                                ROW_KEYS,
                                                STARTS,
                                                SUMMARY_JSON,
                                                TRAIN_DATA_DIR,
                                                TRAIN_ROWS,
                                                TRAIN_SECTIONS,
                                                TRAINING_FIELDS,
                                                NoData,
                                                SDFTSpec,
                                                ablation_specs,
                                                displacement,
                                                mix_name,
                                                run_sdft,
                                                run_sdft_specs,
                                                sdft_cfg,
                                                sdft_run,
                                                start_run,
)

__all__ = [
    # sampling
    "DATA_RUN", "DATA_SECTIONS", "DATASET_DIR", "FILTER_JSON", "SAMPLE_SEED", "SAMPLING_FIELDS", "_CutWatch",
    "data_rows", "data_run", "domain_limits", "load_rows", "run_sdft_data", "sample_domain", "sample_seed",
    "sampling_policy", "save_rows",
    # filtering
    "assistant_text", "dedup", "episode_length", "filter_episodes", "jaccard", "ngrams", "protocol_violation",
    "task_difficulty",
    # mixture
    "ORDERS", "build_union", "order_rows", "rows_per_domain",
    # training
    "ROW_KEYS", "STARTS", "SUMMARY_JSON", "TRAIN_DATA_DIR", "TRAIN_ROWS", "TRAIN_SECTIONS", "TRAINING_FIELDS",
    "NoData", "SDFTSpec", "ablation_specs", "displacement", "mix_name", "run_sdft", "run_sdft_specs", "sdft_cfg",
    "sdft_run", "start_run",
    # directions
    "DIRECTIONS_RUN", "directions_run", "run_update_directions",
    # tables
    "directions_frame", "filter_frame", "sdft_reading", "training_frame",
]
