"""Weight-level diagnostics: task vectors, stage updates, their geometry, and SFT versus RL displacement.

Every quantity here is a dot product between differences of checkpoints, so everything comes from one Gram
matrix, accumulated tensor by tensor (and, for large tensors, row block by row block) over the checkpoints'
safetensors files with ``safe_open``: memory stays near ``len(checkpoints) x block`` elements, never a whole
model per checkpoint (at the paper profile a dozen 8B-parameter checkpoints).

    gram = streamed_gram({"base": dir0, "seq_math": dir1, ...}, base="base")   # one pass over the files
    gram.norm(task_vector("seq_math"))                       # ||theta_seq_math - theta_base||
    gram.cosine(update("seq_search", "seq_math"), task_vector("oracle_search"))
    gram.pca({name: task_vector(name) ...})                  # the study's PCA of unit-normalised displacements

The Gram is kept over ``[theta_base, d_1, ..., d_n]`` with ``d_c = theta_c - theta_base`` computed in float64
per block, so small displacements of large weights are not lost to cancellation. It is kept for the whole
model and for each group of tensors: module type (``type:attention``, ``type:mlp``, ``type:embeddings``,
``type:norm``, ``type:other``) and layer (``layer:0`` ... ; ``layer:none`` for tensors outside the blocks).

A vector is a ``{checkpoint: coefficient}`` mapping over the checkpoints' weights: ``task_vector(c)`` is
``{c: 1, base: -1}``, ``update(c, start)`` is ``{c: 1, start: -1}``, ``weights(c)`` is ``{c: 1}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from acl_lib.model.checkpoint_files import TensorReaders, resolve_model_dir, safetensors_index
from acl_lib.progress import maybe_progress
from acl_lib.steps import made_by

# Where the SDFT step writes the study's update-direction check (the same SFT mixture from the base and from the
# sequential endpoint: cosine 0.77 in the study; unrelated SFT tasks: 0.05), relative to a seed directory. It is
# written by ``acl_lib.consolidate.sdft.directions`` with this module's Gram and read here and by the findings from
# disk: the diagnostics and the consolidations are steps of one layer and do not import each other.
UPDATE_DIRECTIONS = "sdft_directions/directions.json"
BLOCK_ELEMENTS = 1 << 22  # elements per checkpoint held at once (32 MiB as float64): larger tensors go by row blocks
MODULE_TYPES = ("embeddings", "attention", "mlp", "norm", "other")
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def module_type(name: str) -> str:
    """The module type of a tensor name in the HF Qwen3/Llama layout: embeddings (``embed_tokens``,
    ``lm_head``), norm (any ``*norm*``, including ``q_norm``/``k_norm``), attention (``self_attn``), mlp, other."""
    if "embed_tokens" in name or "lm_head" in name or "wte" in name:
        return "embeddings"
    parts = name.split(".")
    if "norm" in (parts[-2] if len(parts) >= 2 else parts[0]):  # the module's own name: q_norm, input_layernorm
        return "norm"
    if "self_attn" in name or ".attn." in name or "attention" in name:
        return "attention"
    if ".mlp." in name or "feed_forward" in name:
        return "mlp"
    return "other"


def layer_of(name: str) -> int | None:
    """The transformer block a tensor belongs to (``model.layers.3.mlp...`` -> 3), None outside the blocks."""
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None


def groups_of(name: str) -> list[str]:
    layer = layer_of(name)
    return ["all", f"type:{module_type(name)}", f"layer:{'none' if layer is None else layer}"]


# --- the Gram ----------------------------------------------------------------------------------------------


@dataclass
class Gram:
    """Gram matrices over ``[theta_base, d_1 .. d_n]`` per group (``all``, ``type:*``, ``layer:*``).

    ``names[0]`` is the base checkpoint, ``names[i]`` (i >= 1) the checkpoint whose displacement is slot i.
    ``sizes[group]``: parameters in the group. Dot products are in the weights' own units (float64)."""

    names: list[str]
    base: str
    grams: dict[str, np.ndarray]
    sizes: dict[str, int] = field(default_factory=dict)

    def coefficients(self, vec: Mapping[str, float]) -> np.ndarray:
        """Coefficients of a vector over the Gram's slots: ``theta_c = theta_base + d_c``."""
        a = np.zeros(len(self.names))
        for name, coef in vec.items():
            if name not in self.names:
                raise KeyError(f"checkpoint {name!r} is not in this Gram (have {self.names})")
            a[0] += coef
            if name != self.base:
                a[self.names.index(name)] += coef
        return a

    def dot(self, u: Mapping[str, float], v: Mapping[str, float], group: str = "all") -> float:
        return float(self.coefficients(u) @ self.grams[group] @ self.coefficients(v))

    def norm(self, v: Mapping[str, float], group: str = "all") -> float:
        return float(np.sqrt(max(self.dot(v, v, group), 0.0)))

    def cosine(self, u: Mapping[str, float], v: Mapping[str, float], group: str = "all") -> float:
        nu, nv = self.norm(u, group), self.norm(v, group)
        return float("nan") if nu == 0 or nv == 0 else self.dot(u, v, group) / (nu * nv)

    def vectors_gram(self, vecs: Mapping[str, Mapping[str, float]], group: str = "all") -> np.ndarray:
        """The Gram of the given vectors (``len(vecs)`` x ``len(vecs)``)."""
        A = np.stack([self.coefficients(v) for v in vecs.values()])
        return A @ self.grams[group] @ A.T

    def cosine_matrix(self, vecs: Mapping[str, Mapping[str, float]], group: str = "all") -> np.ndarray:
        G = self.vectors_gram(vecs, group)
        n = np.sqrt(np.clip(np.diag(G), 0, None))
        with np.errstate(invalid="ignore", divide="ignore"):
            return G / np.outer(n, n)

    def groups(self, prefix: str) -> list[str]:
        keys = [g for g in self.grams if g.startswith(prefix)]
        if prefix == "layer:":
            return sorted(keys, key=lambda g: (g == "layer:none", int(g[6:]) if g[6:].isdigit() else 0))
        return [f"type:{t}" for t in MODULE_TYPES if f"type:{t}" in keys]

    def pca(self, vecs: Mapping[str, Mapping[str, float]], components: int = 2) -> dict:
        """The study's PCA: unit-normalise each vector, centre, project on the first principal components.

        Done in kernel form from the vectors' cosine matrix ``K`` (PCA of n points needs only their Gram):
        ``H K H = V diag(lambda) V^T`` with ``H`` the centring matrix; the coordinates are ``V sqrt(lambda)``.
        Returns ``{"points": {name: [pc1, pc2]}, "origin": [...], "explained": [share of variance per PC]}``;
        ``origin`` is where the base (displacement 0) projects."""
        names = list(vecs)
        K = self.cosine_matrix(vecs)
        if np.isnan(K).any():
            zero = [n for n, row in zip(names, K) if np.isnan(row).all()]
            raise ValueError(f"PCA of unit-normalised displacements: {zero} did not move (zero displacement)")
        n = len(names)
        H = np.eye(n) - np.full((n, n), 1.0 / n)
        lam, V = np.linalg.eigh(H @ K @ H)
        order = np.argsort(lam)[::-1]
        lam, V = np.clip(lam[order], 0, None), V[:, order]
        k = min(components, n)
        coords = V[:, :k] * np.sqrt(lam[:k])
        # the origin x = 0: (0 - mu) . e_j, e_j = sum_i V_ij (x_i - mu) / sqrt(lambda_j)
        with np.errstate(invalid="ignore", divide="ignore"):
            origin = (V[:, :k].T @ (K.mean() - K.mean(axis=1))) / np.sqrt(lam[:k])
        origin = np.nan_to_num(origin)
        total = lam.sum()
        if coords.shape[1] < components:  # fewer points than components: pad with zeros
            pad = components - coords.shape[1]
            coords, origin = np.pad(coords, ((0, 0), (0, pad))), np.pad(origin, (0, pad))
            lam = np.pad(lam, (0, pad))
        return {"points": {nm: [float(x) for x in coords[i]] for i, nm in enumerate(names)},
                "origin": [float(x) for x in origin],
                "explained": [float(x / total) if total > 0 else 0.0 for x in lam[:components]]}


def _row_block(tensor_slice, lo: int, hi: int, shape):
    """Rows ``lo:hi`` of a safetensors slice (the whole tensor for a scalar), as a flat float64 tensor."""
    import torch

    t = tensor_slice[lo:hi] if shape else tensor_slice[:]
    return t.to(torch.float64).reshape(-1)


def streamed_gram(models: Mapping[str, str | Path], base: str, block_elements: int = BLOCK_ELEMENTS,
                  progress: bool = True) -> Gram:
    """One pass over the checkpoints' safetensors files, tensor by tensor (row blocks of at most
    ``block_elements`` elements for a large tensor), accumulating the Gram of ``[theta_base, d_1 .. d_n]``
    per group. ``models``: ``{name: model dir}`` including ``base``. Every checkpoint must hold the base's
    tensors with the base's shapes (a tensor missing or reshaped is an error naming the checkpoint)."""
    import torch

    if base not in models:
        raise KeyError(f"the base checkpoint {base!r} is not among the models {list(models)}")
    names = [base] + [n for n in models if n != base]
    indexes = {}
    for n in names:
        try:
            indexes[n] = safetensors_index(models[n])
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"checkpoint {n}: {exc}") from None
    tensors = sorted(indexes[base])
    for n in names[1:]:
        absent = sorted(set(tensors) - set(indexes[n]))
        if absent:
            raise ValueError(f"checkpoint {n} ({models[n]}) lacks {len(absent)} tensor(s) of the base, "
                             f"e.g. {absent[:3]}")
    readers = {n: TensorReaders(indexes[n]) for n in names}
    k = len(names)
    grams: dict[str, np.ndarray] = {}
    sizes: dict[str, int] = {}

    with maybe_progress(progress, len(tensors), "weights: gram", "tensor") as bar:
        for name in tensors:
            slices = {n: readers[n].slice(name) for n in names}
            shape = slices[base].get_shape()
            for n in names[1:]:
                if slices[n].get_shape() != shape:
                    raise ValueError(f"checkpoint {n}: tensor {name} has shape {slices[n].get_shape()}, "
                                     f"the base {shape}")
            rows = shape[0] if shape else 1
            per_row = max(1, int(np.prod(shape[1:])) if len(shape) > 1 else 1)
            step = max(1, block_elements // per_row)
            G = np.zeros((k, k))
            for lo in range(0, rows, step):
                hi = min(rows, lo + step)
                b = _row_block(slices[base], lo, hi, shape)
                X = torch.empty((k, b.numel()), dtype=torch.float64)
                X[0] = b
                for i, n in enumerate(names[1:], start=1):
                    X[i] = _row_block(slices[n], lo, hi, shape) - b
                G += (X @ X.T).numpy()
            numel = int(np.prod(shape)) if shape else 1
            for g in groups_of(name):
                grams[g] = grams.get(g, np.zeros((k, k))) + G
                sizes[g] = sizes.get(g, 0) + numel
            bar.update(1)
    return Gram(names, base, grams, sizes)


def dense_gram(state_dicts: Mapping[str, Mapping[str, object]], base: str) -> Gram:
    """The same Gram from in-memory state dicts (``{name: {tensor: torch.Tensor}}``), whole models at once: the
    reference the streamed computation is tested against."""
    import torch

    names = [base] + [n for n in state_dicts if n != base]
    keys = sorted(state_dicts[base])
    grams, sizes = {}, {}
    for group in {g for key in keys for g in groups_of(key)}:
        sel = [key for key in keys if group in groups_of(key)]
        flat = {n: torch.cat([state_dicts[n][key].to(torch.float64).reshape(-1) for key in sel]) for n in names}
        X = torch.stack([flat[base]] + [flat[n] - flat[base] for n in names[1:]])
        grams[group] = (X @ X.T).numpy()
        sizes[group] = int(flat[base].numel())
    return Gram(names, base, grams, sizes)


# --- vectors -----------------------------------------------------------------------------------------------


def _combination(*terms: tuple[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, coef in terms:  # summed, so that base - base is zero rather than a dict key overwritten
        out[name] = out.get(name, 0.0) + coef
    return out


def task_vector(checkpoint: str, base: str = "base") -> dict[str, float]:
    """``theta_checkpoint - theta_base``."""
    return _combination((checkpoint, 1.0), (base, -1.0))


def update(checkpoint: str, start: str) -> dict[str, float]:
    """A stage's own update: ``theta_checkpoint - theta_start`` (the checkpoint it was trained from)."""
    return _combination((checkpoint, 1.0), (start, -1.0))


def weights(checkpoint: str) -> dict[str, float]:
    return {checkpoint: 1.0}


def weight_change(before: str | Path, after: str | Path, progress: bool = False) -> tuple[float, float]:
    """``(||theta_after - theta_before||, ||theta_before||)`` of two checkpoints, streamed over their safetensors
    files: how far a training job moved the model it started from (the consolidations record it)."""
    gram = streamed_gram({"before": resolve_model_dir(before), "after": resolve_model_dir(after)}, base="before",
                         progress=progress)
    return gram.norm(update("after", "before")), gram.norm(weights("before"))


# --- the weight diagnostics in one call ----------------------------------------------------------------------


def gram_for(found, progress: bool = True, block_elements: int = BLOCK_ELEMENTS) -> Gram:
    """The streamed Gram over every present checkpoint of ``found`` (``checkpoints.CheckpointSet``) and the
    SFT models of the stages that kept one (slot ``<run>/sft``)."""
    if not found["base"].present:
        raise FileNotFoundError(f"the weight diagnostics need the base checkpoint: run {made_by('base')} first")
    models = {}
    for c in found.present():
        models[c.name] = c.model
        if c.sft_model:
            models[f"{c.name}/sft"] = c.sft_model
    return streamed_gram(models, "base", block_elements=block_elements, progress=progress)


def _finite(x):
    return None if x is None or not np.isfinite(x) else float(x)


def _oracle_of(found, domain):
    name = f"oracle_{domain}"
    return name if name in found and found[name].present else None


def stage_rows(gram: Gram, found) -> list[dict]:
    """Per sequential stage (and per oracle): distance to the base (absolute and relative to the base's weight
    norm), the norm of the stage's own update, and the cosines of the stage's update and of its task vector
    with its own domain's oracle vector."""
    base_norm = gram.norm(weights("base"))
    rows = []
    for c in found.present(("seq", "oracle", "extra")):
        tv = task_vector(c.name)
        up = update(c.name, c.start) if c.start in gram.names else None
        oracle = _oracle_of(found, c.domain) if c.domain else None
        own = c.kind == "oracle" or (oracle is not None and c.start == "base")  # its update *is* the oracle job
        rows.append({
            "checkpoint": c.name, "kind": c.kind, "domain": c.domain, "start": c.start,
            "distance_to_base": gram.norm(tv), "relative_distance": gram.norm(tv) / base_norm,
            "update_norm": gram.norm(up) if up else None,
            "cos_update_vs_oracle": _finite(gram.cosine(up, task_vector(oracle)))
            if up and oracle and c.kind != "oracle" else None,
            "cos_task_vector_vs_oracle": _finite(gram.cosine(tv, task_vector(oracle)))
            if oracle and c.kind != "oracle" else None,
            "starts_from_base": own,
        })
    return rows


def vector_set(found) -> dict[str, dict[str, float]]:
    """The task vectors (``tau:<run>``) of every present checkpoint and the stage updates (``delta:<run>``) of
    the sequential stages after the first (the first stage's update is its task vector)."""
    vecs = {}
    for c in found.present(("seq", "oracle", "extra")):
        vecs[f"tau:{c.name}"] = task_vector(c.name)
    for c in found.present(("seq",)):
        if c.start != "base" and c.start in found and found[c.start].present:
            vecs[f"delta:{c.name}"] = update(c.name, c.start)
    return vecs


def sft_rl_rows(gram: Gram, found) -> list[dict]:
    """For each stage that cold-started: the SFT phase's update (``sft - start``) and the RL phase's
    (``final - sft``), absolute and relative to the starting weights' norm, and their ratio (the study: SFT
    moves the parameters 3 to 7 times more than RL)."""
    rows = []
    for c in found.present(("seq", "oracle")):
        sft = f"{c.name}/sft"
        if sft not in gram.names or c.start not in gram.names:
            continue
        start_norm = gram.norm(weights(c.start))
        s, r = gram.norm(update(sft, c.start)), gram.norm(update(c.name, sft))
        rows.append({"checkpoint": c.name, "domain": c.domain, "sft_norm": s, "rl_norm": r,
                     "sft_relative": s / start_norm, "rl_relative": r / start_norm,
                     "sft_over_rl": s / r if r > 0 else None,  # None: the RL phase did not move the weights
                     "cos_sft_rl": _finite(gram.cosine(update(sft, c.start), update(c.name, sft)))})
    return rows


def breakdown_rows(gram: Gram, found) -> list[dict]:
    """The displacement of each phase (SFT, RL, or the whole stage where there was no cold start) per module
    type and per layer: norm, and norm relative to the same group's starting weights."""
    rows = []
    for c in found.present(("seq", "oracle")):
        if c.start not in gram.names:
            continue
        sft = f"{c.name}/sft"
        phases = ({"sft": update(sft, c.start), "rl": update(c.name, sft)} if sft in gram.names
                  else {"stage": update(c.name, c.start)})
        for phase, vec in phases.items():
            for group in gram.groups("type:") + gram.groups("layer:"):
                n = gram.norm(vec, group)
                ref = gram.norm(weights(c.start), group)
                rows.append({"checkpoint": c.name, "phase": phase, "group": group, "norm": n,
                             "relative": n / ref if ref > 0 else None, "parameters": gram.sizes.get(group)})
    return rows


def weight_diagnostics(found, progress: bool = True) -> dict:
    """Everything the weight diagnostics show, as a JSON-able dict: per-stage rows, the PCA, the cosine matrix,
    SFT vs RL, the per-group breakdown, the base's weight norm, which checkpoints were present and which missing."""
    gram = gram_for(found, progress=progress)
    vecs = vector_set(found)
    pca_vecs = {c.name: task_vector(c.name) for c in found.present(("seq", "oracle", "extra"))}
    moved = {n: v for n, v in pca_vecs.items() if gram.norm(v) > 0}
    C = gram.cosine_matrix(vecs) if vecs else np.zeros((0, 0))
    return {
        "checkpoints": [c.name for c in found.present()],
        "sft_models": [n for n in gram.names if n.endswith("/sft")],
        "missing": [{"checkpoint": c.name, "status": c.status} for c in found.missing()],
        "parameters": gram.sizes.get("all"),
        "base_weight_norm": gram.norm(weights("base")),
        "stages": stage_rows(gram, found),
        "pca": gram.pca(moved) if len(moved) >= 2 else None,
        "cosine": {"labels": list(vecs), "matrix": [[None if np.isnan(x) else float(x) for x in row] for row in C]},
        "sft_vs_rl": sft_rl_rows(gram, found),
        "breakdown": breakdown_rows(gram, found),
    }


def read_update_directions(seed_dir: str | Path) -> dict | None:
    """The SDFT step's update-direction check of a seed (:data:`UPDATE_DIRECTIONS`), None until it has run:
    ``same_sft_from_base_vs_seq_final`` (the quantity the study's 0.77 belongs to) and
    ``unrelated_single_domain_sft`` (``kind``, ``pairs``, ``mean``: the study's 0.05)."""
    path = Path(seed_dir) / UPDATE_DIRECTIONS
    return json.loads(path.read_text()) if path.is_file() else None


def cosine_summary(diag: dict) -> dict:
    """Two cosines of this run's own checkpoints, read from ``weight_diagnostics``: the mean cosine of a
    sequential stage's own update with its domain's oracle vector, and the mean cosine between the task vectors of
    oracles of different domains. Neither is a quantity the study reports a figure for (its 0.77 and 0.05 are the
    SDFT step's update directions, :func:`read_update_directions`): they show how far the task updates are
    aligned."""
    labels, M = diag["cosine"]["labels"], diag["cosine"]["matrix"]
    same = [r["cos_update_vs_oracle"] for r in diag["stages"]
            if r["kind"] == "seq" and r["cos_update_vs_oracle"] is not None and not r["starts_from_base"]]
    oracles = [i for i, lab in enumerate(labels) if lab.startswith("tau:oracle_")]
    cross = [M[i][j] for a, i in enumerate(oracles) for j in oracles[a + 1:] if M[i][j] is not None]
    return {"same_domain_update_vs_oracle": float(np.mean(same)) if same else None, "n_same": len(same),
            "unrelated_oracles": float(np.mean(cross)) if cross else None, "n_unrelated": len(cross)}
