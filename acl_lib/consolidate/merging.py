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
    search = run_validation_search(cfg, sources, grid=[0.25, 0.5])   # merge_validation/validation.json

Merging goes tensor by tensor over the checkpoints' safetensors files and writes the merged file as it goes
(``write_safetensors_streamed``): memory stays near one tensor per checkpoint, also for 8B-parameter models. Each
merge is a run keyed on its spec and the completion records of its input checkpoints (skipped when complete; the
model directory is written atomically) and is scored on the whole suite by the pipeline's evaluation run
(``<merge>/eval``), like every stage.

**Validation, never test.** The benchmarks the tables report draw their tasks from each world's ``test`` split
(and OOD splits) with ``worlds.seed``. The worlds have no validation split, so coefficients are chosen on tasks of
each domain's *training* split drawn with ``validation_seed(cfg)`` (``VALIDATION_SEED + worlds.seed``), a seed no
training job uses (stages draw their training tasks with the training seed and the seed + 1): held out from the
reported test tasks by construction, from the same distribution as training. ``validation.json`` records the
split, the seed and the task ids scored, so the choice can be checked.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import shutil
import struct
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from acl_lib import pipeline
from acl_lib.diagnostics.weights import _progress, _Readers, resolve_model_dir, safetensors_index
from acl_lib.envs import BENCHMARKS, IN_DOMAIN
from acl_lib.eval import harness, policies  # called through the modules: tests swap harness.world
from acl_lib.processes import call_in_child
from acl_lib.runs import Run, run_once
from acl_lib.seeding import seed_and_threads

METHODS = ("task_arithmetic", "ties", "dare")
VALIDATION_SPLIT = "train"  # no world has a validation split: held-out draws of the training split (module docstring)
VALIDATION_SEED = 7919  # + worlds.seed; training draws its tasks with the training seed and seed + 1
MERGE_SECTIONS = ("model",)  # a merge depends on its spec and its input checkpoints, and on the model's dtype
VALIDATION_SECTIONS = ("model", "worlds", "eval")  # the validation search also scores (worlds, sampling settings)
VALIDATION_RUN = "merge_validation"
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
_NOT_COPIED = {"training_args.bin"}  # the trainer's arguments of the stage copied from: not the merge's
_ST_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


@dataclass(frozen=True)
class MergeSpec:
    """One merge: the run name, the checkpoints merged (run names of this seed directory, theta_k), their
    coefficients lambda_k, the method and, for TIES and DARE, the fraction of each task vector kept (``density``)
    and DARE's seed."""

    name: str
    sources: tuple[str, ...]
    weights: tuple[float, ...]
    method: str = "task_arithmetic"
    density: float = 1.0
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "sources", tuple(self.sources))
        object.__setattr__(self, "weights", tuple(float(w) for w in self.weights))
        if self.method not in METHODS:
            raise ValueError(f"merge {self.name}: unknown method {self.method!r}; methods are {list(METHODS)}")
        if not self.sources:
            raise ValueError(f"merge {self.name}: no checkpoints to merge")
        if len(self.weights) != len(self.sources):
            raise ValueError(f"merge {self.name}: {len(self.weights)} coefficients for {len(self.sources)} checkpoints")
        if not all(math.isfinite(w) for w in self.weights):
            raise ValueError(f"merge {self.name}: coefficients must be finite, got {self.weights}")
        if not 0.0 < self.density <= 1.0:
            raise ValueError(f"merge {self.name}: density must be in (0, 1], got {self.density}")

    def to_dict(self) -> dict:
        return asdict(self)


def uniform_weights(k: int) -> tuple[float, ...]:
    """The study's uniform merge: lambda_k = 1/K, the average of the K checkpoints."""
    return (1.0 / k,) * k


# --- tensors -----------------------------------------------------------------------------------------------


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
    readers = [_Readers({n: layout[n][0] for n in layout}) for layout in (base, *sources)]

    with _progress(progress, len(names), "merge", "tensor") as bar:
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


# --- runs --------------------------------------------------------------------------------------------------


def checkpoint_runs(cfg) -> dict:
    """``{run name: Run}`` of the checkpoints a merge may take as theta_k: the sequential stages and the oracles."""
    runs = {}
    for i in range(1, len(cfg.pipeline.curriculum) + 1):
        r = pipeline.sequential_run(cfg, i)
        runs[r.name] = r
    for d in cfg.pipeline.curriculum:
        r = pipeline.oracle_run(cfg, d)
        runs[r.name] = r
    return runs


def _made_by(name: str) -> str:
    return "05_oracles" if name.startswith("oracle_") else "01-04 (the sequential stages)"


def _complete_inputs(cfg, names: Sequence[str]) -> list:
    """The base run and the runs ``names``, each complete, or a RuntimeError naming what is missing."""
    known = checkpoint_runs(cfg)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"cannot merge {unknown}: not a checkpoint of this pipeline (known: {list(known)})")
    runs = [pipeline.base_run(cfg)] + [known[n] for n in names]
    missing = [r for r in runs if not r.is_complete()]
    if missing:
        lines = "; ".join(f"{r.name} ({r.status()}, {r.path}; made by notebook "
                          f"{'00' if r.name == 'base' else _made_by(r.name)})" for r in missing)
        raise RuntimeError(f"merging needs complete checkpoints: missing {lines}")
    return runs


def merge_run(cfg, spec: MergeSpec):
    """The run of ``spec`` (``<seed_dir>/<spec.name>``), keyed on the spec and its input checkpoints."""
    known = checkpoint_runs(cfg)
    inputs = [pipeline.base_run(cfg)] + [known[n] for n in spec.sources if n in known]
    return Run(cfg, spec.name, sections=MERGE_SECTIONS, inputs=inputs, extra={"merge": spec.to_dict()})


def _same_job(a: MergeSpec, b: MergeSpec) -> bool:
    """The same merged weights: same checkpoints, coefficients and method; density only where the method reads
    it (TIES, DARE), DARE's seed only for DARE."""
    if (a.sources, a.weights, a.method) != (b.sources, b.weights, b.method):
        return False
    return a.method == "task_arithmetic" or (a.density == b.density and (a.method != "dare" or a.seed == b.seed))


def merge_twin(cfg, spec: MergeSpec):
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


def run_merge(cfg, spec: MergeSpec, evaluate: bool = True):
    """Merge (skipped when the run is complete), then score the merge on the whole suite through the pipeline's
    evaluation run (``<merge>/eval/metrics.json``). Returns the merge run.

    When another complete merge is the same job (``merge_twin``), its model and its evaluation are copied, not
    computed again, and ``same_as.json`` says so in both runs."""
    runs = _complete_inputs(cfg, spec.sources)
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


# --- validation --------------------------------------------------------------------------------------------


def validation_seed(cfg) -> int:
    return VALIDATION_SEED + cfg.worlds.seed


def domain_benchmark(domain: str):
    return BENCHMARKS[IN_DOMAIN[domain]]


def validation_tasks(cfg, domain: str, n: int, envs: dict | None = None) -> list:
    """``n`` validation tasks of ``domain``: its in-domain benchmark's world, split ``VALIDATION_SPLIT``, drawn
    with ``validation_seed(cfg)`` (see the module docstring)."""
    bench = domain_benchmark(domain)
    envs = {} if envs is None else envs
    if bench.env not in envs:
        envs[bench.env] = harness.world(cfg, bench.env)
    return envs[bench.env].tasks(VALIDATION_SPLIT, n, seed=validation_seed(cfg))


def validation_scores(cfg, model: str, domains: Sequence[str], n_tasks: int, record: dict | None = None,
                      envs: dict | None = None) -> dict:
    """Score ``model`` (a checkpoint directory, or ``expert`` / ``null``) on ``n_tasks`` validation tasks of
    each domain's in-domain benchmark, greedy or with the profile's sampling settings, one sample per task.
    Returns ``{domain: percent}``; ``record`` (if given) receives the task ids scored per domain; ``envs``: a
    dict that keeps the worlds built between calls (a search scores many candidates on the same worlds)."""
    if n_tasks < 1:
        raise ValueError(f"validation needs at least one task per domain, got {n_tasks}")
    if cfg.launcher.eval_subprocess and model not in ("expert", "null"):
        # the candidate's engine in a process of its own (up to ~20 per search): its GPU memory goes with it
        scores, ids = call_in_child(_validation_in_child, cfg, str(model), list(domains), n_tasks)
        if record is not None:
            record.update(ids)
        return scores
    if model not in ("expert", "null"):
        seed_and_threads(cfg.seed, cfg.torch_threads)
    policy = policies.make_policy(str(model), cfg)
    envs = {} if envs is None else envs
    scores = {}
    try:
        for d in domains:
            bench = domain_benchmark(d)
            tasks = validation_tasks(cfg, d, n_tasks, envs)
            max_turns, max_new_tokens = cfg.eval.limits_for(bench.key)
            if hasattr(policy, "max_new_tokens"):
                policy.max_new_tokens = max_new_tokens
            summary, _ = harness.evaluate_benchmark(policy, bench, envs[bench.env], len(tasks), 1, max_turns,
                                                    batch_size=max(cfg.eval.batch_size, 1) * 4, tasks=tasks)
            scores[d] = summary["score"]
            if record is not None:
                record[d] = [t.id for t in tasks]
    finally:
        if hasattr(policy, "close"):
            policy.close()
    return scores


def _validation_in_child(cfg, model: str, domains: list[str], n_tasks: int) -> tuple[dict, dict]:
    record: dict = {}
    no_child = cfg.model_copy(update={"launcher": cfg.launcher.model_copy(update={"eval_subprocess": False})})
    return validation_scores(no_child, model, domains, n_tasks, record), record


def candidate_grid(grid: Sequence[float], k: int) -> list[tuple[float, ...]]:
    """Every lambda vector with entries from ``grid`` (K = ``k`` checkpoints), the all-zero one (the base) left
    out: ``len(grid) ** k`` candidates, so keep the grid short (2 values -> 16 candidates for 4 stages)."""
    if not grid:
        raise ValueError("the coefficient grid is empty")
    if not all(math.isfinite(float(g)) for g in grid):
        raise ValueError(f"grid values must be finite, got {list(grid)}")
    values = sorted(dict.fromkeys(float(g) for g in grid))
    return [c for c in itertools.product(values, repeat=k) if any(v != 0 for v in c)]


def relative_scores(scores: Mapping[str, float], oracle: Mapping[str, float]) -> dict[str, float]:
    """Each domain's validation score over its oracle's (1.0 = the oracle's level). A domain whose oracle scores
    0 on validation has nothing to recover and is left out."""
    return {d: scores[d] / oracle[d] for d in scores if oracle.get(d)}


def choose(candidates: list[dict], oracle: Mapping[str, float]) -> dict:
    """From scored candidates (``{"weights", "scores": {domain: %}}``) the grid-searched choice (best mean
    validation score) and the capability-balanced one (best worst-domain score relative to its oracle; the mean
    breaks ties; with no oracle above 0 it falls back to the mean). Ties keep the earlier candidate. Returns
    ``{"grid": candidate, "balanced": candidate}``, each with its ``mean`` and ``worst_relative``."""
    if not candidates:
        raise ValueError("no candidates to choose from")
    for c in candidates:
        c["mean"] = sum(c["scores"].values()) / len(c["scores"])
        rel = relative_scores(c["scores"], oracle)
        c["worst_relative"] = min(rel.values()) if rel else None
    grid = max(candidates, key=lambda c: c["mean"])  # max keeps the first of equals
    balanced = max(candidates, key=lambda c: (c["worst_relative"] if c["worst_relative"] is not None else -1.0,
                                              c["mean"]))
    return {"grid": grid, "balanced": balanced}


def search_weights(base_dir, source_dirs: Sequence, candidates: Sequence[Sequence[float]],
                   scorer: Callable[[str], dict], work_dir, progress: bool = False) -> list[dict]:
    """Merge each candidate lambda into ``work_dir/candidate`` (task arithmetic), score it with
    ``scorer(model_dir) -> {domain: %}`` and remove it. Returns ``[{"weights", "scores"}]`` in candidate order."""
    work = Path(work_dir) / "candidate"
    out = []
    with _progress(progress, len(candidates), "validation", "candidate") as bar:
        for lam in candidates:
            shutil.rmtree(work, ignore_errors=True)
            merge_checkpoints(base_dir, source_dirs, lam, work)
            scores = scorer(str(work))
            shutil.rmtree(work, ignore_errors=True)
            out.append({"weights": [float(w) for w in lam], "scores": scores})
            bar.update(1, mean=round(sum(scores.values()) / max(1, len(scores)), 1))
    return out


def validation_run(cfg, sources: Sequence[str], grid: Sequence[float], n_tasks: int):
    known = checkpoint_runs(cfg)
    oracles = [known[f"oracle_{d}"] for d in cfg.pipeline.curriculum]
    inputs = [pipeline.base_run(cfg)] + [known[n] for n in sources if n in known] + oracles
    return Run(cfg, VALIDATION_RUN, sections=VALIDATION_SECTIONS, inputs=inputs,
               extra={"sources": list(sources), "grid": [float(g) for g in grid], "n_tasks": n_tasks,
                      "split": VALIDATION_SPLIT, "validation_seed": validation_seed(cfg)})


def run_validation_search(cfg, sources: Sequence[str], grid: Sequence[float], n_tasks: int) -> dict:
    """Score every candidate of ``candidate_grid(grid, len(sources))`` and each oracle (on its own domain) on the
    validation tasks, choose the grid-searched and the capability-balanced coefficients; a run of its own
    (``merge_validation/validation.json``), skipped when complete. Returns that JSON."""
    domains = list(cfg.pipeline.curriculum)
    oracle_names = [f"oracle_{d}" for d in domains]
    runs = _complete_inputs(cfg, list(sources) + oracle_names)
    base_dir = pipeline.model_dir(runs[0])
    source_dirs = [pipeline.model_dir(r) for r in runs[1:1 + len(sources)]]
    oracle_dirs = {d: pipeline.model_dir(r) for d, r in zip(domains, runs[1 + len(sources):])}
    candidates = candidate_grid(grid, len(sources))

    def fn(run) -> None:
        task_ids: dict = {}
        envs: dict = {}
        oracle = {}
        with _progress(True, len(oracle_dirs), "validation: oracles", "oracle") as bar:
            for d, m in oracle_dirs.items():
                oracle[d] = validation_scores(cfg, str(m), [d], n_tasks, task_ids, envs)[d]
                bar.update(1, **{d: round(oracle[d], 1)})
        # A domain whose own oracle scores 0 on validation has nothing a merge could recover (at the mini profile,
        # the retail desk): the candidates are not scored there, which spares its long multi-turn episodes.
        scored_domains = [d for d in domains if oracle[d] > 0] or domains
        scored = search_weights(resolve_model_dir(base_dir), source_dirs, candidates,
                                lambda m: validation_scores(cfg, m, scored_domains, n_tasks, envs=envs),
                                run.path, progress=True)
        chosen = choose(scored, oracle)
        run.write_json("validation.json", {
            "split": VALIDATION_SPLIT, "validation_seed": validation_seed(cfg), "n_tasks": n_tasks,
            "task_ids": task_ids, "sources": list(sources), "grid": [float(g) for g in grid],
            "scored_domains": scored_domains, "oracle_scores": oracle, "candidates": scored,
            "chosen": {k: {"weights": c["weights"], "scores": c["scores"], "mean": c["mean"],
                           "worst_relative": c["worst_relative"]} for k, c in chosen.items()},
        })

    run = run_once(validation_run(cfg, sources, grid, n_tasks), fn)
    return run.read_json("validation.json")


# --- the study's set of merges -----------------------------------------------------------------------------


def merge_specs(cfg, chosen: Mapping[str, Sequence[float]] | None = None, ties_density: float = 0.5,
                dare_density: float = 0.5, oracles: bool = True, seed: int = 0) -> list[MergeSpec]:
    """The merges notebook 10 runs: ``merge_uniform`` (the study's), ``merge_grid`` and ``merge_balanced`` (from
    ``chosen``, the validation search's choice), ``merge_ties`` (lambda_k = 1: TIES takes the mean of the task
    vectors that agree in sign), ``merge_dare`` (lambda_k = 1/K: in expectation the uniform merge) and, with
    ``oracles``, ``merge_oracles`` (the uniform merge of the four oracles)."""
    seqs = [n for n in checkpoint_runs(cfg) if not n.startswith("oracle_")]
    k = len(seqs)
    specs = [MergeSpec("merge_uniform", seqs, uniform_weights(k))]
    for key in ("grid", "balanced"):
        if chosen and key in chosen:
            specs.append(MergeSpec(f"merge_{key}", seqs, tuple(chosen[key])))
    specs.append(MergeSpec("merge_ties", seqs, (1.0,) * k, method="ties", density=ties_density))
    specs.append(MergeSpec("merge_dare", seqs, uniform_weights(k), method="dare", density=dare_density, seed=seed))
    if oracles:
        names = [f"oracle_{d}" for d in cfg.pipeline.curriculum]
        specs.append(MergeSpec("merge_oracles", names, uniform_weights(len(names))))
    return specs
