"""Weight merging (notebook 10): exact task arithmetic, TIES / DARE against a direct computation, the streamed
safetensors writer, and a coefficient search that chooses on validation tasks and never reads the test split."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from acl_lib import noise, pipeline
from acl_lib.consolidate import compare, merging
from acl_lib.consolidate.merging import MergeSpec, merge_checkpoints, merge_tensor
from acl_lib.envs import BENCHMARKS, IN_DOMAIN
from acl_lib.eval import harness
from acl_lib.eval.harness import benchmark_size, world
from acl_lib.pipeline import build_base
from acl_lib.runs import run_once


def _checkpoint(path, tensors, extra_files=True):
    path.mkdir(parents=True)
    save_file(tensors, str(path / "model.safetensors"))
    if extra_files:
        (path / "config.json").write_text(json.dumps({"model_type": "qwen3", "from": path.name}))
        (path / "training_args.bin").write_bytes(b"not copied")
    return path


def _random(seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return {"a.weight": torch.randn(7, 5, generator=g).to(dtype), "b.norm.weight": torch.randn(11, generator=g).to(dtype),
            "c.scalar": torch.randn(1, generator=g).to(dtype) * 1e-6}


@pytest.fixture
def store(tmp_path):
    base = _checkpoint(tmp_path / "base", _random(0))
    seqs = [_checkpoint(tmp_path / f"seq{k}", _random(k + 1)) for k in range(4)]
    return base, seqs


def _bytes(tensors):
    return {k: v.contiguous().view(torch.uint8).numpy().tobytes() for k, v in tensors.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zero_lambda_is_the_base_and_one_hot_is_that_checkpoint_bit_for_bit(tmp_path, dtype):
    base = _checkpoint(tmp_path / "base", _random(0, dtype))
    seqs = [_checkpoint(tmp_path / f"seq{k}", _random(k + 1, dtype)) for k in range(4)]
    out = merge_checkpoints(base, seqs, [0.0] * 4, tmp_path / "zero")
    assert out["tensors"] == 3 and out["parameters"] == 35 + 11 + 1
    assert _bytes(load_file(str(tmp_path / "zero" / "model.safetensors"))) == _bytes(load_file(str(base / "model.safetensors")))
    for k in range(4):
        lam = [0.0] * 4
        lam[k] = 1.0
        merge_checkpoints(base, seqs, lam, tmp_path / f"hot{k}")
        merged = load_file(str(tmp_path / f"hot{k}" / "model.safetensors"))
        assert _bytes(merged) == _bytes(load_file(str(seqs[k] / "model.safetensors"))), k
        assert all(v.dtype == dtype for v in merged.values())
    # the non-weight files come from the last source; the stage's trainer arguments do not
    assert json.loads((tmp_path / "hot0" / "config.json").read_text())["from"] == "seq3"
    assert not (tmp_path / "hot0" / "training_args.bin").exists()


def test_task_arithmetic_matches_the_formula(store, tmp_path):
    base, seqs = store
    lam = [0.25, 0.5, -0.3, 1.5]
    merge_checkpoints(base, seqs, lam, tmp_path / "m")
    merged = load_file(str(tmp_path / "m" / "model.safetensors"))
    t0 = load_file(str(base / "model.safetensors"))
    ts = [load_file(str(s / "model.safetensors")) for s in seqs]
    for name, v in merged.items():
        want = t0[name].double() + sum(w * (t[name].double() - t0[name].double()) for w, t in zip(lam, ts))
        assert torch.equal(v, want.float()), name
    uniform = merge_tensor(t0["a.weight"], [t["a.weight"] for t in ts], merging.uniform_weights(4))
    assert torch.allclose(uniform, torch.stack([t["a.weight"] for t in ts]).mean(0), atol=1e-6)


def test_ties_against_a_direct_computation():
    base = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    d1 = torch.tensor([0.9, -0.1, 0.3, 0.0, -0.5, 0.05])
    d2 = torch.tensor([-0.2, -0.8, 0.4, 0.6, 0.1, -0.02])
    d3 = torch.tensor([0.5, 0.2, -0.7, -0.1, -0.4, 0.01])
    tasks = [base + d for d in (d1, d2, d3)]
    lam, density = [1.0, 0.5, 2.0], 0.5
    got = merge_tensor(base, tasks, lam, "ties", density)
    # by hand: keep the top 3 of 6 |d| per task, elect the sign of the summed kept values, average the agreeing
    deltas = [(t.double() - base.double()) for t in tasks]
    kept = []
    for d in deltas:
        top = d.abs().argsort(descending=True)[:3]
        m = torch.zeros_like(d)
        m[top] = 1
        kept.append(d * m)
    kept = torch.stack(kept)
    sign = torch.where(kept.sum(0) >= 0, 1.0, -1.0)
    agree = (kept.sign() == sign).double()
    weighted = kept * torch.tensor(lam, dtype=torch.float64)[:, None]
    want = base.double() + (weighted * agree).sum(0) / agree.sum(0).clamp(min=1)
    assert torch.allclose(got.double(), want.float().double(), atol=0)
    # position 0: kept 0.9 (+), -0.2 (-), 0.5 (+) -> sign +, mean of 0.9*1 and 0.5*2
    assert got[0].item() == pytest.approx(1.0 + (0.9 + 1.0) / 2, abs=1e-6)


def test_dare_against_a_direct_computation():
    g = torch.Generator().manual_seed(3)
    base = torch.randn(50, generator=g)
    tasks = [base + torch.randn(50, generator=g) for _ in range(3)]
    lam, density, seed = [0.2, 0.3, 0.5], 0.3, 1234
    state = torch.random.get_rng_state()
    got = merge_tensor(base, tasks, lam, "dare", density, seed=seed)
    assert torch.equal(torch.random.get_rng_state(), state), "the caller's RNG state is kept"
    torch.manual_seed(seed)
    want = base.double().clone()
    for w, t in zip(lam, tasks):
        d = t.double() - base.double()
        mask = torch.bernoulli(torch.full_like(d, density))
        want += w * d * mask / density
    assert torch.allclose(got, want.float(), atol=1e-6)
    dropped = sum(int((merge_tensor(base, [t], [1.0], "dare", density, seed=seed) == base).sum()) for t in tasks)
    assert 0.5 * 150 < dropped < 0.9 * 150  # about 1 - density of each task vector dropped
    assert torch.equal(got, merge_tensor(base, tasks, lam, "dare", density, seed=seed))
    assert not torch.equal(got, merge_tensor(base, tasks, lam, "dare", density, seed=seed + 1))


def test_dare_and_ties_at_density_one(store, tmp_path):
    """DARE keeping everything is task arithmetic; TIES keeping everything still elects signs."""
    base, seqs = store
    merge_checkpoints(base, seqs, [0.25] * 4, tmp_path / "ta")
    merge_checkpoints(base, seqs, [0.25] * 4, tmp_path / "dare", method="dare", density=1.0)
    a, b = load_file(str(tmp_path / "ta" / "model.safetensors")), load_file(str(tmp_path / "dare" / "model.safetensors"))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_mismatched_checkpoint_is_named(tmp_path):
    base = _checkpoint(tmp_path / "base", _random(0))
    bad = _random(1)
    bad["a.weight"] = torch.zeros(3, 3)
    other = _checkpoint(tmp_path / "seq_bad", bad)
    with pytest.raises(ValueError, match="seq_bad.*another shape.*a.weight"):
        merge_checkpoints(base, [other], [1.0], tmp_path / "m")
    with pytest.raises(FileNotFoundError, match="nowhere"):
        merge_checkpoints(base, [tmp_path / "nowhere"], [1.0], tmp_path / "m2")


def test_spec_validation():
    with pytest.raises(ValueError, match="unknown method"):
        MergeSpec("m", ("a",), (1.0,), method="slerp")
    with pytest.raises(ValueError, match="2 coefficients for 1"):
        MergeSpec("m", ("a",), (1.0, 2.0))
    with pytest.raises(ValueError, match="density"):
        MergeSpec("m", ("a",), (1.0,), method="ties", density=0.0)
    assert len(merging.candidate_grid([0.25, 0.5], 4)) == 16
    assert (0.0, 0.0) not in merging.candidate_grid([0.0, 1.0], 2)


def test_search_chooses_by_validation_scores(tmp_path):
    """Base w = 0 and checkpoint k holds the unit vector e_k, so a candidate's merged w is its lambda; the fake
    validation scorer reads the merged weights. The grid choice maximises the mean, the balanced one the worst
    domain relative to its oracle."""
    doms = ["math", "search", "ecom", "if"]
    base = _checkpoint(tmp_path / "base", {"w": torch.zeros(4)})
    seqs = [_checkpoint(tmp_path / f"seq{k}", {"w": torch.eye(4)[k].contiguous()}) for k in range(4)]
    seen = []

    def scorer(model):
        w = load_file(str(tmp_path / "search" / "candidate" / "model.safetensors"))["w"]
        assert model == str(tmp_path / "search" / "candidate")
        seen.append(w.tolist())
        # math loves its own checkpoint at any cost to the others; IF is hurt by math
        return {"math": 80 * w[0].item(), "search": 20 * w[1].item(), "ecom": 10.0, "if": 40 * (1 - w[0].item() / 2)}

    candidates = merging.candidate_grid([0.0, 0.5, 1.0], 4)
    (tmp_path / "search").mkdir()
    scored = merging.search_weights(base, seqs, candidates, scorer, tmp_path / "search")
    assert seen == [list(c) for c in candidates] and not (tmp_path / "search" / "candidate").exists()
    chosen = merging.choose(scored, {"math": 80.0, "search": 20.0, "ecom": 10.0, "if": 40.0})
    assert chosen["grid"]["weights"][:2] == [1.0, 1.0]  # mean: 80 + 20 + 10 + 20 = 130 / 4 beats anything else
    assert chosen["grid"]["mean"] == max(c["mean"] for c in scored)
    # balanced: the worst of the relative scores (w0, w1, 1, 1 - w0 / 2), maximised; the mean breaks ties
    best = max(min(c["weights"][0], c["weights"][1], 1.0, 1 - c["weights"][0] / 2) for c in scored)
    assert chosen["balanced"]["worst_relative"] == pytest.approx(best)
    # a domain whose oracle scores 0 on validation has nothing to recover and is left out
    assert merging.relative_scores({"math": 5.0, "if": 3.0}, {"math": 0.0, "if": 6.0}) == {"if": 0.5}


def test_validation_scores_read_training_tasks_only(smoke_cfg, monkeypatch):
    """Every task the validation scorer draws comes from the training split with the validation seed; none of
    the ids is one of the test tasks the tables report."""
    calls = []
    real_world = harness.world

    def recording_world(cfg, name):
        env = real_world(cfg, name)
        real_tasks = env.tasks

        def tasks(split, n, seed=0):
            calls.append((name, split, seed))
            return real_tasks(split, n, seed=seed)

        env.tasks = tasks
        return env

    monkeypatch.setattr(harness, "world", recording_world)
    ids: dict = {}
    scores = merging.validation_scores(smoke_cfg, "expert", ["math", "search", "ecom", "if"], 3, ids)
    assert scores == {"math": 100.0, "search": 100.0, "ecom": 100.0, "if": 100.0}  # the scripted expert
    assert calls and all(split == "train" and seed == merging.validation_seed(smoke_cfg) for _, split, seed in calls)
    monkeypatch.setattr(harness, "world", real_world)
    for d, got in ids.items():
        bench = BENCHMARKS[IN_DOMAIN[d]]
        test = world(smoke_cfg, bench.env).tasks(bench.split, benchmark_size(smoke_cfg, bench), seed=smoke_cfg.worlds.seed)
        assert len(got) == 3 and not set(got) & {t.id for t in test}, d


def test_missing_checkpoint_is_named(smoke_cfg):
    spec = merging.merge_specs(smoke_cfg)[0]
    assert spec.name == "merge_uniform" and spec.weights == (0.25,) * 4
    with pytest.raises(RuntimeError, match=r"missing base .*notebook 00.*seq_math .*01-04"):
        merging.run_merge(smoke_cfg, spec)
    with pytest.raises(RuntimeError, match=r"oracle_math .*notebook 05 \(the oracles\)"):
        merging.run_validation_search(smoke_cfg, spec.sources, [0.5], 2)


def test_reading_says_what_each_merge_wins_and_loses():
    final = {"aime26": 10.0, "nq": 30.0, "retail": 20.0, "ifeval": 80.0, "gpqa": 40.0}
    scores = {"seq_final": final,
              "merge_uniform": {"aime26": 15.0, "nq": 40.0, "retail": 5.0, "ifeval": 70.0, "gpqa": 45.0},
              "merge_ties": {"aime26": 12.0, "nq": 30.0, "retail": 25.0, "ifeval": 80.0, "gpqa": 30.0}}
    text = merging.merge_reading(scores, ["merge_uniform", "merge_ties"], {"merge_uniform": {"aime26": 14.79}})
    assert "`merge_uniform` against `seq_final`: wins math (aime26 +5.0), search (nq +10.0); loses ecom (retail -15.0), if (ifeval -10.0)" in text
    assert "largest gain search, largest loss ecom" in text
    assert "`merge_ties` against `seq_final`: wins math (aime26 +2.0), ecom (retail +5.0); loses none" in text
    assert "aime26 15.0 (study 14.8)" in text
    assert "does not hold here: `merge_ties`" in text  # at or above seq_final on all four
    assert "**F8**" in text and "holds here" in text  # uniform: (40 + 5) / 2 < ties (30 + 25) / 2
    frame = compare.comparison_frame(scores, {"merge_uniform": {"aime26": 14.79}})
    assert frame.loc["merge_uniform", ("aime26", "study")] == 14.79
    fig = compare.comparison_figure(scores, {"merge_uniform": {"aime26": 14.79}})
    assert len(fig.layout.annotations) == 11  # one panel per benchmark


@pytest.mark.slow
def test_a_merge_that_is_the_same_job_as_a_complete_one_is_copied_not_redone(smoke_cfg, monkeypatch):
    """merge_grid and merge_balanced are the same merge whenever the validation search picks the same
    coefficients: the second is copied from the first (model bytes, scores), its evaluation is not run, and
    same_as.json says so; other coefficients or another method are not twins."""
    import shutil

    cfg = smoke_cfg
    build_base(cfg, evaluate=False)
    base = pipeline.model_dir(pipeline.base_run(cfg))

    def stage(r, k):
        with r.atomic_dir("model") as tmp:
            shutil.copytree(base, tmp, dirs_exist_ok=True)
            t = load_file(str(tmp / "model.safetensors"))
            g = torch.Generator().manual_seed(k)
            save_file({n: v + 0.01 * torch.randn(v.shape, generator=g) for n, v in t.items()},
                      str(tmp / "model.safetensors"), metadata={"format": "pt"})

    for i in range(1, 5):
        run_once(pipeline.sequential_run(cfg, i), lambda r, i=i: stage(r, i))
    seqs = tuple(pipeline.seq_run_names(cfg))
    grid = merging.run_merge(cfg, MergeSpec("merge_grid", seqs, (0.5, 0.25, 0.25, 0.25)))
    assert not (grid.path / "same_as.json").exists()
    assert merging.merge_twin(cfg, MergeSpec("merge_x", seqs, (0.5, 0.25, 0.25, 0.5))) is None
    assert merging.merge_twin(cfg, MergeSpec("merge_x", seqs, (0.5, 0.25, 0.25, 0.25), method="ties")) is None
    assert merging.merge_twin(cfg, MergeSpec("merge_x", seqs, (0.5, 0.25, 0.25, 0.25), density=0.5)).name == "merge_grid"

    def no_eval(*a, **k):
        raise AssertionError("a twin's evaluation must be copied, not run")

    monkeypatch.setattr(harness, "evaluate", no_eval)
    bal = merging.run_merge(cfg, MergeSpec("merge_balanced", seqs, (0.5, 0.25, 0.25, 0.25)))
    assert json.loads((bal.path / "same_as.json").read_text())["run"] == "merge_grid"
    assert (bal.path / "model" / "model.safetensors").read_bytes() == (grid.path / "model" / "model.safetensors").read_bytes()
    assert json.loads((bal.path / "merge.json").read_text())["name"] == "merge_balanced"
    a = json.loads((grid.path / "eval" / "metrics.json").read_text())
    b = json.loads((bal.path / "eval" / "metrics.json").read_text())
    assert b["scores"] == a["scores"] and b["model"] == str(bal.path / "model")
    assert (bal.path / "eval" / "same_as.json").is_file()
    assert sorted(p.name for p in (bal.path / "eval" / "records").iterdir()) == \
        sorted(p.name for p in (grid.path / "eval" / "records").iterdir())
    assert pipeline.eval_run(cfg, bal).is_complete()


@pytest.mark.parametrize("method", ["task_arithmetic", "ties"])
@pytest.mark.parametrize("density", [0.3, 0.5, 1.0])
def test_a_large_tensor_merged_slice_by_slice_equals_the_whole_tensor_merge(method, density):
    """Issue 32 item 14: above merge_tensor's block the merge goes slice by slice (a 622M-entry embedding no longer
    needs ~100 GB); the result is PEFT's, bit for bit, on magnitudes without ties at the pruning threshold."""
    g = torch.Generator().manual_seed(5)
    base = torch.randn(37, 29, generator=g)
    tasks = [base + torch.randn(37, 29, generator=g) * s for s in (0.1, 0.5, 1.0, 0.05)]
    lam = [0.25, 1.0, 0.5, 2.0]
    whole = merge_tensor(base, tasks, lam, method, density, block=10**9)
    sliced = merge_tensor(base, tasks, lam, method, density, block=100)  # 11 slices, the last one short
    assert torch.equal(whole, sliced)
    if method == "ties" and density < 1:
        return  # bf16 differences tie at the threshold, where topk's choice is unspecified (the test below)
    bf = base.to(torch.bfloat16)
    assert torch.equal(merge_tensor(bf, [t.bfloat16() for t in tasks], lam, method, density, block=10**9),
                       merge_tensor(bf, [t.bfloat16() for t in tasks], lam, method, density, block=64))


def test_sliced_ties_keeps_exactly_peft_s_count_when_magnitudes_tie():
    """bf16 checkpoints give many equal |d|: the slices keep the same number of entries as PEFT's top-k."""
    base = torch.zeros(1000)
    task = torch.tensor([1.0, -1.0, 0.5, -0.5] * 250)  # 500 entries of |d| = 1, 500 of 0.5
    for density in (0.3, 0.5, 0.7):
        got = merge_tensor(base, [task], [1.0], "ties", density, block=64)
        assert int((got != 0).sum()) == int(density * 1000)
        assert int((got.abs() == 1).sum()) == min(500, int(density * 1000))


def test_a_notebooks_comparison_holds_only_the_runs_it_names(smoke_cfg):
    """Notebooks 08-10 run side by side under ``acl run --jobs``: each one's table takes ``seq_final``, its own runs
    and the oracles, never a consolidation that another of them happened to score first."""
    final = pipeline.sequential_run(smoke_cfg, len(smoke_cfg.pipeline.curriculum)).name
    for name in (final, "merge_uniform", "mmopd", "sdft", "oracle_math", "merge_ties_unscored"):
        (smoke_cfg.seed_dir() / name / "eval").mkdir(parents=True)
        if not name.endswith("unscored"):
            (smoke_cfg.seed_dir() / name / "eval" / "metrics.json").write_text(json.dumps({"scores": {"nq": 1.0}}))
    assert sorted(compare.comparison_scores(smoke_cfg, ["merge_uniform"])) == ["merge_uniform", "oracle_math",
                                                                            "seq_final"]
    assert sorted(compare.comparison_scores(smoke_cfg, ["mmopd", "sdft", "merge_ties_unscored"])) == [
        "mmopd", "oracle_math", "sdft", "seq_final"]
    # the same rows with their standard errors (written, or from n_tasks and k), and the table that shows them
    (smoke_cfg.seed_dir() / "mmopd" / "eval" / "metrics.json").write_text(json.dumps(
        {"scores": {"nq": 25.0}, "n_tasks": {"nq": 32}, "k": 1}))
    se = compare.comparison_standard_errors(smoke_cfg, ["mmopd"])
    assert sorted(se) == ["mmopd", "oracle_math", "seq_final"] and se["seq_final"]["nq"] is None  # no task count
    assert se["mmopd"]["nq"] == pytest.approx(noise.binomial_se(25.0, 32, 1))
    frame = compare.comparison_frame(compare.comparison_scores(smoke_cfg, ["mmopd"]), {}, se=se)
    assert frame.loc["mmopd", ("nq", "ours")] == f"25.0 ± {noise.binomial_se(25.0, 32, 1):.1f}"


@pytest.mark.slow
def test_merge_candidates_scored_over_processes_score_as_in_one(base_dir, tmp_path):
    """eval.shards > 1: the validation search merges and scores every n-th candidate in a process of its own, at
    once; the scores come back in candidate order and equal one process's (greedy validation)."""
    from acl_lib.consolidate.merging.search import score_candidates
    from train_kit import tiny_cfg

    cfg = tiny_cfg(tmp_path, torch_threads=2)
    cands = [(0.5, 0.5), (1.0, 0.0), (0.0, 1.0)]
    one = score_candidates(cfg, base_dir, [base_dir, base_dir], cands, ["math", "if"], 2, tmp_path / "one")
    two = score_candidates(cfg, base_dir, [base_dir, base_dir], cands, ["math", "if"], 2, tmp_path / "two", shards=2)
    assert two == one and [c["weights"] for c in one] == [list(c) for c in cands]
    assert set(one[0]["scores"]) == {"math", "if"}
