"""Weight diagnostics: the streamed Gram equals the dense one, and PCA / cosines / SFT-vs-RL read a known geometry."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from acl_lib.diagnostics import weights as W
from acl_lib.diagnostics.checkpoints import Checkpoint, CheckpointSet

MINI_BASE = Path(__file__).resolve().parents[1] / "acl_lib" / "data" / "mini_base"

SHAPES = {  # a tiny model in the HF Qwen3 layout: one tensor per module type
    "model.embed_tokens.weight": (8, 4),
    "model.layers.0.self_attn.q_proj.weight": (4, 4),
    "model.layers.0.mlp.up_proj.weight": (6, 4),
    "model.layers.0.input_layernorm.weight": (4,),
    "model.layers.1.mlp.down_proj.weight": (4, 6),
    "model.norm.weight": (4,),
}


def _unit(name: str, seed: int) -> dict[str, torch.Tensor]:
    """A unit vector of parameter space living in one tensor only."""
    g = torch.Generator().manual_seed(seed)
    out = {k: torch.zeros(s) for k, s in SHAPES.items()}
    t = torch.randn(SHAPES[name], generator=g)
    out[name] = t / t.norm()
    return out


def _add(sd, *terms):
    out = {k: v.clone() for k, v in sd.items()}
    for coef, vec in terms:
        for k in out:
            out[k] += coef * vec[k]
    return out


def _save(root: Path, name: str, sd) -> str:
    d = root / name.replace("/", "_")
    d.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(d / "model.safetensors"))
    return str(d)


@pytest.fixture
def geometry(tmp_path):
    """base; oracle_a = base + 2 e_emb; oracle_b = base + 3 e_attn (orthogonal to oracle_a);
    seq_a = base + e_emb; seq_b cold-starts from seq_a: sft = seq_a + 6 e_mlp, then RL adds 2 e_attn."""
    g = torch.Generator().manual_seed(0)
    base = {k: torch.randn(s, generator=g) for k, s in SHAPES.items()}
    e_emb, e_attn = _unit("model.embed_tokens.weight", 1), _unit("model.layers.0.self_attn.q_proj.weight", 2)
    e_mlp = _unit("model.layers.0.mlp.up_proj.weight", 3)
    sds = {"base": base, "oracle_a": _add(base, (2, e_emb)), "oracle_b": _add(base, (3, e_attn)),
           "seq_a": _add(base, (1, e_emb))}
    sds["seq_b/sft"] = _add(sds["seq_a"], (6, e_mlp))
    sds["seq_b"] = _add(sds["seq_b/sft"], (2, e_attn))
    dirs = {n: _save(tmp_path, n, sd) for n, sd in sds.items()}
    found = CheckpointSet([
        Checkpoint("base", "base", None, None, dirs["base"]),
        Checkpoint("seq_a", "seq", "a", "base", dirs["seq_a"]),
        Checkpoint("seq_b", "seq", "b", "seq_a", dirs["seq_b"], sft_model=dirs["seq_b/sft"]),
        Checkpoint("oracle_a", "oracle", "a", "base", dirs["oracle_a"]),
        Checkpoint("oracle_b", "oracle", "b", "base", dirs["oracle_b"]),
        Checkpoint("oracle_c", "oracle", "c", "base", None, status="missing"),
    ])
    return found, sds


def test_known_geometry_cosines_distances_and_sft_vs_rl(geometry):
    found, sds = geometry
    diag = W.weight_diagnostics(found, progress=False)
    rows = {r["checkpoint"]: r for r in diag["stages"]}
    assert rows["seq_a"]["distance_to_base"] == pytest.approx(1.0)
    assert rows["seq_b"]["distance_to_base"] == pytest.approx(math.sqrt(1 + 36 + 4))
    assert rows["seq_b"]["update_norm"] == pytest.approx(math.sqrt(40))
    assert rows["seq_b"]["cos_update_vs_oracle"] == pytest.approx(2 / math.sqrt(40))
    assert rows["seq_b"]["cos_task_vector_vs_oracle"] == pytest.approx(2 / math.sqrt(41))
    assert rows["seq_a"]["cos_update_vs_oracle"] == pytest.approx(1.0)  # the first stage is its oracle's direction
    base_norm = math.sqrt(sum(float((v.double() ** 2).sum()) for v in sds["base"].values()))
    assert diag["base_weight_norm"] == pytest.approx(base_norm)
    assert rows["seq_b"]["relative_distance"] == pytest.approx(math.sqrt(41) / base_norm)

    cos = W.cosine_summary(diag)
    assert cos["unrelated_oracles"] == pytest.approx(0.0, abs=1e-12) and cos["n_unrelated"] == 1
    assert cos["same_domain_update_vs_oracle"] == pytest.approx(2 / math.sqrt(40)) and cos["n_same"] == 1
    labels = diag["cosine"]["labels"]
    assert labels == ["tau:seq_a", "tau:seq_b", "tau:oracle_a", "tau:oracle_b", "delta:seq_b"]
    M = np.array(diag["cosine"]["matrix"])
    assert np.allclose(np.diag(M), 1.0) and np.allclose(M, M.T)
    assert M[labels.index("tau:seq_a"), labels.index("tau:oracle_a")] == pytest.approx(1.0)
    assert M[labels.index("delta:seq_b"), labels.index("tau:oracle_a")] == pytest.approx(0.0, abs=1e-12)

    (sr,) = diag["sft_vs_rl"]
    seq_a_norm = math.sqrt(sum(float((v.double() ** 2).sum()) for v in sds["seq_a"].values()))
    assert sr["checkpoint"] == "seq_b" and sr["sft_norm"] == pytest.approx(6) and sr["rl_norm"] == pytest.approx(2)
    assert sr["sft_over_rl"] == pytest.approx(3.0) and sr["sft_relative"] == pytest.approx(6 / seq_a_norm)
    assert sr["cos_sft_rl"] == pytest.approx(0.0, abs=1e-12)

    br = {(r["checkpoint"], r["phase"], r["group"]): r["norm"] for r in diag["breakdown"]}
    assert br[("seq_b", "sft", "type:mlp")] == pytest.approx(6)
    assert br[("seq_b", "sft", "type:attention")] == pytest.approx(0)
    assert br[("seq_b", "rl", "type:attention")] == pytest.approx(2)
    assert br[("seq_b", "rl", "type:mlp")] == pytest.approx(0)
    assert br[("seq_b", "sft", "layer:0")] == pytest.approx(6) and br[("seq_b", "sft", "layer:1")] == pytest.approx(0)
    assert br[("seq_a", "stage", "type:embeddings")] == pytest.approx(1)  # no cold start: one phase
    assert diag["missing"] == [{"checkpoint": "oracle_c", "status": "missing"}]


def test_pca_of_unit_vectors_in_a_plane_keeps_their_distances(geometry):
    """Unit vectors within a 2-D subspace: two components carry all the variance, the projected points keep
    their pairwise distances (sqrt(2 - 2 cos)) and the base (zero displacement) projects at distance 1 from each."""
    found, _ = geometry
    gram = W.gram_for(found, progress=False)
    vecs = {n: W.task_vector(n) for n in ("seq_a", "oracle_b", "oracle_a")}  # e_emb, e_attn, e_emb: rank 2
    vecs["mix"] = {"oracle_a": 1.0, "oracle_b": 1.0, "base": -2.0}  # 2 e_emb + 3 e_attn
    pca = gram.pca(vecs)
    assert sum(pca["explained"]) == pytest.approx(1.0)
    pts = {n: np.array(p) for n, p in pca["points"].items()}
    K = gram.cosine_matrix(vecs)
    names = list(vecs)
    for i, a in enumerate(names):
        assert np.linalg.norm(pts[a] - np.array(pca["origin"])) == pytest.approx(1.0)
        for j, b in enumerate(names):
            assert np.sum((pts[a] - pts[b]) ** 2) == pytest.approx(2 - 2 * K[i, j], abs=1e-9)
    assert np.linalg.norm(pts["seq_a"] - pts["oracle_a"]) == pytest.approx(0.0, abs=1e-9)  # same direction
    with pytest.raises(ValueError, match="did not move"):
        gram.pca({"base": W.task_vector("base"), "seq_a": W.task_vector("seq_a")})


def _perturbed_copies(tmp_path, n=2):
    """The shipped mini base and ``n`` copies with noise on every tensor (what a stage might do)."""
    sd = load_file(str(MINI_BASE / "model.safetensors"))
    dirs = {"base": str(MINI_BASE)}
    for i in range(n):
        g = torch.Generator().manual_seed(10 + i)
        dirs[f"ckpt{i}"] = _save(tmp_path, f"ckpt{i}", {k: v + 1e-3 * (i + 1) * torch.randn(v.shape, generator=g)
                                                     for k, v in sd.items()})
    return dirs


def test_streamed_gram_equals_dense_on_a_small_model(tmp_path):
    dirs = _perturbed_copies(tmp_path)
    # a block of 1000 elements forces large tensors (embeddings 2048 x 192) to stream by row blocks
    streamed = W.streamed_gram(dirs, "base", block_elements=1000, progress=False)
    dense = W.dense_gram({n: load_file(str(Path(d) / "model.safetensors")) for n, d in dirs.items()}, "base")
    assert streamed.names == dense.names and set(streamed.grams) == set(dense.grams)
    for group, G in dense.grams.items():
        np.testing.assert_allclose(streamed.grams[group], G, rtol=1e-10, atol=1e-10, err_msg=group)
        assert streamed.sizes[group] == dense.sizes[group]
    assert streamed.sizes["all"] == sum(v.numel() for v in load_file(str(MINI_BASE / "model.safetensors")).values())
    assert {"type:embeddings", "type:attention", "type:mlp", "type:norm", "layer:0", "layer:none"} <= set(dense.grams)
    # and it measures what it should: ckpt1's noise is twice ckpt0's
    assert streamed.norm(W.task_vector("ckpt1")) / streamed.norm(W.task_vector("ckpt0")) == pytest.approx(2.0, rel=0.01)


def test_errors_name_the_checkpoint(tmp_path):
    dirs = _perturbed_copies(tmp_path, n=1)
    with pytest.raises(FileNotFoundError, match="checkpoint gone"):
        W.streamed_gram({**dirs, "gone": str(tmp_path / "nowhere")}, "base", progress=False)
    sd = load_file(str(MINI_BASE / "model.safetensors"))
    sd.pop("model.norm.weight")
    short = _save(tmp_path, "short", sd)
    with pytest.raises(ValueError, match="checkpoint short .* lacks 1 tensor"):
        W.streamed_gram({**dirs, "short": short}, "base", progress=False)


def test_module_types_and_layers():
    assert W.module_type("model.embed_tokens.weight") == W.module_type("lm_head.weight") == "embeddings"
    assert W.module_type("model.layers.3.self_attn.q_norm.weight") == "norm"
    assert W.module_type("model.layers.3.input_layernorm.weight") == W.module_type("model.norm.weight") == "norm"
    assert W.module_type("model.layers.3.self_attn.o_proj.weight") == "attention"
    assert W.module_type("model.layers.3.mlp.gate_proj.weight") == "mlp"
    assert W.layer_of("model.layers.12.mlp.up_proj.weight") == 12 and W.layer_of("model.norm.weight") is None


def test_the_studys_077_labels_the_same_sft_from_two_starts_not_a_stage_against_its_oracle(geometry, tmp_path):
    """The study's 0.77 / 0.05 are the SDFT step's update directions (the same SFT mixture from the base and from the
    sequential endpoint; unrelated SFT tasks): the reading puts them beside those, read from disk, and shows the
    cosines of a stage's update with its oracle and between the oracles with no study figure. No verdict: F4 and F5
    are judged by acl_lib.findings."""
    import json

    from acl_lib.diagnostics import figures

    found, _ = geometry
    diag = W.weight_diagnostics(found, progress=False)
    cos = W.cosine_summary(diag)
    study = {"sft_over_rl_displacement": [3, 7], "cosine_same_sft_from_base_vs_seq_endpoint": 0.77,
             "cosine_unrelated_sft_tasks": 0.05}
    assert W.read_update_directions(tmp_path) is None
    text = figures.weights_reading(diag, cos, study, "smoke", 0, None)
    assert "not on disk for this seed yet" in text
    same_line = next(x for x in text.splitlines() if "own update vs its domain's oracle" in x)
    assert "0.77" not in same_line and "no figure" in same_line
    oracles_line = next(x for x in text.splitlines() if "oracles' task vectors" in x)
    assert "0.05" not in oracles_line and "partly" in oracles_line
    assert "as in the study" not in text and "within" not in text and "reproduced" not in text

    path = tmp_path / W.UPDATE_DIRECTIONS
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"same_sft_from_base_vs_seq_final": 0.61, "unrelated_single_domain_sft": {
        "kind": "cold-start SFT", "pairs": {"math vs search": 0.02, "math vs if": -0.04}, "mean": -0.01}}))
    directions = W.read_update_directions(tmp_path)
    text = figures.weights_reading(diag, cos, study, "smoke", 0, directions)
    f4 = next(x for x in text.splitlines() if x.startswith("- **F4**"))
    assert "cosine 0.61 (study 0.77)" in f4 and "mean cosine -0.01 over 2 pair(s) (study 0.05)" in f4
    f5 = next(x for x in text.splitlines() if x.startswith("- **F5**"))
    assert "the study: 3-7x" in f5 and "seq_b 3.0" in f5 and "L2 norm" in f5
