"""The base model, the sequential curriculum and the single-task oracles, as runs in the run store.

    base -> seq_<d1> -> seq_<d2> -> seq_<d3> -> seq_<d4>      (d = cfg.pipeline.curriculum, any order)
    base -> oracle_<d>                                       (one per domain)

``build_base`` makes the base (the base-model step): its tokenizer, model and pretraining come from
``acl_lib.model`` and ``acl_lib.train``, its scores from ``acl_lib.eval``.

Training and evaluation are separate runs. A training run (``seq_math``) holds the checkpoint
(``<run>/model``); its evaluation is a run of its own nested inside it (``seq_math/eval``, holding
``metrics.json`` and ``records/``) that depends on the checkpoint and on the ``worlds`` / ``eval`` sections.
So re-scoring with another ``eval.k``, temperature or turn limit re-runs evaluations only.

A training run's config hash covers its own resolved recipe and nothing else: the ``model``, ``worlds``,
``sft`` and ``grpo`` sections *after* its domain's ``pipeline.stage_overrides`` are applied, whether its
domain cold-starts, and the completion record of the run it starts from. Changing one stage's overrides
re-runs that stage and every stage after it (their input changed), and nothing before it.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from acl_lib import domains
from acl_lib.config import Config
from acl_lib.eval import harness, sharding, sizing
from acl_lib.model import base_checkpoint, shipped
from acl_lib.model import base_run as _base_run
from acl_lib.model.corpus import base_corpus as corpus_with_counts
from acl_lib.runs import Run, run_once
from acl_lib.seeding import seed_and_threads
from acl_lib.train import stage
from acl_lib.train.launcher import launch

# What a training stage depends on (besides its input run and its domain's recipe, see ``stage_training_run``).
STAGE_SECTIONS = ("model", "worlds", "sft", "grpo")
# What an evaluation depends on (besides the checkpoint it scores).
EVAL_SECTIONS = ("worlds", "eval")
EVAL_DIR = "eval"  # an evaluation run lives in <training run>/eval/


def base_run(cfg: Config) -> Run:
    """The base run (``outputs/<profile>/seed<k>/base``), see ``acl_lib.model.base_run``."""
    return _base_run(cfg)


def seq_run_names(cfg: Config) -> list[str]:
    """The sequential runs' names, stage 1 first (``seq_math``, ...; ``seq2_if-math``, ... for another order)."""
    return [sequential_run(cfg, i).name for i in range(1, len(cfg.pipeline.curriculum) + 1)]


def model_dir(run: Run) -> Path | str:
    """The checkpoint a complete run holds: ``<run>/model``, or for the base the hub id / directory it
    records (the paper profile's base is ``model.base_model``, never copied into the run store)."""
    if run.name == "base":
        return base_checkpoint(run.cfg)
    return run.path / "model"


def eval_run(cfg: Config, trained: Run) -> Run:
    """The evaluation run of a training run: ``<trained>/eval``, keyed on ``worlds`` + ``eval`` and the checkpoint."""
    return Run(cfg, f"{trained.name}/{EVAL_DIR}", sections=EVAL_SECTIONS, inputs=[trained])


def evaluate_checkpoint(cfg: Config, trained: Run, same_as: Run | None = None) -> Run:
    """Score ``<trained>/model`` on the whole suite into ``<trained>/eval/metrics.json`` (+ records/); skipped
    when that evaluation is complete for this checkpoint and these ``worlds`` / ``eval`` settings. With
    ``launcher.eval_subprocess`` (paper) it runs in a process of its own, which frees the GPU when it ends.

    ``same_as``: a complete run whose model is the very same checkpoint (a copy); when its evaluation under these
    settings is complete, it is copied (``metrics.json`` pointing at this model, ``records/``, ``same_as.json``)."""
    if not trained.is_complete():
        raise RuntimeError(f"cannot evaluate {trained.name}: the run is not complete ({trained.path})")
    run = eval_run(cfg, trained)
    source = eval_run(cfg, same_as) if same_as is not None else None
    if source is not None and source.is_complete():
        return run_once(run, copy_eval_fn(source, model=str(model_dir(trained))))
    # in processes of their own: to free the GPU (launcher.eval_subprocess), or one per GPU (eval.shards)
    sub = cfg.launcher.eval_subprocess or cfg.eval.shards > 1
    score = sharding.evaluate_in_subprocess if sub else harness.evaluate

    def fn(r: Run) -> None:
        if cfg.eval.tokens_per_s:  # what the evaluation will take, before it starts (from the base's if scored)
            base_eval = eval_run(cfg, base_run(cfg))
            history = (json.loads((base_eval.path / "metrics.json").read_text())
                       if base_eval.is_complete() and base_eval.path != r.path else None)
            r.logger.info(sizing.format_estimate(sizing.evaluation_estimate(cfg, history=history)))
        score(cfg, str(model_dir(trained)), r.path, suites="all")

    return run_once(run, fn)


def copy_eval_fn(source: Run, model: str | None = None, files: tuple[str, ...] = (),
                 why: str = "the same checkpoint under the same evaluation settings"):
    """Fill an evaluation run with the outputs of ``source``, a complete evaluation that this one would repeat:
    ``records/``, ``files`` and ``metrics.json`` (with ``model`` set to ``model`` when given)."""

    def fn(run: Run) -> None:
        metrics = json.loads((source.path / "metrics.json").read_text())
        if model is not None:
            metrics["model"] = model
        if (source.path / "records").is_dir():
            shutil.copytree(source.path / "records", run.path / "records", dirs_exist_ok=True)
        for rel in files:
            if (source.path / rel).is_file():
                shutil.copy2(source.path / rel, run.path / rel)
        run.write_json("same_as.json", {"run": source.name, "path": str(source.path), "why": why})
        run.write_json("metrics.json", metrics)  # last: the scores appear once the copy is whole
        run.logger.info("%s is the same evaluation as the complete run %s: copied", run.name, source.name)

    return fn


def build_base(cfg: Config, evaluate: bool = True) -> str:
    """The base-model step: make the base checkpoint every stage starts from. Returns ``base_checkpoint(cfg)``.

    - ``model.base_model`` set (paper): record the hub id / path in ``base/base.json``; nothing is
      trained or downloaded.
    - ``pretrain.source: shipped`` (mini): check the shipped base against its model card (sha256,
      architecture), copy it to ``base/model/`` and record the card in ``base/base.json``.
    - otherwise (smoke, or mini with ``pretrain.source=pretrain``): train the tokenizer on the base corpus
      (``acl_lib.model.corpus``), build the Qwen3 model, save both to ``base/model/`` (written atomically, so it
      never looks complete half-written), and record timings, sizes and corpus stats in ``base/base.json``.

    A complete run with the same ``model`` / ``pretrain`` / ``worlds`` config is skipped. With ``evaluate``
    the base is then scored on the whole suite by its own run, ``base/eval`` (``metrics.json``).
    """
    run = base_run(cfg)

    def step(run: Run) -> None:
        if cfg.model.base_model:
            run.write_json("base.json", {"base_model": cfg.model.base_model, "built_here": False})
            return
        if cfg.pretrain.source == "shipped":
            card = shipped.verify(cfg)
            with run.atomic_dir("model") as tmp:
                shutil.copytree(shipped.shipped_dir(cfg), tmp, dirs_exist_ok=True)
            run.write_json("base.json", {"base_model": base_checkpoint(cfg), "built_here": False,
                                         "shipped_from": str(shipped.shipped_dir(cfg)), "card": card})
            run.logger.info("base: the shipped checkpoint %s (sha256 %s, checked)", shipped.shipped_dir(cfg),
                            card["sha256"])
            return
        from acl_lib.model import build  # torch and transformers: only where a model is built here

        seed_and_threads(cfg.seed, cfg.torch_threads)
        t0 = time.perf_counter()
        corpus, sources = corpus_with_counts(cfg)
        t1 = time.perf_counter()
        tokenizer = build.train_tokenizer(corpus, cfg.model.vocab_size,
                                          model_max_length=cfg.model.max_position_embeddings)
        t2 = time.perf_counter()
        model = build.build_model(cfg.model, tokenizer)
        # The initialised model (what pretraining starts from) is kept beside the pretrained one.
        with run.atomic_dir("init") as tmp:
            build.save(model, tokenizer, tmp)
        t3 = time.perf_counter()
        if cfg.pretrain.enabled and cfg.pretrain.max_steps > 0:
            corpus_file = run.path / "corpus.jsonl"
            with open(corpus_file, "w") as f:
                for doc in corpus:
                    f.write(json.dumps({"text": doc}) + "\n")
            run.checkpoint_dir()  # marks checkpoints/ with this run's hash before the trainer writes there
            launch(cfg, "pretrain", run.path, model_dir=str(run.path / "init"), corpus=str(corpus_file))
        else:
            with run.atomic_dir("model") as tmp:
                build.save(model, tokenizer, tmp)
        t4 = time.perf_counter()
        # Token counts straight from the Rust tokenizer (batched; no max-length warnings for long episodes).
        lengths = [len(e.ids) for e in tokenizer.backend_tokenizer.encode_batch(corpus)]
        info = {
            "base_model": base_checkpoint(cfg),
            "built_here": True,
            "vocab_size": len(tokenizer),
            "parameters": build.count_parameters(model),
            "corpus_sources": sources,
            "corpus_docs": len(corpus),
            "corpus_chars": sum(len(d) for d in corpus),
            "corpus_tokens": sum(lengths),
            "corpus_max_doc_tokens": max(lengths),
            "seconds": {"corpus": t1 - t0, "tokenizer": t2 - t1, "model": t3 - t2, "pretrain": t4 - t3},
        }
        run.write_json("base.json", info)
        run.logger.info("base model: %s", info)

    run_once(run, step)
    if evaluate:
        run_once(eval_run(cfg, run), lambda r: harness.evaluate(cfg, base_checkpoint(cfg), r.path, suites="all"))
    return base_checkpoint(cfg)


def stage_training_run(cfg: Config, name: str, domain: str, start: Run) -> Run:
    """The training run of stage ``domain`` started from ``start``, keyed on the stage's own resolved recipe."""
    return Run(cfg.for_stage(domain), name, sections=STAGE_SECTIONS, inputs=[start],
               extra={"domain": domain, "cold_start": bool(cfg.pipeline.cold_start.get(domain))})


def _stage_fn(domain: str, init: Run):
    def fn(run: Run) -> None:
        run.checkpoint_dir()  # marks checkpoints/ with this run's hash before any trainer writes there
        summary = stage.run_stage(run.cfg, domain, model_dir(init), run.path)
        run.logger.info("stage %s: %s", domain, {k: summary.get(k) for k in ("cold_start", "demos") if k in summary})

    return fn


def sequential_run(cfg: Config, index: int) -> Run:
    """The run of stage ``index`` (1-based) of the curriculum; its input is the previous stage (or base)."""
    curriculum = cfg.pipeline.curriculum
    if not 1 <= index <= len(curriculum):
        raise ValueError(f"stage index {index} out of range 1..{len(curriculum)} for curriculum {curriculum}")
    prev = base_run(cfg) if index == 1 else sequential_run(cfg, index - 1)
    # The run name carries the curriculum position when the order is not the study's, so two orders
    # never share a directory.
    name = f"seq_{curriculum[index - 1]}"
    if tuple(curriculum) != domains.ORDER:
        name = f"seq{index}_{'-'.join(curriculum[:index])}"
    return stage_training_run(cfg, name, curriculum[index - 1], prev)


def final_run(cfg: Config) -> Run:
    """The last stage's run of the curriculum: the sequential endpoint the tables call ``seq_final``."""
    return sequential_run(cfg, len(cfg.pipeline.curriculum))


def run_sequential_stage(cfg: Config, index: int) -> Run:
    """Train stage ``index`` of the curriculum, then evaluate it (each skipped when already complete).
    Returns the training run; its scores are in ``<run>/eval/metrics.json``."""
    run = sequential_run(cfg, index)
    prev = run.inputs[0]
    if not prev.is_complete():
        raise RuntimeError(f"stage {index} needs the complete run '{prev.name}' first ({prev.path}); run its notebook")
    domain = cfg.pipeline.curriculum[index - 1]
    fn, twin = _stage_fn(domain, prev), None
    if index == 1:  # stage 1 from the base is the same job as the domain's oracle (see run_oracle): reuse it
        twin = oracle_run(cfg, domain)
        if twin.is_complete():
            fn = copy_run_fn(twin)
    run_once(run, fn)
    evaluate_checkpoint(cfg, run, same_as=_copied_from(run, twin))
    return run


def _copied_from(run: Run, twin: Run | None) -> Run | None:
    """``twin`` when ``run``'s model is a copy of it (its ``same_as.json`` names it), else None: then the
    evaluation of the copy is the twin's, copied too, instead of the same evaluation run again."""
    if twin is None:
        return None
    try:
        same = json.loads((run.path / "same_as.json").read_text())
    except (OSError, ValueError):
        return None
    return twin if same.get("run") == twin.name else None


def oracle_run(cfg: Config, domain: str) -> Run:
    return stage_training_run(cfg, f"oracle_{domain}", domain, base_run(cfg))


STAGE_FILES = ("stage.json", "train_summary.json", "train_log.jsonl")


def copy_run_fn(source: Run, files: tuple[str, ...] = STAGE_FILES,
                why: str = "same stage recipe from the same base with the same seed"):
    """Fill a run with the outputs of ``source``, a complete run of the very same job: its ``model/`` (written
    atomically), ``files`` and ``same_as.json`` saying why."""

    def fn(run: Run) -> None:
        with run.atomic_dir("model") as tmp:
            shutil.copytree(source.path / "model", tmp, dirs_exist_ok=True)
        for rel in files:
            if (source.path / rel).is_file():
                shutil.copy2(source.path / rel, run.path / rel)
        run.write_json("same_as.json", {"run": source.name, "path": str(source.path), "why": why})
        run.logger.info("%s is the same job as the complete run %s: copied, not redone", run.name, source.name)

    return fn


def run_oracle(cfg: Config, domain: str) -> Run:
    """The single-task oracle for ``domain``: the same stage recipe, from the base.

    The oracle of the curriculum's first domain is the same job as ``seq`` stage 1 (same recipe, same base,
    same seed), so when that stage is complete its outputs are copied instead of trained again
    (``same_as.json`` says so); otherwise the oracle trains. The other way round, stage 1 of any order copies the
    complete oracle of its domain (``run_sequential_stage``): the curriculum orders' rotations start from the
    oracles.
    """
    base = base_run(cfg)
    if not base.is_complete():
        raise RuntimeError(f"oracles need the complete base run first ({base.path}); run the base-model step "
                           "(build_base) first")
    twin = oracle_twin(cfg, domain)
    fn = copy_run_fn(twin) if twin is not None else _stage_fn(domain, base)
    run = run_once(oracle_run(cfg, domain), fn)
    evaluate_checkpoint(cfg, run, same_as=_copied_from(run, twin))
    return run


def oracle_twin(cfg: Config, domain: str) -> Run | None:
    """The complete run that is the same job as ``oracle_<domain>`` (sequential stage 1 when the curriculum
    starts with ``domain``), or None."""
    if cfg.pipeline.curriculum and cfg.pipeline.curriculum[0] == domain:
        first = sequential_run(cfg, 1)  # its input is the base, as the oracle's is
        if first.is_complete():
            return first
    return None


def checkpoint_names(cfg: Config, oracles: bool = True) -> list[str]:
    names = ["base"] + [sequential_run(cfg, i).name for i in range(1, len(cfg.pipeline.curriculum) + 1)]
    if oracles:
        names += [f"oracle_{d}" for d in cfg.pipeline.curriculum]
    return names
