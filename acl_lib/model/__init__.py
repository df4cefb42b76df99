"""The base model: tokenizer, chat template, pretraining corpus and model construction.

    tokenizer.py      train_tokenizer(corpus, vocab_size): byte-level BPE, digits split, Qwen3 chat tokens
    chat_template.py  CHAT_TEMPLATE (Jinja, Qwen3 convention), RESPONSE_TEMPLATE (tool-call parser spec)
    corpus.py         base_corpus(cfg): the pretraining corpus drawn from the training worlds (noisy expert)
    build.py          build_model, load_model_and_tokenizer, save, placeholder_corpus, base_corpus
    shipped.py        the pretrained mini base committed with the suite (its card, checked by sha256)
    copying.py        the context-copy probe (synthetic induction blocks, copy gain)
    checkpoint_files.py  a checkpoint's safetensors read without loading the model (index, readers, counts)

Building the base as a run (the base-model step) is ``acl_lib.pipeline.build_base``. Names are imported lazily
so ``import acl_lib.model`` (e.g. for ``BASE_SECTIONS``) does not load torch.
"""

from __future__ import annotations

import importlib

from acl_lib.config import Config
from acl_lib.model.shipped import read_card
from acl_lib.runs import Run

# The config sections the base run depends on (its run-store hash); its evaluation is a run of its own.
BASE_SECTIONS = ("model", "pretrain", "worlds")


def base_run(cfg: Config) -> Run:
    """The run-store handle of the base checkpoint (``outputs/<profile>/seed<k>/base``).

    A shipped base (``pretrain.source: shipped``) depends on the ``model`` section and the checkpoint's
    sha256 only: its recipe ran once, elsewhere, and no world setting changes it."""
    if cfg.pretrain.enabled and cfg.pretrain.source == "shipped" and not cfg.model.base_model:
        card = read_card(cfg)
        return Run(cfg, "base", sections=("model",), extra={"shipped_sha256": card["sha256"]})
    return Run(cfg, "base", sections=BASE_SECTIONS)


def base_checkpoint(cfg: Config) -> str:
    """Where the base checkpoint lives: the hub id / directory in ``model.base_model``, or the
    directory the base-model step writes (``outputs/<profile>/seed<k>/base/model``)."""
    return cfg.model.base_model or str(cfg.seed_dir() / "base" / "model")


_EXPORTS = {
    "train_tokenizer": "acl_lib.model.tokenizer",
    "wrap_tokenizer": "acl_lib.model.tokenizer",
    "CHAT_TEMPLATE": "acl_lib.model.chat_template",
    "RESPONSE_TEMPLATE": "acl_lib.model.chat_template",
    "render_chat": "acl_lib.model.chat_template",
    "build_model": "acl_lib.model.build",
    "apply_chat_convention": "acl_lib.model.build",
    "load_model_and_tokenizer": "acl_lib.model.build",
    "save": "acl_lib.model.build",
    "count_parameters": "acl_lib.model.build",
    "placeholder_corpus": "acl_lib.model.build",
    "base_corpus": "acl_lib.model.build",
}

__all__ = ["BASE_SECTIONS", "base_run", "base_checkpoint", *_EXPORTS]


def __getattr__(name: str):
    # torch and transformers load with the submodule that needs them, when one of its names is first used
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'acl_lib.model' has no attribute {name!r}")
