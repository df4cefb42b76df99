"""The evaluation harness: every benchmark key, per-episode records, avg@k, limits, the scripted experts."""

import json

import pytest

from acl_lib.config import load_config
from acl_lib.envs import BENCHMARKS, benchmarks_for
from acl_lib.eval.harness import default_out_dir, evaluate
from acl_lib.eval.policies import ExpertPolicy, NullPolicy

PAPER_KEYS = {"aime26", "nq", "retail", "ifeval", "gpqa", "mmlu_redux", "single_hop", "multi_hop", "telecom", "mock",
              "ifbench"}


def test_registry_uses_the_papers_benchmark_keys():
    from acl_lib.views import paper_results

    assert set(BENCHMARKS) == PAPER_KEYS
    reported = {k for table in paper_results()["main_table"].values() for k in table}
    assert reported <= PAPER_KEYS
    assert {b.key for b in benchmarks_for("in_domain")} == {"aime26", "nq", "retail", "ifeval"}
    with pytest.raises(ValueError):
        benchmarks_for("everything")


def test_experts_score_100_and_doing_nothing_scores_0(smoke_cfg, tmp_path):
    best = evaluate(smoke_cfg, "expert", tmp_path / "expert", policy=ExpertPolicy())
    worst = evaluate(smoke_cfg, "null", tmp_path / "null", policy=NullPolicy())
    assert set(best["scores"]) == set(worst["scores"]) == PAPER_KEYS
    assert all(v == 100.0 for v in best["scores"].values()), best["scores"]
    assert all(v == 0.0 for v in worst["scores"].values()), worst["scores"]
    assert all(worst["failures"][k] for k in PAPER_KEYS)  # every failure has a recorded reason
    on_disk = json.loads((tmp_path / "null" / "metrics.json").read_text())
    assert on_disk["scores"] == worst["scores"]
    rec = [json.loads(line) for line in (tmp_path / "null" / "records" / "retail.jsonl").read_text().splitlines()]
    assert len(rec) == smoke_cfg.worlds.n_test
    assert all(r["reward"] == 0.0 and r["failure"] and r["messages"] for r in rec)


class Flaky:
    """A policy that writes garbage, broken tool calls and nothing, in turn."""

    name = "flaky"

    def __init__(self):
        self.i = 0

    def __call__(self, batch):
        outs = []
        for _ in batch:
            self.i += 1
            outs.append(["<tool_call>{broken", '<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "",
                         "\x00" * 5, "Answer: 42 <answer>x</answer>"][self.i % 5])
        return outs


def test_adversarial_output_is_scored_never_raised(smoke_cfg, tmp_path):
    m = evaluate(smoke_cfg, "flaky", tmp_path, policy=Flaky())
    assert set(m["scores"]) == PAPER_KEYS
    assert all(0.0 <= v <= 100.0 for v in m["scores"].values())


def test_hf_policy_on_a_real_checkpoint_with_avg_at_k(smoke_cfg, base_dir, tmp_path):
    model = str(base_dir)
    cfg = smoke_cfg.model_copy(update={"eval": smoke_cfg.eval.model_copy(update={"temperature": 1.0})})
    m = evaluate(cfg, model, tmp_path, k=2, benchmarks=["aime26", "nq"])
    assert m["k"] == 2 and set(m["scores"]) == {"aime26", "nq"}
    assert m["generated_tokens"] > 0
    rec = (tmp_path / "records" / "aime26.jsonl").read_text().splitlines()
    assert len(rec) == 2 * cfg.worlds.n_test
    assert {json.loads(line)["sample"] for line in rec} == {0, 1}


def test_prompts_beyond_the_context_end_the_episode_with_a_reason(smoke_cfg, base_dir, tmp_path):
    from acl_lib.eval.policies import HFPolicy

    model = str(base_dir)
    policy = HFPolicy(model, max_new_tokens=8)
    policy.max_context = 64  # every retail prompt is longer
    m = evaluate(smoke_cfg, model, tmp_path, policy=policy, benchmarks=["retail"])
    assert m["scores"]["retail"] == 0.0
    assert "context limit" in json.dumps(m["failures"])


def test_default_out_dir_is_outside_the_run_store(tmp_path):
    # `acl eval --model <run>/model` used to write into <run>/ (issue 11, defect 3): now a directory of its own
    from acl_lib.eval.harness import run_dir_holding

    run = tmp_path / "smoke" / "seed0" / "seq_math"
    (run / "model").mkdir(parents=True)
    (run / "COMPLETE.json").write_text("{}")
    out = default_out_dir(str(run / "model"), tmp_path, now=0)
    assert out == tmp_path / "eval" / "seq_math-19700101T000000Z"
    assert run_dir_holding(out) is None and run_dir_holding(run / "eval") == run
    out.mkdir(parents=True)
    assert default_out_dir(str(run / "model"), tmp_path, now=0).name == "seq_math-19700101T000000Z-2"
    assert default_out_dir("Qwen/Qwen3-8B-Base", tmp_path, now=0).name == "Qwen3-8B-Base-19700101T000000Z"


class Counting:
    """Writes a broken tool call every turn and records the per-turn budget it was given."""

    name = "counting"

    def __init__(self):
        self.max_new_tokens = 0
        self.budgets = []

    def __call__(self, batch):
        self.budgets.append(self.max_new_tokens)
        return ['<tool_call>{"name": "nope", "arguments": {}}</tool_call>' for _ in batch]


def test_per_benchmark_limits_replace_the_defaults(tmp_path):
    cfg = load_config("smoke", [f"output_dir={tmp_path}", "eval.limits.retail.max_turns=2",
                                "eval.limits.retail.max_new_tokens=7"])
    assert cfg.eval.limits_for("retail") == (2, 7)
    assert cfg.eval.limits_for("telecom") == (cfg.eval.max_turns, cfg.eval.max_new_tokens)
    policy = Counting()
    m = evaluate(cfg, "counting", tmp_path / "e", policy=policy, benchmarks=["retail", "telecom"])
    assert m["limits"] == {"retail": {"max_turns": 2, "max_new_tokens": 7},
                           "telecom": {"max_turns": cfg.eval.max_turns, "max_new_tokens": cfg.eval.max_new_tokens}}
    records = tmp_path / "e" / "records"
    turns = {k: [json.loads(line)["turns"] for line in (records / f"{k}.jsonl").read_text().splitlines()]
             for k in ("retail", "telecom")}
    assert max(turns["retail"]) == 2 and max(turns["telecom"]) > 2
    assert set(policy.budgets) == {7, cfg.eval.max_new_tokens}


def test_the_mini_limits_cover_what_the_experts_need():
    """The mini profile's per-benchmark limits are at least what the scripted experts need on the scored tasks
    (their longest episode, their longest turn in the shipped tokenizer, + end-of-turn)."""
    from transformers import AutoTokenizer

    from acl_lib.eval.sizing import expert_needs
    from acl_lib.model.shipped import shipped_dir

    cfg = load_config("mini")
    tok = AutoTokenizer.from_pretrained(str(shipped_dir(cfg)))
    for row in expert_needs(cfg, tok, sorted(BENCHMARKS), turn_margin=0, token_margin=0.0):
        assert row["expert_pass"] == row["episodes"], row
        turns, tokens = cfg.eval.limits_for(row["benchmark"])
        assert turns >= row["max_turns"] and tokens >= row["max_tokens"], (row, turns, tokens)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_sharded_evaluation_merges_into_the_unsharded_one(smoke_cfg, base_dir, tmp_path):
    """Issue 32 item 13: evaluate_sharded (two processes, every other task each) writes the metrics and records
    one process writes: same scores, standard errors, failures, and every record in task order."""
    from acl_lib.eval.sharding import evaluate_sharded

    benches = ["aime26", "nq", "retail", "ifeval", "gpqa"]
    for name, model in (("expert", "expert"), ("model", str(base_dir))):
        whole = evaluate(smoke_cfg, model, tmp_path / name / "whole", benchmarks=benches)
        parts = evaluate_sharded(smoke_cfg, model, tmp_path / name / "sharded", benchmarks=benches, shards=2)
        assert parts["shards"] == 2
        for key in ("scores", "se", "n_tasks", "failures", "mean_reward", "k_by_benchmark", "limits"):
            assert parts[key] == whole[key], (name, key)
        for b in benches:
            read = [[json.loads(line) for line in (tmp_path / name / d / "records" / f"{b}.jsonl").read_text()
                     .splitlines()] for d in ("whole", "sharded")]
            keep = ("id", "sample", "reward", "failure", "messages")
            assert [{k: r[k] for k in keep} for r in read[0]] == [{k: r[k] for k in keep} for r in read[1]], (name, b)
        assert (tmp_path / name / "sharded" / "shards" / "1" / "metrics.json").is_file()


def test_an_evaluation_estimate_is_logged_before_it_starts(smoke_cfg, base_dir, tmp_path):
    """Issue 32 item 13: before an evaluation the pipeline logs what it will take: episodes and tokens per
    benchmark (the caps' upper bound, or tokens per episode measured on the base's evaluation) and the hours at
    eval.tokens_per_s on eval.shards processes."""
    from acl_lib import pipeline
    from acl_lib.eval.sizing import evaluation_estimate, format_estimate
    from acl_lib.runs import Run, run_once

    cfg = smoke_cfg.model_copy(update={"eval": smoke_cfg.eval.model_copy(update={"tokens_per_s": 50.0})})
    est = evaluation_estimate(cfg, benchmarks=["aime26", "nq"])
    turns, tokens = cfg.eval.limits_for("nq")
    assert est["benchmarks"]["nq"] == {"episodes": cfg.worlds.n_test, "tokens": cfg.worlds.n_test * turns * tokens,
                                       "basis": "cap"}
    assert est["upper_bound"] and est["hours"] == pytest.approx(est["tokens"] / 50.0 / 3600)
    assert format_estimate(est).startswith(f"evaluation estimate: {2 * cfg.worlds.n_test:,} episodes, at most ")

    measured = evaluate(cfg, str(base_dir), tmp_path / "m", benchmarks=["aime26", "nq"])
    by = measured["generated_tokens_by_benchmark"]
    assert sum(by.values()) == measured["generated_tokens"] > 0
    est = evaluation_estimate(cfg, benchmarks=["aime26", "nq"], history=measured)
    assert {b: r["tokens"] for b, r in est["benchmarks"].items()} == by and not est["upper_bound"]
    assert "at most" not in format_estimate(est)

    # the pipeline's evaluation step logs it (the base's own evaluation: no history yet, the caps)
    base = Run(cfg, "base")
    run_once(base, lambda r: __import__("shutil").copytree(base_dir, r.path / "model"))
    ev = pipeline.evaluate_checkpoint(cfg, base)
    logged = [line for line in (ev.path / "run.log").read_text().splitlines() if "evaluation estimate:" in line]
    assert len(logged) == 1 and "at most" in logged[0] and "h at 50 tokens/s on each of 1 shard(s)" in logged[0]
