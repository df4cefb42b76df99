"""A checkpoint's weight files read without loading the model: where each tensor is, its shape, its values.

    index = safetensors_index(model_dir)      # {tensor name: file}, one file or the shards of an index
    readers = TensorReaders(index)            # readers.tensor(name), readers.slice(name).get_shape()
    checkpoint_parameter_count(model_dir)     # from the headers alone

``resolve_model_dir`` turns a hub id into its local snapshot (the paper profile's base). The weight diagnostics
(``acl_lib.diagnostics.weights``), the merger and the MLE experts read checkpoints through these.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def resolve_model_dir(model: str | Path) -> Path:
    """A local model directory for ``model``: the directory itself, or a hub id's snapshot in the local cache
    (paper profile base; downloaded with ``huggingface_hub`` when not cached yet, weights and config only)."""
    p = Path(model)
    if p.is_dir():
        return p
    if p.is_absolute() or str(model).startswith("."):
        raise FileNotFoundError(f"checkpoint {model}: no such directory")
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(model), allow_patterns=["*.safetensors", "*.json"]))


def safetensors_index(model_dir: str | Path) -> dict[str, Path]:
    """``{tensor name: file}`` of a checkpoint: ``model.safetensors`` or the shards of
    ``model.safetensors.index.json``. Raises FileNotFoundError naming the directory when it holds neither."""
    d = resolve_model_dir(model_dir)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: d / f for name, f in weight_map.items()}
    single = d / "model.safetensors"
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), "pt") as f:
            return {name: single for name in f.keys()}
    raise FileNotFoundError(f"checkpoint {d}: no model.safetensors or model.safetensors.index.json "
                            "(is the run complete?)")


def checkpoint_parameter_count(model_dir: str | Path) -> int:
    """Parameters of a checkpoint, from its safetensors headers (no tensor is read)."""
    index = safetensors_index(model_dir)
    readers = TensorReaders(index)
    return int(sum(int(np.prod(readers.slice(name).get_shape() or [1])) for name in sorted(index, key=index.get)))


class TensorReaders:
    """Open safetensors handles of one checkpoint (``safetensors_index``'s), opened on first use (a shard at a time
    stays open): ``slice(name)`` for a tensor's shape or part, ``tensor(name)`` for the whole of it."""

    def __init__(self, index: dict[str, Path]):
        self.index, self.open = index, {}

    def _handle(self, name: str):
        from safetensors import safe_open

        path = self.index[name]
        if path not in self.open:
            self.open.clear()  # one open shard per checkpoint
            self.open[path] = safe_open(str(path), "pt")
        return self.open[path]

    def slice(self, name: str):
        return self._handle(name).get_slice(name)

    def tensor(self, name: str):
        return self._handle(name).get_tensor(name)
