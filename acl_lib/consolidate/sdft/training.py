"""SDFT's runs: ``SDFTSpec`` (start, mixture, order), the ablations, and the SFT on the union
(``run_sdft``).

**Training** (``run_sdft``): ``SFTTrainer`` with assistant-only loss (``train.sft.train_sft`` through the
launcher, so multi-process and multi-node jobs run as the stages' do), ``sft.max_steps`` / ``batch_size`` /
``learning_rate`` replaced by ``sdft``'s, into a run of its own keyed on those, the mixture, the order,
``sft.max_length`` and its inputs (the data run and the start checkpoint); skipped when complete; the model is
written atomically; then scored on the whole suite by the pipeline's evaluation run (``<run>/eval``).
``sdft.json`` records the rows per domain, the first and last loss and the weight displacement
``||theta_after - theta_before||`` (streamed over the safetensors files).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from acl_lib import pipeline
from acl_lib.config import Config, _check_mixture
from acl_lib.consolidate.sdft.mixture import ORDERS, build_union
from acl_lib.consolidate.sdft.sampling import FILTER_JSON, data_rows, data_run, sample_seed, save_rows
from acl_lib.diagnostics.weights import weight_change
from acl_lib.runs import Run, run_once
from acl_lib.steps import require_complete
from acl_lib.train import common
from acl_lib.train.launcher import launch
from acl_lib.train.sft import read_rows, write_rows

logger = logging.getLogger("acl.consolidate.sdft")

TRAIN_DATA_DIR = "data"  # <sdft run>/data: the ordered union it trained on (save_to_disk)
TRAIN_ROWS = "train_rows.jsonl"  # the same rows as the SFT job reads them (chat rows only)
SUMMARY_JSON = "sdft.json"
TRAIN_SECTIONS = ("model",)  # + sdft's training fields, the mixture, the order and sft.max_length (extra)
TRAINING_FIELDS = ("max_steps", "batch_size", "learning_rate")  # the SFT job's, in place of sft's (sdft_cfg)
STOPPING_FIELDS = ("heldout_fraction", "eval_every", "patience")  # passed to the SFT job (train_sft)
ROW_KEYS = ("messages", "tools")  # what the SFT job reads of a row
STARTS = ("seq_final", "base")


class NoData(RuntimeError):
    """An SDFT run whose union is empty: the filter kept nothing its mixture selects."""


@dataclass(frozen=True)
class SDFTSpec:
    """One SDFT run: its name, the checkpoint it starts from (``seq_final`` or ``base``), the mixture (None:
    ``sdft.mixture``) and the order (None: ``sdft.order``)."""

    name: str
    start: str = "seq_final"
    mixture: dict | None = field(default=None, hash=False)
    order: str | None = None

    def __post_init__(self):
        if self.start not in STARTS:
            raise ValueError(f"SDFT run {self.name}: start must be one of {list(STARTS)}, got {self.start!r}")
        if self.order is not None and self.order not in ORDERS:
            raise ValueError(f"SDFT run {self.name}: unknown order {self.order!r}; orders are {list(ORDERS)}")
        if self.mixture is not None:
            object.__setattr__(self, "mixture", dict(_check_mixture(dict(self.mixture))))

    def resolved(self, cfg) -> dict:
        return {"name": self.name, "start": self.start,
                "mixture": dict(self.mixture if self.mixture is not None else cfg.sdft.mixture),
                "order": self.order or cfg.sdft.order}


def mix_name(mixture: Mapping[str, float], curriculum: Sequence[str]) -> str:
    """``sdft_mix_math1_search1_ecom2_if2``: a mixture ablation's run name (every curriculum domain's weight)."""
    return "sdft_mix_" + "_".join(f"{d}{float(mixture.get(d, 0.0)):g}" for d in curriculum)


def ablation_specs(cfg: Config, mixture: Mapping[str, float] | None = None,
                   orders: Sequence[str] = ("staged", "difficulty")) -> list[SDFTSpec]:
    """The ablations notebook 09 runs, each from ``seq_final``: a non-uniform ``mixture`` (``sdft_mix_*``; None
    leaves it out) with ``sdft.order``, and each presentation order of ``orders`` other than ``sdft.order``
    (``sdft_staged``, ``sdft_difficulty``) with ``sdft.mixture``. ``sdft`` itself is ``sdft.order``
    (shuffle by default)."""
    specs = []
    if mixture is not None:
        specs.append(SDFTSpec(mix_name(mixture, cfg.pipeline.curriculum), mixture=dict(mixture)))
    for o in orders:
        if o != cfg.sdft.order:
            specs.append(SDFTSpec(f"sdft_{o}", order=o))
    return specs


def start_run(cfg: Config, start: str):
    return pipeline.base_run(cfg) if start == "base" else pipeline.final_run(cfg)


def sdft_cfg(cfg: Config):
    """``cfg`` with ``sft.max_steps`` / ``batch_size`` / ``learning_rate`` replaced by ``sdft``'s (what the SFT
    job of an SDFT run reads; the other ``sft`` fields, ``max_length`` included, stay)."""
    tree = cfg.to_dict()
    for k in TRAINING_FIELDS:
        tree["sft"][k] = getattr(cfg.sdft, k)
    return Config.model_validate(tree)


def sdft_run(cfg: Config, spec: SDFTSpec):
    """The run of ``spec`` (``<seed_dir>/<spec.name>``), keyed on its recipe and inputs (data run, start)."""
    extra = {"spec": spec.resolved(cfg), "sdft": {k: getattr(cfg.sdft, k) for k in TRAINING_FIELDS + STOPPING_FIELDS},
             "max_length": cfg.sft.max_length, "seed": cfg.seed}
    return Run(cfg, spec.name, sections=TRAIN_SECTIONS, inputs=[data_run(cfg), start_run(cfg, spec.start)],
               extra=extra)


def displacement(before, after, progress: bool = False) -> dict:
    """``||theta_after - theta_before||`` and ``||theta_before||`` (streamed over the safetensors files)."""
    norm, ref = weight_change(before, after, progress)
    return {"displacement_norm": norm, "start_norm": ref, "relative_displacement": norm / ref if ref else None}


def run_sdft(cfg: Config, spec: SDFTSpec, evaluate: bool = True):
    """Train ``spec`` on the union of ``sdft_data`` (skipped when complete), then score it on the whole suite
    (``<run>/eval/metrics.json``). Returns the run; ``<run>/sdft.json`` records what training did."""
    run = sdft_run(cfg, spec)
    data, start = run.inputs
    require_complete([start], f"SDFT run {spec.name}")
    require_complete([data], f"SDFT run {spec.name} (run_sdft_data first)")
    recipe = spec.resolved(cfg)
    rows = data_rows(data)
    union, counts = build_union(rows, recipe["mixture"], recipe["order"], cfg.pipeline.curriculum, sample_seed(cfg))
    if not union:
        raise NoData(f"SDFT run {spec.name}: nothing to train on: the mixture {recipe['mixture']} selects no row of "
                     f"the kept ones { {d: sum(x['domain'] == d for x in rows) for d in cfg.pipeline.curriculum} } "
                     f"({data.path / FILTER_JSON} says why)")

    rows_in = [{k: x[k] for k in ROW_KEYS} for x in union]
    twin = same_union_twin(cfg, spec, rows_in)
    if twin is not None:  # the same SFT on the same rows from the same start: copy it with its evaluation
        copied = run_once(run, _copy_sdft_fn(twin, recipe))
        if evaluate:
            pipeline.evaluate_checkpoint(cfg, copied, same_as=twin)
        return copied

    def fn(r) -> None:
        with r.atomic_dir(TRAIN_DATA_DIR) as tmp:
            save_rows(union, tmp)
        path = write_rows(rows_in, r.path / TRAIN_ROWS)
        s = cfg.sdft
        seen = min(len(union), s.max_steps * s.batch_size)
        unseen = sorted({x["domain"] for x in union[seen:]} - {x["domain"] for x in union[:seen]})
        if unseen:
            r.logger.warning("sdft %s: %d steps x %d rows see only the first %d of %d rows (order %s): never %s",
                             spec.name, s.max_steps, s.batch_size, seen, len(union), recipe["order"], unseen)
        r.checkpoint_dir()
        start_dir = pipeline.model_dir(start)
        summary = launch(sdft_cfg(cfg), "sft", r.path, model_dir=str(start_dir), dataset=str(path), sequential=True,
                         **{k: getattr(s, k) for k in STOPPING_FIELDS})
        moved = displacement(start_dir, r.path / "model")
        log = common.read_log(r.path / common.TRAIN_LOG)
        losses = [x["loss"] for x in log if "loss" in x]
        r.write_json(SUMMARY_JSON, {
            **recipe, "start_run": start.name, "start_model": str(start_dir), "rows": len(union),
            "rows_per_domain": counts, "kept_per_domain": {d: sum(x["domain"] == d for x in rows)
                                                           for d in cfg.pipeline.curriculum},
            "rows_seen": seen, "domains_never_seen": unseen, "order_head": [x["task_id"] for x in union[:8]],
            "steps": summary.get("steps"), "stopped_at_step": summary.get("stopped_at_step"),
            "heldout_rows": summary.get("heldout_rows"), "heldout_losses": summary.get("heldout_losses"),
            "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None, **moved,
            "train": {k: getattr(s, k) for k in TRAINING_FIELDS + STOPPING_FIELDS}, "wall_s": summary.get("wall_s"),
        })
        r.logger.info("sdft %s: %d rows %s, loss %s -> %s, ||d theta|| %.4g", spec.name, len(union), counts,
                      losses[0] if losses else None, losses[-1] if losses else None, moved["displacement_norm"])

    run_once(run, fn)
    if evaluate:
        pipeline.evaluate_checkpoint(cfg, run)
    return run


def same_union_twin(cfg: Config, spec: SDFTSpec, rows_in: list[dict]) -> Run | None:
    """A complete SDFT run, other than ``spec``'s, from the same start whose training rows are ``rows_in`` in the
    same order (``train_rows.jsonl``): the very same SFT job. A mixture ablation is one when the kept rows cap
    every domain's count (few kept rows: the weights cannot change what there is). Candidates: ``sdft`` /
    ``sdft_base`` (the config's mixture and order) and the ablations of ``ablation_specs``."""
    candidates = [SDFTSpec("sdft" if spec.start != "base" else "sdft_base", start=spec.start)]
    if spec.start != "base":
        candidates += ablation_specs(cfg, cfg.ablations.sdft_mixture, cfg.ablations.sdft_orders)
    as_written = json.loads(json.dumps(rows_in))  # what train_rows.jsonl reads back as
    for other in candidates:
        run = sdft_run(cfg, other)
        if (other.name != spec.name and run.is_complete() and (run.path / TRAIN_ROWS).is_file()
                and read_rows(run.path / TRAIN_ROWS) == as_written):
            return run
    return None


def _copy_sdft_fn(twin: Run, recipe: dict):
    """Fill an SDFT run with ``twin``'s model, rows and logs; its ``sdft.json`` is the twin's with this run's recipe
    and ``same_as`` (the run the training is)."""
    copy = pipeline.copy_run_fn(twin, files=(TRAIN_ROWS, common.TRAIN_LOG, "train_summary.json"),
                                why="an SDFT run on the very same rows, in the same order, from the same start")

    def fn(r) -> None:
        copy(r)
        summary = json.loads((twin.path / SUMMARY_JSON).read_text())
        r.write_json(SUMMARY_JSON, {**summary, **recipe, "same_as": twin.name})
        r.logger.info("sdft %s: the same rows as %s (%s): copied, not trained again", recipe["name"], twin.name,
                      summary.get("rows_per_domain"))

    return fn


def run_sdft_specs(cfg: Config, specs: Sequence[SDFTSpec], evaluate: bool = True) -> list[str]:
    """``run_sdft`` for each spec; a spec with nothing to train on (``NoData``) is skipped with a log line.
    Returns the names of the runs trained (or complete)."""
    done = []
    for spec in specs:
        try:
            run_sdft(cfg, spec, evaluate=evaluate)
        except NoData as exc:
            logger.warning("%s: skipped", exc)
            continue
        done.append(spec.name)
    return done
