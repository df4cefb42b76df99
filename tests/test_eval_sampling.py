"""Per-benchmark avg@k and temperature (``eval.limits.<benchmark>.k`` / ``.temperature``), the standard error
``metrics.json`` records beside each score, the readers of its per-benchmark k (acl_lib.noise, views, final) and
the tables that show ``score ± se``."""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from acl_lib import final, views
from acl_lib.config import ConfigError, load_config
from acl_lib.envs import BENCHMARKS
from acl_lib.eval.harness import evaluate, format_scores, sampling_plan
from acl_lib.eval.policies import NullPolicy
from acl_lib.noise import binomial_se, clustered_se, read_task_counts, samples_per_task, score_se

AVG4 = ["eval.limits.aime26.k=4", "eval.limits.aime26.temperature=0.7"]


def _cfg(tmp_path, *overrides):
    return load_config("smoke", [f"output_dir={tmp_path / 'outputs'}", "torch_threads=1", *overrides])


# --- config ---------------------------------------------------------------------------------------------------


def test_limits_take_k_and_temperature_per_benchmark(tmp_path):
    cfg = _cfg(tmp_path, *AVG4, "eval.limits.aime26.max_turns=2")
    assert cfg.eval.sampling_for("aime26") == (4, 0.7)
    assert cfg.eval.sampling_for("retail") == (cfg.eval.k, cfg.eval.temperature) == (1, 0.0)
    assert cfg.eval.limits_for("aime26") == (2, cfg.eval.max_new_tokens)
    # an integer temperature is a temperature (a float), as eval.temperature is
    assert _cfg(tmp_path, "eval.limits.gpqa.temperature=1").eval.sampling_for("gpqa") == (1, 1.0)
    # the global k and temperature are each benchmark's default
    assert _cfg(tmp_path, "eval.k=3", "eval.temperature=0.5").eval.sampling_for("nq") == (3, 0.5)


def test_limits_without_the_new_keys_dump_as_before(tmp_path):
    # eval runs are keyed on a hash of the eval section: limits that set no k / temperature dump as they did
    # (integers stay integers), so no earlier evaluation is re-run
    cfg = _cfg(tmp_path, "eval.limits.retail.max_turns=10", "eval.limits.retail.max_new_tokens=122")
    assert cfg.to_dict()["eval"]["limits"] == {"retail": {"max_turns": 10, "max_new_tokens": 122}}
    assert all(type(v) is int for lim in load_config("mini").eval.limits.values() for key, v in lim.items()
               if key != "temperature")


@pytest.mark.parametrize(("item", "named"), [
    ("eval.limits.aime26.k=0", "eval.limits.aime26.k"),
    ("eval.limits.aime26.k=true", "eval.limits.aime26.k"),
    ("eval.limits.aime26.k=2.5", "eval.limits.aime26.k"),
    ("eval.limits.aime26.temperature=-0.1", "eval.limits.aime26.temperature"),
    ("eval.limits.aime26.temperature=true", "eval.limits.aime26.temperature"),
    ("eval.limits.aime26.temperature=hot", "eval.limits.aime26.temperature"),
    ("eval.limits.aime26.temperature=.inf", "eval.limits.aime26.temperature"),
    ("eval.limits.aime26.max_turns=0", "eval.limits.aime26.max_turns"),
    ("eval.limits.aime26.top_p=0.9", "unknown key(s) ['top_p']"),
    ("eval.limits.aime27.k=2", "unknown benchmark(s) ['aime27']"),
])
def test_bad_limits_are_rejected_naming_the_key(tmp_path, item, named):
    with pytest.raises(ConfigError) as err:
        _cfg(tmp_path, item)
    assert named in str(err.value)


# --- the harness ----------------------------------------------------------------------------------------------


class Spy:
    """Writes nothing; records the temperature and token budget the harness gave it for each benchmark's turns."""

    name = "spy"

    def __init__(self):
        self.temperature = self.max_new_tokens = None
        self.seen: dict[str, set] = {}

    def __call__(self, batch):
        for task, _ in batch:
            self.seen.setdefault(task.benchmark, set()).add(self.temperature)
        return ["" for _ in batch]


def test_each_benchmark_is_scored_with_its_own_k_and_temperature(tmp_path):
    cfg = _cfg(tmp_path, *AVG4)
    spy = Spy()
    m = evaluate(cfg, "spy", tmp_path / "e", policy=spy, benchmarks=["aime26", "retail"])
    assert spy.seen == {"aime26": {0.7}, "retail": {0.0}}
    assert m["k_by_benchmark"] == {"aime26": 4, "retail": 1}
    assert m["k"] == {"aime26": 4, "retail": 1}  # not one number: the benchmarks differ
    assert m["temperature"] == {"aime26": 0.7, "retail": 0.0}
    n = cfg.worlds.n_test
    rec = [json.loads(x) for x in (tmp_path / "e" / "records" / "aime26.jsonl").read_text().splitlines()]
    assert len(rec) == 4 * n and sorted(r["sample"] for r in rec) == sorted(list(range(4)) * n)
    assert len((tmp_path / "e" / "records" / "retail.jsonl").read_text().splitlines()) == n
    for b in ("aime26", "retail"):  # the standard error clustered by task, from the episodes' records
        counts = read_task_counts(tmp_path / "e" / "records" / f"{b}.jsonl")
        assert m["se"][b] == pytest.approx(clustered_se(counts), abs=0.006)
    # retail is k = 1: clustered is the binomial error of its tasks
    assert m["se"]["retail"] == pytest.approx(binomial_se(m["scores"]["retail"], n, 1), abs=0.006)
    assert json.loads((tmp_path / "e" / "metrics.json").read_text())["se"] == m["se"]
    assert "aime26" in format_scores(m) and "± se" in format_scores(m)


def test_the_vllm_policy_samples_each_benchmark_at_its_temperature(base_dir, tmp_path):
    """The paper profile's backend: each request carries its benchmark's temperature (an engine stand-in)."""
    from types import SimpleNamespace

    from acl_lib.eval.policies import VLLMPolicy

    class Engine:
        def __init__(self):
            self.temperatures = []

        def generate(self, prompts, params, use_tqdm=False):
            self.temperatures += [params["temperature"]] * len(prompts)
            return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[])]) for _ in prompts]

    engine = Engine()
    policy = VLLMPolicy(str(base_dir), max_new_tokens=8, llm=engine, sampling_params=lambda **kw: kw)
    m = evaluate(_cfg(tmp_path, *AVG4), "vllm", tmp_path / "e", policy=policy, benchmarks=["aime26", "gpqa"])
    n = m["n_tasks"]
    assert engine.temperatures == [0.7] * (4 * n["aime26"]) + [0.0] * n["gpqa"]


def test_an_explicit_k_replaces_every_benchmarks_k(tmp_path, caplog):
    cfg = _cfg(tmp_path, *AVG4, "eval.limits.ifeval.temperature=0.3")
    benches = [BENCHMARKS[b] for b in ("aime26", "ifeval", "retail")]
    assert sampling_plan(cfg, benches) == {"aime26": (4, 0.7), "ifeval": (1, 0.3), "retail": (1, 0.0)}
    with caplog.at_level(logging.WARNING, logger="acl_lib.eval.harness"):
        plan = sampling_plan(cfg, benches, k=2)
    # retail is greedy: two samples would be one sample twice, so it keeps k=1, and the warning names it
    assert plan == {"aime26": (2, 0.7), "ifeval": (2, 0.3), "retail": (1, 0.0)}
    assert "retail (k=2)" in caplog.text and "aime26" not in caplog.text
    m = evaluate(cfg, "null", tmp_path / "e", k=2, policy=NullPolicy(), benchmarks=["aime26", "ifeval"])
    assert m["k"] == 2 and m["k_by_benchmark"] == {"aime26": 2, "ifeval": 2}  # all equal: one number, as before
    with pytest.raises(ValueError, match="k must be at least 1"):
        evaluate(cfg, "null", tmp_path / "f", k=-1, policy=NullPolicy(), benchmarks=["aime26"])


def test_acl_eval_k_replaces_every_benchmarks_k(tmp_path, capsys):
    from acl_lib.cli import main

    out = tmp_path / "e"
    code = main(["eval", "--model", "null", "--profile", "smoke", "--suites", "in_domain", "--k", "2",
                 "--set", *AVG4, "eval.limits.ifeval.temperature=0.3", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    m = json.loads((out / "metrics.json").read_text())
    # --k 2 replaces aime26's 4; ifeval samples at 0.3; nq and retail stay greedy, so k=1
    assert m["k_by_benchmark"] == {"aime26": 2, "nq": 1, "retail": 1, "ifeval": 2}
    assert m["temperature"] == {"aime26": 0.7, "nq": 0.0, "retail": 0.0, "ifeval": 0.3}
    printed = capsys.readouterr().out
    assert "± se" in printed and "aime26" in printed


def test_a_greedy_benchmark_configured_with_k_above_1_is_scored_once(tmp_path, caplog):
    cfg = _cfg(tmp_path, "eval.limits.nq.k=8")
    with caplog.at_level(logging.WARNING, logger="acl_lib.eval.harness"):
        m = evaluate(cfg, "null", tmp_path / "e", policy=NullPolicy(), benchmarks=["nq"])
    assert m["k"] == 1 and "nq (k=8)" in caplog.text


# --- readers of the per-benchmark k ---------------------------------------------------------------------------


def test_readers_use_each_benchmarks_own_k(tmp_path):
    """A run scored by the harness with avg@4 on aime26 and k=1 elsewhere: the noise floor, the failure shares
    and the tables read aime26's k, not one k for the whole file."""
    cfg = _cfg(tmp_path, *AVG4)
    eval_dir = cfg.seed_dir() / "base" / "eval"
    m = evaluate(cfg, "null", eval_dir, policy=NullPolicy(), benchmarks=["aime26", "retail"])
    n = cfg.worlds.n_test
    assert samples_per_task(m, "aime26") == 4 and samples_per_task(m, "retail") == 1
    # a score of 0: clustered by task, it keeps the noise of n tasks (not of n x 4 trials)
    assert score_se(m, "aime26") == pytest.approx(binomial_se(0.0, n, 1), abs=0.006)
    # files written before the per-benchmark k: one k for all, or none
    assert samples_per_task({"k": 3}, "aime26") == 3 and samples_per_task({}, "aime26") == 1
    old = {"scores": {"aime26": 50.0}, "n_tasks": {"aime26": 32}, "k": 2}
    assert score_se(old, "aime26") == binomial_se(50.0, 32, 2)

    # the final tables' noise floor (FinalData.estimate -> acl_lib.noise): clustered by task from the records the
    # harness wrote; at 0 of the 4 x n episodes nothing says a task's 4 samples differ: n trials, not 4 n
    data = final.collect({0: cfg.seed_dir()}, seq_runs=["base"])
    est = data.estimate("base", "aime26")
    assert data.clustered("base", "aime26") and est.sampling == pytest.approx(binomial_se(0.0, n, 1))
    assert data.estimate("base", "retail").sampling == pytest.approx(binomial_se(0.0, n, 1))
    # without records (metrics.json alone): the binomial fallback of aime26's own 4 x n episodes
    alone = tmp_path / "metrics_only" / "base" / "eval"
    alone.mkdir(parents=True)
    (alone / "metrics.json").write_text((eval_dir / "metrics.json").read_text())
    fallback = final.collect({0: tmp_path / "metrics_only"}, seq_runs=["base"])
    assert fallback.estimate("base", "aime26").sampling == pytest.approx(binomial_se(0.0, n, 4))
    assert fallback.estimate("base", "aime26").sampling != pytest.approx(binomial_se(0.0, n, 1))

    # failure shares: every one of aime26's 4 x n episodes failed, i.e. 100% (not 400%)
    shares = views.failure_frame(eval_dir).groupby("benchmark")["share"].sum()
    assert shares["aime26"] == pytest.approx(100.0) and shares["retail"] == pytest.approx(100.0)


# --- tables ---------------------------------------------------------------------------------------------------


def _write(seed_dir: Path, run: str, scores: dict, n: int = 32, k=1, se: bool = False) -> None:
    p = seed_dir / run / "eval" / "metrics.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    m = {"scores": scores, "n_tasks": {b: n for b in scores}, "k": k}
    if se:
        m["se"] = {b: round(binomial_se(v, n, k), 2) for b, v in scores.items()}
    p.write_text(json.dumps(m))


def test_run_tables_show_score_and_standard_error(tmp_path):
    _write(tmp_path, "base", {"aime26": 50.0, "nq": 0.0}, se=True)
    _write(tmp_path, "seq_math", {"aime26": 25.0, "nq": 12.5})  # an older file: no "se", computed from n and k
    se = views.load_standard_errors(tmp_path, ["base", "seq_math", "absent"])
    assert set(se) == {"base", "seq_math"}
    assert se["base"]["aime26"] == pytest.approx(8.33, abs=0.01)
    assert se["seq_math"]["nq"] == pytest.approx(binomial_se(12.5, 32, 1))
    scores = views.load_scores(tmp_path, ["base", "seq_math"])

    frame = views.scores_frame(scores, benchmarks=["aime26", "nq"], se=se)
    assert frame.loc["base", "aime26"] == "50.0 ± 8.3"
    assert frame.loc["seq_math", "nq"] == f"12.5 ± {binomial_se(12.5, 32):.1f}"
    paper = {"base": {"aime26": 10.0}}
    both = views.scores_frame(scores, paper, ["aime26", "nq"], se=se)
    assert both.loc["base", ("aime26", "ours")] == "50.0 ± 8.3" and both.loc["base", ("aime26", "study")] == 10.0
    assert both[("nq", "study")].isna().all()
    # without se: the numbers, as before
    assert views.scores_frame(scores, benchmarks=["aime26"]).loc["base", "aime26"] == 50.0

    text = views.format_matrix(scores, benchmarks=["aime26", "nq"], se=se)
    assert "50.0 ± 8.3" in text and "0.0 ± 3.8" in text
    assert "±" not in views.format_matrix(scores, benchmarks=["aime26", "nq"])


def test_final_tables_show_mean_and_combined_standard_error(tmp_path):
    scores = {b: 50.0 for b in final.BENCH_ORDER}
    dirs = {}
    for seed in (0, 1):
        dirs[seed] = tmp_path / f"seed{seed}"
        for run in ("base", "seq_math", "oracle_math"):
            _write(dirs[seed], run, {b: v + 10 * seed for b, v in scores.items()})
    data = final.collect({0: dirs[0]}, curriculum=["math"], seq_runs=["base", "seq_math"])
    # one seed: the default shows no spread; error="se" shows the binomial standard error
    assert data.estimate("base", "aime26").se == pytest.approx(binomial_se(50.0, 32))
    assert final.trajectory_frame(data).loc["base", ("aime26", "ours")] == "50.0"
    frame = final.trajectory_frame(data, error="se")
    assert frame.loc["base", ("aime26", "ours")] == f"50.0 ± {binomial_se(50.0, 32):.1f}"
    assert "standard error" in frame.attrs["error"]

    two = final.collect(dirs, curriculum=["math"], seq_runs=["base", "seq_math"])
    est = two.estimate("seq_math", "nq")
    main = final.main_frame(two, "in_domain", error="se")
    assert main.loc["seq_final", ("nq", "ours")] == est.fmt()
    assert final.main_frame(two).loc["seq_final", ("nq", "ours")] == "55.0 ± 7.1"  # the default: mean ± std
    suite_mean = main.loc["seq_final", ("in-domain mean", "ours")]
    assert suite_mean.startswith("55.0 ± ") and suite_mean != final.main_frame(two).loc[
        "seq_final", ("in-domain mean", "ours")]
    with pytest.raises(ValueError, match="error must be one of"):
        final.main_frame(two, error="sd")


# --- sampling is reproducible --------------------------------------------------------------------------------

SAMPLE = ["torch_threads=1", "eval.limits.aime26.k=4", "eval.limits.aime26.temperature=0.7",
          "eval.limits.aime26.max_new_tokens=8", "eval.limits.ifeval.k=2", "eval.limits.ifeval.temperature=0.9",
          "eval.limits.ifeval.max_new_tokens=8", "eval.limits.ifeval.max_tasks=4"]
SAMPLE_SCRIPT = f"""
import sys
from acl_lib.config import load_config
from acl_lib.eval.harness import evaluate

cfg = load_config("smoke", [f"output_dir={{sys.argv[3]}}", *{SAMPLE!r}])
evaluate(cfg, sys.argv[1], sys.argv[2], benchmarks=["ifeval", "aime26"])
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sampling_is_the_same_in_a_fresh_process(base_dir, tmp_path):
    """avg@4 at temperature 0.7 with the HF policy: this process (after whatever ran in it before) and a fresh
    one (another hash seed, where aime26 comes after another sampled benchmark) write the same records, and the
    samples of a task differ (it really sampled)."""
    import os

    here = tmp_path / "here"
    evaluate(load_config("smoke", [f"output_dir={tmp_path / 'outputs'}", *SAMPLE]), str(base_dir), here,
             benchmarks=["aime26"])
    fresh = tmp_path / "fresh"
    env = dict(os.environ, PYTHONHASHSEED="4242")
    subprocess.run([sys.executable, "-c", SAMPLE_SCRIPT, str(base_dir), str(fresh), str(tmp_path / "outputs")],
                   env=env, check=True, timeout=280, capture_output=True)
    first, second = ((o / "records" / "aime26.jsonl").read_bytes() for o in (here, fresh))
    assert hashlib.sha256(first).digest() == hashlib.sha256(second).digest()
    rec = [json.loads(x) for x in first.decode().splitlines()]
    answers: dict[str, set] = {}
    for r in rec:
        answers.setdefault(r["id"], set()).add(json.dumps(r["messages"][-1]))
    assert len(rec) == 4 * len(answers) and any(len(a) > 1 for a in answers.values())
    m = json.loads((fresh / "metrics.json").read_text())
    assert m["k_by_benchmark"] == {"ifeval": 2, "aime26": 4} and m["temperature"] == {"ifeval": 0.9, "aime26": 0.7}


def test_the_report_says_how_each_benchmark_was_sampled():
    from acl_lib.report import sampling_text

    assert sampling_text(load_config("smoke", [])) == "k=1, temperature 0.0"
    cfg = load_config("smoke", ["eval.limits.aime26.k=8", "eval.limits.aime26.temperature=0.6",
                                "eval.limits.aime26.max_tasks=12", "eval.limits.retail.max_turns=4"])
    assert sampling_text(cfg) == "k=1, temperature 0.0; aime26: 12 tasks, avg@8 at 0.6"
