"""Capability matrices, trajectories and run naming read from the run store."""

import json

from acl_lib import pipeline, views
from acl_lib.config import load_config


def _write(seed_dir, run, scores):
    (seed_dir / run / "eval").mkdir(parents=True, exist_ok=True)
    (seed_dir / run / "eval" / "metrics.json").write_text(json.dumps({"scores": scores}))


def test_matrix_trajectories_and_forgetting(tmp_path):
    _write(tmp_path, "base", {"aime26": 5.0, "nq": 1.0})
    _write(tmp_path, "seq_math", {"aime26": 30.0, "nq": 2.0})
    _write(tmp_path, "seq_search", {"aime26": 20.0, "nq": 40.0})
    scores = views.load_scores(tmp_path, ["base", "seq_math", "seq_search", "seq_ecom"])
    assert list(scores) == ["base", "seq_math", "seq_search"]  # missing runs are absent, not zero
    text = views.format_matrix(scores, views.paper_results()["sequential"], ["aime26", "nq"])
    assert "30.0 (25.8)" in text and "40.0 (45.2)" in text
    rows = views.forgetting_summary(scores, ["seq_math", "seq_search"], {"seq_math": "aime26", "seq_search": "nq"})
    math = next(r for r in rows if r["benchmark"] == "aime26")
    assert (math["after_stage"], math["peak"], math["final"], math["drop_from_peak"]) == (30.0, 30.0, 20.0, 10.0)
    fig = views.capability_heatmap(scores)
    assert fig.data[0].z[1][0] == 30.0
    fig = views.trajectory_figure(scores, views.paper_results()["sequential"], ["aime26"])
    assert [t.name for t in fig.data] == ["ours", "study"]


def test_training_curves_draw_each_phase_on_its_own_steps(tmp_path):
    sft = tmp_path / "checkpoints" / "sft"
    sft.mkdir(parents=True)
    (sft / "train_log.jsonl").write_text("\n".join(json.dumps({"step": i, "job": "sft", "loss": 3.0 / i})
                                                   for i in range(1, 41)))
    (tmp_path / "train_log.jsonl").write_text("\n".join(json.dumps({"step": i, "job": "grpo", "loss": 0.01,
                                                                    "reward": i / 10}) for i in range(1, 5)))
    rows = views.read_train_logs(tmp_path)
    assert [r["phase"] for r in rows].count("sft") == 40 and [r["phase"] for r in rows].count("grpo") == 4
    fig = views.training_curves(tmp_path)
    assert [a.text for a in fig.layout.annotations] == ["SFT cold start: loss", "GRPO: reward", "GRPO: loss"]
    sft_trace, reward_trace = fig.data[0], fig.data[1]
    assert list(sft_trace.x) == list(range(1, 41)) and list(reward_trace.x) == [1, 2, 3, 4]  # own steps each
    assert sft_trace.xaxis != reward_trace.xaxis


def test_a_run_without_training_logs_says_so(tmp_path):
    assert "no training log" in views.training_curves(tmp_path).layout.title.text


def test_run_names_follow_the_curriculum(tmp_path):
    cfg = load_config("smoke", [f"output_dir={tmp_path}"])
    assert pipeline.checkpoint_names(cfg, oracles=False) == ["base", "seq_math", "seq_search", "seq_ecom", "seq_if"]
    other = load_config("smoke", [f"output_dir={tmp_path}", "pipeline.curriculum=[if,math,search,ecom]"])
    names = pipeline.checkpoint_names(other, oracles=False)
    assert names == ["base", "seq1_if", "seq2_if-math", "seq3_if-math-search", "seq4_if-math-search-ecom"]
    # each stage's input is the stage before it
    assert pipeline.sequential_run(other, 2).inputs[0].name == "seq1_if"


def test_a_stage_refuses_to_start_before_its_input(tmp_path):
    import pytest

    cfg = load_config("smoke", [f"output_dir={tmp_path}"])
    with pytest.raises(RuntimeError, match="needs the complete run 'base'"):
        pipeline.run_sequential_stage(cfg, 1)
    with pytest.raises(ValueError, match="out of range"):
        pipeline.sequential_run(cfg, 5)


def test_stage_overrides_apply_per_domain_and_are_validated():
    import pytest

    from acl_lib.config import ConfigError

    cfg = load_config("smoke", ['pipeline.stage_overrides={ecom: ["grpo.max_steps=7"]}'])
    assert cfg.for_stage("ecom").grpo.max_steps == 7 and cfg.for_stage("math").grpo.max_steps == cfg.grpo.max_steps
    with pytest.raises(ConfigError, match="grpo.no_such"):  # at load time, before any compute
        load_config("smoke", ['pipeline.stage_overrides={ecom: ["grpo.no_such=1"]}'])
    with pytest.raises(ConfigError, match="cannot change the pipeline"):
        load_config("smoke", ['pipeline.stage_overrides={ecom: ["pipeline.curriculum=[math]"]}'])


def _complete(run, files: dict[str, str]) -> None:
    with run.start():
        (run.path / "model").mkdir()
        (run.path / "model" / "weights.txt").write_text("w")
        for rel, text in files.items():
            (run.path / rel).write_text(text)


def test_the_first_stages_oracle_is_copied_not_retrained(tmp_path, monkeypatch):
    from acl_lib.eval import harness

    calls = []
    monkeypatch.setattr(harness, "evaluate", _fake_evaluate(calls))
    cfg = load_config("smoke", [f"output_dir={tmp_path}"])
    assert pipeline.oracle_twin(cfg, "math") is None  # seq_math not complete: the oracle would train
    _complete(pipeline.base_run(cfg), {})
    _complete(pipeline.sequential_run(cfg, 1), {"stage.json": json.dumps({"domain": "math"})})
    pipeline.evaluate_checkpoint(cfg, pipeline.sequential_run(cfg, 1))
    assert calls == ["seq_math"]
    assert pipeline.oracle_twin(cfg, "math").name == "seq_math"
    assert pipeline.oracle_twin(cfg, "search") is None  # only the curriculum's first domain has a twin
    # same recipe, same input: the very same training hash
    assert pipeline.oracle_run(cfg, "math").config_hash == pipeline.sequential_run(cfg, 1).config_hash
    run = pipeline.run_oracle(cfg, "math")
    assert run.is_complete() and pipeline.eval_run(cfg, run).is_complete()
    assert json.loads((run.path / "stage.json").read_text()) == {"domain": "math"}
    assert (run.path / "model" / "weights.txt").read_text() == "w"
    assert json.loads((run.path / "same_as.json").read_text())["run"] == "seq_math"
    # and so is its evaluation: the same checkpoint under the same settings is not scored twice
    assert calls == ["seq_math"]
    assert json.loads((pipeline.eval_run(cfg, run).path / "same_as.json").read_text())["run"] == "seq_math/eval"
    # another curriculum: math is no longer first, so its oracle has no twin
    other = load_config("smoke", [f"output_dir={tmp_path}", "pipeline.curriculum=[if,math,search,ecom]"])
    assert pipeline.oracle_twin(other, "math") is None

    # the other way round: the first stage of another order copies its domain's complete oracle (notebook 13)
    _complete(pipeline.oracle_run(cfg, "if"), {"stage.json": json.dumps({"domain": "if"})})
    pipeline.evaluate_checkpoint(cfg, pipeline.oracle_run(cfg, "if"))
    first = pipeline.run_sequential_stage(other, 1)
    assert calls == ["seq_math", "oracle_if"]  # seq1_if's evaluation is oracle_if's, copied
    assert first.name == "seq1_if" and first.is_complete()
    assert first.config_hash == pipeline.oracle_run(cfg, "if").config_hash
    assert json.loads((first.path / "same_as.json").read_text())["run"] == "oracle_if"
    assert json.loads((first.path / "stage.json").read_text()) == {"domain": "if"}


# --- what re-runs when a setting changes -------------------------------------------------------------------


def _fake_evaluate(calls):
    def evaluate(cfg, model, out_dir, suites=None, **kw):
        from pathlib import Path

        calls.append(Path(out_dir).parent.name)
        (Path(out_dir) / "metrics.json").write_text(json.dumps({"scores": {"aime26": float(cfg.eval.k)}}))
        return {}

    return evaluate


def _pipeline(tmp_path, monkeypatch, *overrides):
    """Base + the four sequential stages with fake training and evaluation that record what ran."""
    from acl_lib.eval import harness
    from acl_lib.train import stage

    trained, evaluated = [], []

    def run_stage(cfg, domain, init_model_dir, out_dir):
        trained.append(domain)
        (out_dir / "model").mkdir()
        return {"domain": domain}

    monkeypatch.setattr(stage, "run_stage", run_stage)
    monkeypatch.setattr(harness, "evaluate", _fake_evaluate(evaluated))
    cfg = load_config("smoke", [f"output_dir={tmp_path}", *overrides])
    base = pipeline.base_run(cfg)
    if not base.is_complete():
        _complete(base, {})
    for i in range(1, 5):
        pipeline.run_sequential_stage(cfg, i)
    return trained, evaluated


def test_changing_an_eval_key_reruns_evaluations_only(tmp_path, monkeypatch):
    trained, evaluated = _pipeline(tmp_path, monkeypatch)
    assert trained == ["math", "search", "ecom", "if"] and len(evaluated) == 4
    trained, evaluated = _pipeline(tmp_path, monkeypatch)
    assert trained == [] and evaluated == []  # nothing changed: everything skipped
    trained, evaluated = _pipeline(tmp_path, monkeypatch, "eval.k=2", "eval.temperature=0.7")
    assert trained == [] and evaluated == ["seq_math", "seq_search", "seq_ecom", "seq_if"]
    assert views.load_scores(tmp_path / "smoke" / "seed0", ["seq_if"])["seq_if"]["aime26"] == 2.0


def test_changing_one_stages_overrides_reruns_it_and_what_follows(tmp_path, monkeypatch):
    _pipeline(tmp_path, monkeypatch)
    trained, evaluated = _pipeline(tmp_path, monkeypatch, 'pipeline.stage_overrides={ecom: ["grpo.max_steps=3"]}')
    assert trained == ["ecom", "if"] and evaluated == ["seq_ecom", "seq_if"]
    # a stage's own key (not through the overrides) reaches every stage that uses it
    trained, _ = _pipeline(tmp_path, monkeypatch, 'pipeline.stage_overrides={ecom: ["grpo.max_steps=3"]}',
                           "pipeline.cold_start={math: true, search: true, ecom: true, if: false}")
    assert trained == ["math", "search", "ecom", "if"]
