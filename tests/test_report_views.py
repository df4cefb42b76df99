"""What the notebooks display, computed from run-store files: tables beside the study, failure reasons,
transcripts and the reading of a stage."""

from __future__ import annotations

import json
import math

import pytest

from acl_lib import noise, pipeline, transcripts, views
from acl_lib.config import load_config


def _eval(seed_dir, run, scores, failures=None, records=None, n=32):
    d = seed_dir / run / "eval"
    (d / "records").mkdir(parents=True, exist_ok=True)
    n_tasks = {b: (n if b in ("aime26", "nq", "retail", "ifeval") else 20) for b in views.BENCH_ORDER}
    metrics = {"scores": scores, "failures": failures or {}, "n_tasks": n_tasks, "k": 1}
    (d / "metrics.json").write_text(json.dumps(metrics))
    for b, recs in (records or {}).items():
        (d / "records" / f"{b}.jsonl").write_text("\n".join(json.dumps(r) for r in recs))
    return d


def _rec(i, reward, failure=None, answer="<answer>1943</answer>"):
    return {"id": f"search/test/{i:05d}", "benchmark": "nq", "reward": reward, "failure": failure, "turns": 2,
            "messages": [{"role": "system", "content": "You answer questions. " * 20},
                         {"role": "user", "content": "How long is the Gimthas River?"},
                         {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                             "name": "search", "arguments": '{"query": "Gimthas"}'}}]},
                         {"role": "tool", "name": "search", "content": "Doc 1 " + "x" * 2000},
                         {"role": "assistant", "content": answer}]}


@pytest.fixture
def cfg(tmp_path):
    return load_config("smoke", [f"output_dir={tmp_path}", "worlds.n_test=32"])


def test_scores_beside_the_study_and_what_a_stage_changed(cfg):
    sd = cfg.seed_dir()
    _eval(sd, "seq_math", {"aime26": 50.0, "nq": 0.0, "ifeval": 10.0})
    _eval(sd, "seq_search", {"aime26": 20.0, "nq": 12.5, "ifeval": 10.0})
    scores = views.load_scores(sd, ["seq_math", "seq_search"])
    frame = views.scores_frame(scores, views.paper_results()["sequential"], ["aime26", "nq"])
    assert frame.loc["seq_search", ("nq", "ours")] == 12.5 and frame.loc["seq_search", ("nq", "study")] == 45.2
    assert frame.loc["seq_math", ("aime26", "study")] == 25.83
    change = views.stage_change_frame(scores, "seq_math", "seq_search", views.paper_results()["sequential"])
    assert change.loc["aime26", "change"] == -30.0 and change.loc["nq", "change"] == 12.5
    assert change.loc["nq", "study change"] == pytest.approx(45.2 - 22.0)
    assert math.isnan(change.loc["retail", "change"])  # not scored: no number is made up
    se = {"seq_math": {"aime26": 3.0, "nq": 0.0}, "seq_search": {"aime26": 4.0}}
    with_se = views.stage_change_frame(scores, "seq_math", "seq_search", se=se)
    assert with_se.loc["aime26", "± change"] == pytest.approx(5.0)  # independent errors: sqrt(3^2 + 4^2)
    assert math.isnan(with_se.loc["nq", "± change"])  # one side has no standard error: none is made up
    assert "± change" not in change.columns


def test_what_a_stage_changed_with_errors_from_the_records(cfg):
    """With records, a score's ± is clustered by task and the change's ± is paired: the two checkpoints pass the
    same 10 tasks of 32 and the later one 6 more, so the change (+18.75) is far more certain than the two scores'
    errors taken as independent say."""
    sd = cfg.seed_dir()
    before = [_rec(i, 1.0 if i < 10 else 0.0) for i in range(32)]
    after = [_rec(i, 1.0 if i < 16 else 0.0) for i in range(32)]
    _eval(sd, "seq_math", {"nq": 31.25}, records={"nq": before})
    _eval(sd, "seq_search", {"nq": 50.0, "aime26": 10.0}, records={"nq": after})
    se = views.load_standard_errors(sd, ["seq_math", "seq_search"])
    assert se["seq_math"]["nq"] == pytest.approx(noise.binomial_se(31.25, 32))  # avg@1: the clustered SE is this
    paired = views.load_change_errors(sd, "seq_math", "seq_search")
    assert set(paired) == {"nq"} and paired["nq"] < 0.7 * math.hypot(se["seq_math"]["nq"], se["seq_search"]["nq"])
    scores = views.load_scores(sd, ["seq_math", "seq_search"])
    frame = views.stage_change_frame(scores, "seq_math", "seq_search", se=se, change_se=paired)
    assert frame.loc["nq", "change"] == 18.75 and frame.loc["nq", "± change"] == pytest.approx(paired["nq"])
    assert frame.loc["nq", "change"] > 2 * frame.loc["nq", "± change"]  # a real change, though within 2 unpaired SE
    assert frame.loc["nq", "change"] < 2 * math.hypot(se["seq_math"]["nq"], se["seq_search"]["nq"])
    # records of another evaluation (they do not give the score): no pairing, the independent errors
    _eval(sd, "seq_search", {"nq": 56.25}, records={"nq": after})
    assert views.load_change_errors(sd, "seq_math", "seq_search") == {"nq": None}


def test_failure_reasons_as_shares_of_the_episodes(cfg):
    d = _eval(cfg.seed_dir(), "seq_search", {"nq": 25.0},
              failures={"nq": {"wrong answer": 20, "no <answer> tag": 4}, "gpqa": {"wrong choice": 20}})
    frame = views.failure_frame(d, ["nq"])
    assert list(frame["reason"]) == ["wrong answer", "no <answer> tag"]
    assert list(frame["share"]) == [62.5, 12.5]
    fig = views.failure_figure(frame)
    assert [t.name for t in fig.data] == ["wrong answer", "no <answer> tag"]


def test_transcripts_show_a_success_and_a_failure(cfg):
    recs = [_rec(0, 0.0, "wrong answer: '12'"), _rec(1, 0.0, "wrong answer: '7'"), _rec(2, 1.0)]
    d = _eval(cfg.seed_dir(), "seq_search", {"nq": 33.3}, records={"nq": recs})
    shown = transcripts.transcripts(d, "nq")
    assert [t.record["id"] for t in shown] == ["search/test/00002", "search/test/00000"]
    text, html = repr(shown[1]), shown[1]._repr_html_()
    assert "failure: wrong answer: '12'" in text and "<tool_call> search(" in text
    assert "more characters]" in text  # a long tool output is cut
    assert "<details><summary>system prompt</summary>" in html and "&lt;answer&gt;1943&lt;/answer&gt;" in html
    with pytest.raises(FileNotFoundError, match="no records for 'retail'"):
        transcripts.transcripts(d, "retail")


def test_the_reading_of_a_stage_follows_its_scores(cfg):
    sd = cfg.seed_dir()
    _eval(sd, "seq_math", {"aime26": 50.0, "nq": 0.0, "retail": 0.0, "ifeval": 10.0, "gpqa": 0.0})
    _eval(sd, "seq_search", {"aime26": 20.0, "nq": 12.5, "retail": 0.0, "ifeval": 12.5, "gpqa": 15.0},
          failures={"nq": {"wrong answer": 28}})
    run = pipeline.sequential_run(cfg, 2)
    text = views.stage_reading(cfg, run)
    assert "**nq** (this stage's benchmark) rose: 0.0 -> 12.5 (+12.5). The study: 22.0 -> 45.2 (+23.2)." in text
    assert "fell: aime26 50.0 -> 20.0" in text
    assert "ifeval" not in text.split("fell:")[1].split("\n")[0]  # +2.5 is within one task (3.1 points)
    assert "Largest out-of-domain move: gpqa 0.0 -> 15.0 (+15.0)" in text
    assert "Commonest failure on nq: *wrong answer* (28 of 32 episodes)" in text


@pytest.mark.slow
def test_saved_figures_work_offline(tmp_path):
    import plotly.graph_objects as go

    written = views.save_figure(go.Figure(go.Bar(x=[1], y=[2])), tmp_path / "figures" / "f")
    html = written[0].read_text()
    assert (tmp_path / "figures" / "plotly.min.js").stat().st_size > 1_000_000
    assert 'src="plotly.min.js"' in html and 'src="https://cdn.plot.ly' not in html
    assert (len(written) == 2) == views.static_images_available()


def test_each_oracles_failures_on_its_own_benchmark(cfg):
    from types import SimpleNamespace

    sd = cfg.seed_dir()
    _eval(sd, "oracle_search", {"nq": 25.0}, failures={"nq": {"wrong answer": 24}, "aime26": {"no Answer": 32}})
    _eval(sd, "oracle_math", {"aime26": 50.0}, failures={"aime26": {"wrong answer": 16}})
    runs = {d: SimpleNamespace(name=f"oracle_{d}", path=sd / f"oracle_{d}") for d in ("search", "math")}
    frame = views.own_failures_frame(runs)
    assert list(frame["benchmark"]) == ["oracle_search: nq", "oracle_math: aime26"]
    assert list(frame["share"]) == [75.0, 50.0]
    assert views.own_failures_frame({}).empty


def test_a_stages_phases_with_their_share_of_the_training_time(tmp_path):
    info = {"domain": "search", "cold_start": True, "demos": {"kept": 40, "tried": 50},
            "sft": {"steps": 30, "wall_s": 60.0, "first_loss": 2.0, "last_loss": 0.5},
            "grpo": {"steps": 20, "wall_s": 180.0, "first_reward": 0.2, "last_reward": 0.4}}
    (tmp_path / "stage.json").write_text(json.dumps(info))
    frame = views.phases_frame(tmp_path)
    assert list(frame["time share %"]) == [25.0, 75.0]
    assert frame.loc["SFT cold start", "demos kept"] == "40 of 50"
    info.pop("sft")
    (tmp_path / "stage.json").write_text(json.dumps(info))  # RL alone: all of the time
    assert list(views.phases_frame(tmp_path)["time share %"]) == [100.0]
