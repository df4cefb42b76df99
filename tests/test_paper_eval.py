"""Issue 15, evaluation at the paper profile: turns end at ``<|im_end|>`` whatever the tokenizer's eos, the vLLM
path's engine and sampling arguments (rendered without vLLM, which does not install on CPU) and its
context-overflow guard, the device and release of the evaluated model, OOD suite sizes, per-dataset scores.

A base model in the Qwen3 convention (Qwen3-8B-Base) has eos ``<|endoftext|>``: the tests build such a
checkpoint from the tiny test tokenizer, and replace its output layer by a scripted one that writes a fixed
token sequence, so what the policy returns shows where generation stopped.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from acl_lib.config import load_config
from acl_lib.envs import BENCHMARKS
from acl_lib.envs.base import SingleTurnEpisode, Task
from acl_lib.eval import harness, policies, sharding
from train_kit import tiny_cfg

torch.set_num_threads(1)
DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def base_like_dir(base_dir, tmp_path_factory):
    """A tiny checkpoint whose tokenizer and generation config end text at ``<|endoftext|>`` (as Qwen3-8B-Base):
    a copy of the session's ``base_dir`` with that eos."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = shutil.copytree(base_dir, tmp_path_factory.mktemp("base_like") / "model")
    tok = AutoTokenizer.from_pretrained(d)
    tok.eos_token = "<|endoftext|>"
    tok.save_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.config.eos_token_id = tok.eos_token_id
    model.save_pretrained(d)
    return d


class _Scripted(torch.nn.Module):
    """An output layer that writes ``script`` one token per forward pass (then repeats its last token)."""

    def __init__(self, script: list[int], vocab: int):
        super().__init__()
        self.script, self.vocab, self.calls = script, vocab, 0

    def forward(self, hidden):
        tok = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        logits = torch.full((*hidden.shape[:-1], self.vocab), -1e4, dtype=hidden.dtype, device=hidden.device)
        logits[..., tok] = 1e4
        return logits


def _script(tok) -> tuple[list[int], str, str]:
    """Token ids of "<turn text><|im_end|><text of an invented next turn>", and both texts."""
    first, after = "Answer: 7", "user: thanks"
    ids = tok(first, add_special_tokens=False)["input_ids"]
    rest = tok(after, add_special_tokens=False)["input_ids"]
    return ids + [tok.convert_tokens_to_ids("<|im_end|>")] + rest, first, after


def _task() -> Task:
    return Task(id="t0", domain="math", benchmark="aime26", system_prompt="", user_prompt="What is 3+4?", answer="7")


def test_base_model_turn_stops_at_im_end(base_like_dir):
    policy = policies.HFPolicy(str(base_like_dir), max_new_tokens=40)
    assert policy.tok.eos_token == "<|endoftext|>"
    script, first, after = _script(policy.tok)
    policy.model.lm_head = _Scripted(script, policy.model.config.vocab_size)
    (text,) = policy([(_task(), [{"role": "user", "content": "What is 3+4?"}])])
    assert text == first  # the old policy stopped at <|endoftext|> only and went on: "Answer: 7user: thanks..."
    assert after not in text
    ids = policy.stop_ids
    assert policy.tok.convert_tokens_to_ids("<|im_end|>") in ids and policy.tok.eos_token_id in ids


def test_hf_policy_runs_on_the_available_device_and_releases_it(base_like_dir, monkeypatch):
    assert policies.eval_device() == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert policies.eval_device("cpu") == torch.device("cpu")
    policy = policies.HFPolicy(str(base_like_dir), max_new_tokens=4)
    assert next(policy.model.parameters()).device.type == policies.eval_device().type == policy.device.type
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert policies.eval_device() == torch.device("cuda")  # a GPU machine evaluates on its GPU
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    policy.close()
    assert policy.model is None and emptied == [1]


def test_evaluate_releases_the_policy_it_built(base_like_dir, tmp_path, monkeypatch):
    built = []
    real = harness.make_policy

    def spy(model, cfg):
        built.append(real(model, cfg))
        return built[-1]

    monkeypatch.setattr(harness, "make_policy", spy)
    cfg = tiny_cfg(tmp_path, **{"worlds.n_test": 1, "eval.max_new_tokens": 4})
    metrics = harness.evaluate(cfg, str(base_like_dir), tmp_path / "eval", benchmarks=["aime26"])
    assert metrics["n_tasks"] == {"aime26": 1}
    assert len(built) == 1 and built[0].model is None  # built once for the suite, dropped at the end


# --- vLLM, rendered without vLLM ------------------------------------------------------------------------------


class _FakeEngine:
    """Stands in for ``vllm.LLM``: records the requests, answers each with ``script``."""

    def __init__(self, script):
        self.script, self.requests = script, []

    def generate(self, prompts, params, use_tqdm=False):
        self.requests.append((prompts, params))
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(self.script), text="(unused)")])
                for _ in prompts]


def test_vllm_engine_and_sampling_arguments():
    cfg = load_config("paper")
    args = policies.vllm_engine_args("Qwen/Qwen3-8B-Base", cfg.model.dtype, cfg.model.max_position_embeddings,
                                    seed=cfg.seed)
    assert args["max_model_len"] == 32768 == cfg.model.max_position_embeddings
    assert args["dtype"] == "bfloat16" and args["model"] == args["tokenizer"] == "Qwen/Qwen3-8B-Base"
    assert args["enable_prefix_caching"] is True
    with pytest.raises(ValueError):
        policies.vllm_engine_args("m", "bfloat16", 0)
    sp = policies.vllm_sampling_args([7, 9], 8192, 0.6, 0.95)
    assert sp == {"max_tokens": 8192, "temperature": 0.6, "top_p": 0.95, "stop_token_ids": [7, 9],
                  "skip_special_tokens": True, "n": 1}
    if shutil.which("nvidia-smi"):  # where vLLM is installed, its own classes take the arguments
        vllm = pytest.importorskip("vllm")
        vllm.SamplingParams(**sp)


def test_vllm_policy_stops_at_im_end_and_guards_the_context(base_like_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base_like_dir)
    script, first, _ = _script(tok)
    engine = _FakeEngine(script)
    policy = policies.VLLMPolicy(str(base_like_dir), max_new_tokens=16, temperature=0.6, top_p=0.95,
                                max_model_len=200, llm=engine, sampling_params=lambda **kw: kw)
    short = [{"role": "user", "content": "What is 3+4?"}]
    long = [{"role": "user", "content": "word " * 400}]  # far past 200 - 16 tokens
    episodes = [SingleTurnEpisode(_task(), lambda text, t: (float("7" in text), "wrong")) for _ in range(2)]
    episodes[0].messages[:] = short
    episodes[1].messages[:] = long
    harness.run_episodes(policy, episodes)
    # the long prompt never reached the engine, and its episode ended alone
    (prompts, params), = engine.requests
    assert len(prompts) == 1 and len(prompts[0]["prompt_token_ids"]) <= 200 - 16
    assert params["stop_token_ids"] == policy.stop_ids
    assert tok.convert_tokens_to_ids("<|im_end|>") in params["stop_token_ids"]
    assert params["max_tokens"] == 16 and params["temperature"] == 0.6
    assert episodes[1].done and "context limit" in (episodes[1].end_reason or episodes[1].failure or "")
    assert episodes[0].messages[-1]["content"] == first  # cut at <|im_end|> even if the engine returned more
    policy.max_new_tokens = 5  # evaluate() sets each benchmark's budget
    policy([(_task(), short)])
    assert engine.requests[-1][1]["max_tokens"] == 5
    policy.close()
    assert policy.llm is None


def test_make_policy_wires_the_config_into_vllm(monkeypatch, tmp_path):
    seen = {}

    class Probe(policies.VLLMPolicy):
        def __init__(self, *a, **kw):
            seen.update(kw)
            raise RuntimeError("stop here")

    monkeypatch.setattr(policies, "VLLMPolicy", Probe)
    cfg = load_config("paper", overrides={"output_dir": str(tmp_path)})
    with pytest.raises(RuntimeError, match="stop here"):
        policies.make_policy("Qwen/Qwen3-8B-Base", cfg)
    assert seen["max_model_len"] == cfg.model.max_position_embeddings and seen["dtype"] == "bfloat16"


# --- suite sizes ------------------------------------------------------------------------------------------------


def test_ood_suites_have_a_size_per_benchmark(tmp_path):
    from acl_lib.envs.telecom import TelecomEnv

    paper = load_config("paper")
    # real sets (tau2's telecom test split, gpqa) are scored whole: worlds.n_ood = 1000000 means "all"
    assert harness.benchmark_size(paper, BENCHMARKS["telecom"]) == paper.worlds.n_ood
    assert harness.benchmark_size(paper, BENCHMARKS["gpqa"]) == paper.worlds.n_ood
    tasks = TelecomEnv(seed=0).tasks("test", 1_000_000)  # the generated desk (mini): capped, not a million
    assert len(tasks) == TelecomEnv.MAX_TASKS and len({t.id for t in tasks}) == len(tasks)
    cfg = tiny_cfg(tmp_path, **{"eval.limits.telecom.max_tasks": 3, "worlds.n_ood": 5})
    metrics = harness.evaluate(cfg, "expert", tmp_path / "eval", benchmarks=["telecom", "mock"])
    assert metrics["n_tasks"] == {"telecom": 3, "mock": 5}


def test_pooled_benchmarks_report_each_dataset_and_their_mean(tmp_path):
    shutil.copytree(DATA / "search", tmp_path / "data" / "search")
    cfg = tiny_cfg(tmp_path, **{"worlds.data_dir": str(tmp_path / "data"), "worlds.search_topk": 2})
    metrics = harness.evaluate(cfg, "expert", tmp_path / "eval", benchmarks=["single_hop", "multi_hop"])
    by = metrics["scores_by_dataset"]
    assert set(by["single_hop"]) == {"popqa", "triviaqa"} and set(by["multi_hop"]) == {"bamboogle", "hotpotqa"}
    for key, per in by.items():
        assert metrics["dataset_mean_scores"][key] == pytest.approx(sum(per.values()) / len(per), abs=0.01)
    # the pooled score stays where it was
    assert set(metrics["scores"]) == {"single_hop", "multi_hop"}
    # unequal sizes: the mean of the datasets is not the pooled pass rate
    sources = ["big"] * 9 + ["small"]
    per = harness.dataset_scores(sources, [True] * 9 + [False])
    assert per == {"big": 100.0, "small": 0.0}
    assert harness.dataset_scores(sources[:9], [True] * 9) == {}  # one source: nothing to break down


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_evaluation_in_a_subprocess_matches_in_process(base_like_dir, tmp_path, capfd):
    """launcher.eval_subprocess (paper): the same scores and records, from a process that frees the GPU as it ends."""
    import json

    assert load_config("paper").launcher.eval_subprocess is True
    cfg = tiny_cfg(tmp_path, **{"worlds.n_test": 2, "eval.max_new_tokens": 6})
    benches = ["aime26", "ifeval"]
    here = harness.evaluate(cfg, str(base_like_dir), tmp_path / "here", benchmarks=benches)
    there = sharding.evaluate_in_subprocess(cfg, str(base_like_dir), tmp_path / "there", benchmarks=benches)
    for key in ("scores", "n_tasks", "mean_reward", "k", "limits"):
        assert here[key] == there[key], key
    for b in ("aime26", "ifeval"):
        rows = [[json.loads(x) for x in (tmp_path / d / "records" / f"{b}.jsonl").read_text().splitlines()]
                for d in ("here", "there")]
        assert [r["messages"] for r in rows[0]] == [r["messages"] for r in rows[1]]
    assert "eval: 4/4 episodes" in capfd.readouterr().out  # the child's progress line reaches the notebook
    with pytest.raises(RuntimeError, match="in a subprocess failed"):
        sharding.evaluate_in_subprocess(cfg, str(tmp_path / "no_such_model"), tmp_path / "bad", benchmarks=["aime26"])
