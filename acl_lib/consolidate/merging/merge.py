"""The merge itself: tensor by tensor over the checkpoints' safetensors files (task arithmetic, TIES, DARE), the
merged file written as it goes, and the merge run (``run_merge``: a twin's copy or a new merge, then its
evaluation)."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import struct
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from acl_lib import pipeline
from acl_lib.consolidate.merging.specs import METHODS, MergeSpec, complete_inputs, merge_run
from acl_lib.model.checkpoint_files import TensorReaders, resolve_model_dir, safetensors_index
from acl_lib.progress import maybe_progress
from acl_lib.runs import run_once

if TYPE_CHECKING:
    from acl_lib.config import Config

_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
_NOT_COPIED = {"training_args.bin"}  # the trainer's arguments of the stage copied from: not the merge's
_ST_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def tensor_seed(seed: int, name: str) -> int:
    """DARE's random drop of tensor ``name``: seeded by (seed, name), so a merge is the same whatever the order."""
    return int(hashlib.sha256(f"{seed}:{name}".encode()).hexdigest()[:15], 16)


# Tensors above this many elements are merged in slices of it (task arithmetic, TIES): the float64 copies of a
# 622M-parameter embedding or head (Qwen3-8B: 151,936 x 4,096) would otherwise take ~5 GB each, x the checkpoints,
# and PEFT's TIES a top-k over the whole tensor per checkpoint (~100 GB and hours; docs/paper-checklist.md item 14).
BLOCK_ELEMENTS = 1 << 24


def merge_tensor(base, tasks: Sequence, weights: Sequence[float], method: str = "task_arithmetic",
                 density: float = 1.0, seed: int | None = None, block: int = BLOCK_ELEMENTS):
    """Merge one tensor: ``base`` (theta_0) and ``tasks`` (theta_k, same shape) -> a tensor of ``base``'s dtype.

    Differences and sums are taken in float64, so lambda = 0 returns ``base`` and a one-hot lambda returns that
    checkpoint's tensor bit for bit (the difference of two float32 / bf16 values is exact in float64). TIES and
    DARE apply ``peft.utils.merge_utils.ties`` / ``dare_linear`` to the task vectors theta_k - theta_0; DARE's
    random mask is drawn from torch's generator seeded with ``seed`` (the caller's global RNG state is kept).
    Task arithmetic and TIES on a tensor of more than ``block`` elements go slice by slice (``_merge_blocked``):
    the same result, in the memory of a slice (plus, for TIES, one float64 copy of the tensor to find each task
    vector's pruning threshold).
    """
    import torch

    if method not in METHODS:
        raise ValueError(f"unknown merge method {method!r}; methods are {list(METHODS)}")
    if len(tasks) != len(weights):
        raise ValueError(f"{len(weights)} coefficients for {len(tasks)} task tensors")
    for t in tasks:
        if tuple(t.shape) != tuple(base.shape):
            raise ValueError(f"shape {tuple(t.shape)} of a task tensor differs from the base's {tuple(base.shape)}")
    if method == "task_arithmetic" and not any(w != 0 for w in weights):
        return base.clone()
    if method in ("task_arithmetic", "ties") and base.numel() > block:
        return _merge_blocked(base, tasks, weights, method, density, block)
    b = base.to(torch.float64)
    if method == "task_arithmetic":
        out = b.clone()
        for w, t in zip(weights, tasks):
            if w != 0:
                d = t.to(torch.float64) - b
                out += d if w == 1 else w * d
        return out.to(base.dtype)
    from peft.utils import merge_utils

    deltas = [t.to(torch.float64) - b for t in tasks]
    lam = torch.tensor([float(w) for w in weights], dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft warns that density 1 prunes nothing: that is what density 1 means
        if method == "ties":
            merged = merge_utils.ties(deltas, lam, density, majority_sign_method="total")
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(0 if seed is None else seed)
                merged = merge_utils.dare_linear(deltas, lam, density)
    return (b + merged).to(base.dtype)


def _ties_threshold(base, task, density: float) -> tuple[float, int]:
    """``(threshold, ties_kept)``: PEFT's magnitude pruning keeps the ``int(density * n)`` entries of largest |d|
    (d = task - base); that is every entry above the k-th largest |d| plus ``ties_kept`` of those equal to it."""
    import torch

    n = base.numel()
    k = int(density * n)
    if k <= 0:
        return math.inf, 0
    a = (task.reshape(-1).to(torch.float64) - base.reshape(-1).to(torch.float64)).abs_()
    thr = torch.kthvalue(a, n - k + 1).values.item()
    return thr, k - int((a > thr).sum())


def _merge_blocked(base, tasks: Sequence, weights: Sequence[float], method: str, density: float, block: int):
    """``merge_tensor`` for task arithmetic and TIES over slices of ``block`` elements of the flattened tensors.

    Task arithmetic is elementwise. TIES is elementwise once each task vector's pruning is known: its threshold (the
    k-th largest |d|, ``_ties_threshold``) is found first; then, slice by slice, entries above it are kept and those
    equal to it are kept in order until the count is PEFT's k (``torch.topk``'s choice among equal magnitudes is
    unspecified: this one is the first ones; with no equal magnitudes at the threshold both keep the same set), and
    PEFT's own sign election and disjoint merge run on the slice."""
    import torch

    flat_b = base.reshape(-1)
    flats = [t.reshape(-1) for t in tasks]
    out = torch.empty_like(flat_b)
    lam = torch.tensor([float(w) for w in weights], dtype=torch.float64)
    if method == "ties":
        from peft.utils import merge_utils

        if density >= 1:
            cuts = [(-1.0, 0)] * len(tasks)  # PEFT prunes nothing at density 1: keep every entry
        else:
            cuts = [_ties_threshold(flat_b, t, density) for t in flats]
        quota = [q for _, q in cuts]
    for start in range(0, flat_b.numel(), block):
        b = flat_b[start:start + block].to(torch.float64)
        deltas = [t[start:start + block].to(torch.float64) - b for t in flats]
        if method == "task_arithmetic":
            acc = b.clone()
            for w, d in zip(weights, deltas):
                if w != 0:
                    acc += d if w == 1 else w * d
        else:
            kept = []
            for i, d in enumerate(deltas):
                thr = cuts[i][0]
                a = d.abs()
                keep = a > thr
                if quota[i] > 0:
                    equal = (a == thr).nonzero().reshape(-1)[: quota[i]]
                    keep[equal] = True
                    quota[i] -= len(equal)
                kept.append(d * keep)
            stacked = torch.stack(kept)
            mask = merge_utils.calculate_majority_sign_mask(stacked, method="total")
            acc = b + merge_utils.disjoint_merge(stacked * lam.reshape(-1, 1), mask)
        out[start:start + block] = acc.to(base.dtype)
    return out.reshape(base.shape)


# --- safetensors, streamed ---------------------------------------------------------------------------------


def _header(entries: list[tuple[str, str, list[int]]]) -> bytes:
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape in entries:
        size = _ST_DTYPES[dtype] * math.prod(shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8)


def write_safetensors_streamed(path: str | Path, entries: list[tuple[str, str, list[int]]],
                               tensors: Callable[[str], object]) -> Path:
    """Write a safetensors file whose header is known in advance (``entries``: name, safetensors dtype, shape,
    in file order) and whose tensors are produced one at a time by ``tensors(name)``: only one is held at once.
    The format is the documented one (u64 header length, JSON header, raw little-endian data)."""
    import torch

    path = Path(path)
    header = _header(entries)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        for name, _dtype, shape in entries:
            t = tensors(name).contiguous()
            if list(t.shape) != list(shape):
                raise ValueError(f"tensor {name}: produced shape {list(t.shape)}, header says {list(shape)}")
            f.write(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return path


def _tensor_layout(model_dir) -> dict[str, tuple[Path, str, list[int]]]:
    """``{name: (file, safetensors dtype, shape)}`` of a checkpoint, from the headers only."""
    from safetensors import safe_open

    index = safetensors_index(model_dir)
    out = {}
    for file in dict.fromkeys(index.values()):
        with safe_open(str(file), "pt") as f:
            for name in f.keys():
                s = f.get_slice(name)
                out[name] = (file, s.get_dtype(), list(s.get_shape()))
    return out


def merge_checkpoints(base_dir, source_dirs: Sequence, weights: Sequence[float], out_dir,
                      method: str = "task_arithmetic", density: float = 1.0, seed: int = 0,
                      progress: bool = False) -> dict:
    """Merge the checkpoints ``source_dirs`` (theta_k) onto ``base_dir`` (theta_0) into ``out_dir``: one
    ``model.safetensors`` written tensor by tensor, plus the non-weight files (config, tokenizer, chat template)
    of the last source, a checkpoint this suite trained. Every source must hold the base's tensors with the base's
    shapes: a mismatch raises ``ValueError`` naming the checkpoint and the tensors. Returns a summary."""
    t0 = time.perf_counter()
    if len(source_dirs) != len(weights):
        raise ValueError(f"{len(weights)} coefficients for {len(source_dirs)} checkpoints")
    base = _tensor_layout(base_dir)
    sources = [_tensor_layout(d) for d in source_dirs]
    for d, layout in zip(source_dirs, sources):
        missing, extra = sorted(set(base) - set(layout)), sorted(set(layout) - set(base))
        shapes = sorted(n for n in set(base) & set(layout) if base[n][2] != layout[n][2])
        if missing or extra or shapes:
            raise ValueError(f"checkpoint {d} cannot be merged onto the base {base_dir}: tensors missing "
                             f"{missing[:5]}, extra {extra[:5]}, of another shape {shapes[:5]}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = sorted(base)
    entries = [(n, base[n][1], base[n][2]) for n in names]
    readers = [TensorReaders({n: layout[n][0] for n in layout}) for layout in (base, *sources)]

    with maybe_progress(progress, len(names), "merge", "tensor") as bar:
        def produce(name):
            theta0 = readers[0].tensor(name)
            thetas = [r.tensor(name) for r in readers[1:]]
            merged = merge_tensor(theta0, thetas, weights, method, density, seed=tensor_seed(seed, name))
            bar.update(1)
            return merged

        write_safetensors_streamed(out / "model.safetensors", entries, produce)
    donor = Path(source_dirs[-1])
    for p in donor.iterdir():
        copied = p.name not in _WEIGHT_FILES and p.name not in _NOT_COPIED and not p.name.endswith(".safetensors")
        if p.is_file() and copied:
            shutil.copy2(p, out / p.name)
    return {"tensors": len(names), "parameters": int(sum(math.prod(base[n][2]) for n in names)),
            "method": method, "weights": [float(w) for w in weights], "density": density,
            "seconds": round(time.perf_counter() - t0, 2)}


# --- the merge run -----------------------------------------------------------------------------------------


def _same_job(a: MergeSpec, b: MergeSpec) -> bool:
    """The same merged weights: same checkpoints, coefficients and method; density only where the method reads
    it (TIES, DARE), DARE's seed only for DARE."""
    if (a.sources, a.weights, a.method) != (b.sources, b.weights, b.method):
        return False
    return a.method == "task_arithmetic" or (a.density == b.density and (a.method != "dare" or a.seed == b.seed))


def merge_twin(cfg: Config, spec: MergeSpec):
    """A complete merge run of this seed directory, under another name, that is the same job as ``spec`` (the
    same merged weights from the same complete input checkpoints), or None. ``merge_grid`` and ``merge_balanced``
    are twins whenever the validation search picks the same coefficients for both."""
    for path in sorted(cfg.seed_dir().glob("*/merge.json")):
        if path.parent.name == spec.name:
            continue
        try:
            done = json.loads(path.read_text())
            other = MergeSpec(path.parent.name, done["sources"], done["weights"], done.get("method", "task_arithmetic"),
                              done.get("density", 1.0), done.get("seed", 0))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _same_job(spec, other):
            run = merge_run(cfg, other)
            if run.is_complete():  # keyed on its spec and its inputs' completion records, as ours
                return run
    return None


def run_merge(cfg: Config, spec: MergeSpec, evaluate: bool = True):
    """Merge (skipped when the run is complete), then score the merge on the whole suite through the pipeline's
    evaluation run (``<merge>/eval/metrics.json``). Returns the merge run.

    When another complete merge is the same job (``merge_twin``), its model and its evaluation are copied, not
    computed again, and ``same_as.json`` says so in both runs."""
    runs = complete_inputs(cfg, spec.sources)
    base_dir, source_dirs = pipeline.model_dir(runs[0]), [pipeline.model_dir(r) for r in runs[1:]]
    twin = merge_twin(cfg, spec)

    def fn(run) -> None:
        if twin is not None:
            pipeline.copy_run_fn(twin, files=(), why="the same checkpoints, coefficients and method")(run)
            summary = {k: v for k, v in json.loads((twin.path / "merge.json").read_text()).items()
                       if k not in spec.to_dict()}
        else:
            with run.atomic_dir("model") as tmp:
                summary = merge_checkpoints(resolve_model_dir(base_dir), source_dirs, spec.weights, tmp,
                                            spec.method, spec.density, spec.seed, progress=True)
        run.write_json("merge.json", {**spec.to_dict(), **summary})
        run.logger.info("merge %s: %s", spec.name, summary)

    run = run_once(merge_run(cfg, spec), fn)
    if evaluate:
        copied = (run.path / "same_as.json").is_file()  # this time or when the run was made
        pipeline.evaluate_checkpoint(cfg, run, same_as=twin if copied else None)
    return run

