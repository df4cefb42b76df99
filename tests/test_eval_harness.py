"""The evaluation harness: every benchmark key, per-episode records, avg@k, limits, the scripted experts."""

import json

import pytest

from acl_lib.config import load_config
from acl_lib.envs import BENCHMARKS, benchmarks_for
from acl_lib.eval.harness import ExpertPolicy, NullPolicy, default_out_dir, evaluate

PAPER_KEYS = {"aime26", "nq", "retail", "ifeval", "gpqa", "mmlu_redux", "single_hop", "multi_hop", "telecom", "mock",
              "ifbench"}


def test_registry_uses_the_papers_benchmark_keys():
    from acl_lib.report import paper_results

    assert set(BENCHMARKS) == PAPER_KEYS
    reported = {k for table in paper_results()["main_table"].values() for k in table}
    assert reported <= PAPER_KEYS
    assert {b.key for b in benchmarks_for("in_domain")} == {"aime26", "nq", "retail", "ifeval"}
    with pytest.raises(ValueError):
        benchmarks_for("everything")


@pytest.fixture(scope="module")
def smoke_cfg(tmp_path_factory):
    return load_config("smoke", [f"output_dir={tmp_path_factory.mktemp('out')}"])


def test_experts_score_100_and_doing_nothing_scores_0(smoke_cfg, tmp_path):
    best = evaluate(smoke_cfg, "expert", tmp_path / "expert", policy=ExpertPolicy())
    worst = evaluate(smoke_cfg, "null", tmp_path / "null", policy=NullPolicy())
    assert set(best["scores"]) == set(worst["scores"]) == PAPER_KEYS
    assert all(v == 100.0 for v in best["scores"].values()), best["scores"]
    assert all(v == 0.0 for v in worst["scores"].values()), worst["scores"]
    assert all(worst["failures"][k] for k in PAPER_KEYS)  # every failure has a recorded reason
    on_disk = json.loads((tmp_path / "null" / "metrics.json").read_text())
    assert on_disk["scores"] == worst["scores"]
    rec = [json.loads(l) for l in (tmp_path / "null" / "records" / "retail.jsonl").read_text().splitlines()]
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
            outs.append(["<tool_call>{broken", '<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "", "\x00" * 5,
                         "Answer: 42 <answer>x</answer>"][self.i % 5])
        return outs


def test_adversarial_output_is_scored_never_raised(smoke_cfg, tmp_path):
    m = evaluate(smoke_cfg, "flaky", tmp_path, policy=Flaky())
    assert set(m["scores"]) == PAPER_KEYS
    assert all(0.0 <= v <= 100.0 for v in m["scores"].values())


def test_hf_policy_on_a_real_checkpoint_with_avg_at_k(smoke_cfg, tmp_path):
    from acl_lib.model import build_base

    model = build_base(smoke_cfg, evaluate=False)
    cfg = smoke_cfg.model_copy(update={"eval": smoke_cfg.eval.model_copy(update={"temperature": 1.0})})
    m = evaluate(cfg, model, tmp_path, k=2, benchmarks=["aime26", "nq"])
    assert m["k"] == 2 and set(m["scores"]) == {"aime26", "nq"}
    assert m["generated_tokens"] > 0
    rec = (tmp_path / "records" / "aime26.jsonl").read_text().splitlines()
    assert len(rec) == 2 * cfg.worlds.n_test
    assert {json.loads(l)["sample"] for l in rec} == {0, 1}


def test_prompts_beyond_the_context_end_the_episode_with_a_reason(smoke_cfg, tmp_path):
    from acl_lib.eval.harness import HFPolicy
    from acl_lib.model import build_base

    model = build_base(smoke_cfg, evaluate=False)
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
