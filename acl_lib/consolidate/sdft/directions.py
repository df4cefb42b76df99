"""SDFT's update-direction check (``run_update_directions``; ``sdft_directions/directions.json``): the cosine
between the update of the SFT from the base (``sdft_base - base``) and that of the same SFT from ``seq_final``
(``sdft - seq_final``), the study's 0.77, against the cosine between two unrelated single-domain SFT updates, the
study's 0.05: the oracles' cold-start SFT models minus the base (``oracle_<d>/checkpoints/sft/model``; where fewer
than two oracles cold-start, the oracles' whole updates), every pair and their mean;
``acl_lib.diagnostics.weights``' streamed Gram.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from acl_lib import pipeline
from acl_lib.consolidate.sdft.training import SDFTSpec, sdft_run
from acl_lib.diagnostics.weights import streamed_gram, update
from acl_lib.model.checkpoint_files import resolve_model_dir
from acl_lib.runs import Run, run_once
from acl_lib.steps import require_complete
from acl_lib.train.stage import SFT_DIR

if TYPE_CHECKING:
    from acl_lib.config import Config

logger = logging.getLogger("acl.consolidate.sdft")

DIRECTIONS_RUN = "sdft_directions"


def _oracle_sft_models(cfg: Config) -> dict:
    out = {}
    for d in cfg.pipeline.curriculum:
        m = pipeline.oracle_run(cfg, d).path / SFT_DIR / "model"
        if m.is_dir():
            out[d] = m
    return out


def directions_run(cfg: Config, names: tuple[str, str] = ("sdft", "sdft_base")):
    final = pipeline.final_run(cfg)
    oracles = [pipeline.oracle_run(cfg, d) for d in cfg.pipeline.curriculum]
    runs = [sdft_run(cfg, SDFTSpec(names[0])), sdft_run(cfg, SDFTSpec(names[1], start="base"))]
    return Run(cfg, DIRECTIONS_RUN, sections=(), inputs=[pipeline.base_run(cfg), final, *runs, *oracles],
               extra={"runs": list(names)})


def run_update_directions(cfg: Config, names: tuple[str, str] = ("sdft", "sdft_base"),
                          missing_ok: bool = False) -> dict | None:
    """The study's update-direction check (module docstring) as a run (``sdft_directions/directions.json``);
    ``names``: the SDFT runs from ``seq_final`` and from the base. Returns that JSON; with ``missing_ok``, None
    when those two runs are not complete (skipped for want of data) instead of an error."""
    run = directions_run(cfg, names)
    base, final, from_final, from_base, *oracles = run.inputs
    if missing_ok and not (from_final.is_complete() and from_base.is_complete()):
        absent = [n for n, r in zip(names, (from_final, from_base)) if not r.is_complete()]
        logger.warning("update directions: %s not complete, not computed", absent)
        return None
    require_complete([base, final, from_final, from_base, *oracles], "the update-direction check")

    def fn(r) -> None:
        sft = _oracle_sft_models(cfg)
        kind = "cold-start SFT" if len(sft) >= 2 else "whole oracle"
        singles = sft if len(sft) >= 2 else {d: pipeline.model_dir(o) for d, o in zip(cfg.pipeline.curriculum, oracles)}
        models = {"base": resolve_model_dir(pipeline.model_dir(base)), "seq_final": pipeline.model_dir(final),
                  "sdft": pipeline.model_dir(from_final), "sdft_base": pipeline.model_dir(from_base),
                  **{f"single_{d}": p for d, p in singles.items()}}
        gram = streamed_gram(models, "base", progress=True)
        same = gram.cosine(update("sdft_base", "base"), update("sdft", "seq_final"))
        doms = list(singles)
        pairs = {f"{a} vs {b}": gram.cosine(update(f"single_{a}", "base"), update(f"single_{b}", "base"))
                 for i, a in enumerate(doms) for b in doms[i + 1:]}
        finite = [v for v in pairs.values() if v == v]
        r.write_json("directions.json", {
            "same_sft_from_base_vs_seq_final": same,
            "unrelated_single_domain_sft": {"kind": kind, "pairs": pairs,
                                            "mean": sum(finite) / len(finite) if finite else None},
            "norms": {"sdft - seq_final": gram.norm(update("sdft", "seq_final")),
                      "sdft_base - base": gram.norm(update("sdft_base", "base")),
                      **{f"{d} ({kind}) - base": gram.norm(update(f"single_{d}", "base")) for d in doms}},
            "study": {"same_sft_from_base_vs_seq_final": 0.77, "unrelated_single_domain_sft": 0.05},
            "runs": list(names),
        })

    run_once(run, fn)
    return run.read_json("directions.json")
