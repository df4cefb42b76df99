"""SDFT (acl_lib.consolidate.sdft): the filter on real episodes of the real worlds, mixture and order, the dataset
on disk, the trainer's presentation order, and the sdft run end to end on the smoke profile."""

from __future__ import annotations

import json
import shutil

import pytest

from acl_lib import pipeline
from acl_lib.config import load_config
from acl_lib.consolidate import sdft
from acl_lib.envs import make_env, scripted_expert
from acl_lib.envs.base import Episode
from acl_lib.eval.harness import run_episodes
from acl_lib.eval.policies import ExpertPolicy
from acl_lib.pipeline import build_base
from acl_lib.runs import run_once
from acl_lib.train.sft import train_sft


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    # no base pretraining and fewer benchmark tasks than smoke's: the end-to-end test stays within seconds
    return load_config("smoke", [f"output_dir={tmp_path_factory.mktemp('sdft') / 'outputs'}", "pretrain.max_steps=0",
                                 "worlds.n_test=2", "worlds.n_ood=1", "eval.max_turns=3"], seed=0)


def _env(cfg, name):
    return make_env(name, cfg.worlds, seed=cfg.worlds.seed)


def _drive(env, task, turns, max_turns=10):
    """An episode of ``task`` fed ``turns`` (strings, or None for the world's scripted expert), then the expert
    until it ends."""
    ep = env.start(task, max_turns=max_turns)
    expert = scripted_expert(env.name)
    for t in turns:
        if ep.done:
            break
        ep.step(expert(task, ep.messages) if t is None else t)
    while not ep.done:
        ep.step(expert(task, ep.messages))
    return ep


def _verdict(ep, cut=False):
    rows, stats = sdft.filter_episodes(ep.task.domain, [ep], {id(ep.messages)} if cut else set())
    for key in ("reward_failed", "protocol_failed", "duplicates", "kept"):
        if stats[key]:
            return key, stats["reasons"]
    return None, stats


# --- the filter on real episodes ---------------------------------------------------------------------------


def test_math_filter_rejects_wrong_answers_and_a_misplaced_answer_line(cfg):
    env = _env(cfg, "math")
    task = env.tasks("train", 1, seed=sdft.sample_seed(cfg))[0]
    good = _drive(env, task, [None])
    assert _verdict(good)[0] == "kept"
    wrong = _drive(env, task, [f"Answer: {int(task.answer) + 1}"])
    assert _verdict(wrong)[0] == "reward_failed"
    # scored 1.0 (the scorer reads the last Answer: line anywhere) but the DAPO format asks for it last
    late = _drive(env, task, [f"Answer: {task.answer}\nThat is all, thanks for asking."])
    assert late.reward() == 1.0
    key, reasons = _verdict(late)
    assert key == "protocol_failed" and "the last line is not 'Answer: <value>'" in reasons["protocol"]
    markup = _drive(env, task, ['<tool_call>\n{"name": "calc", "arguments": {}}\n</tool_call>\n'
                                f"Answer: {task.answer}"])
    assert markup.reward() == 1.0 and _verdict(markup)[0] == "protocol_failed"
    # a turn cut off at the token budget (what _CutWatch reports) is not a finished answer
    assert _verdict(good, cut=True)[0] == "protocol_failed"


def test_search_filter_rejects_malformed_calls_and_a_tool_call_after_the_answer(cfg):
    env = _env(cfg, "search")
    tasks = env.tasks("train", 4, seed=sdft.sample_seed(cfg))
    task = next(t for t in tasks if _drive(env, t, []).reward() == 1.0)
    assert _verdict(_drive(env, task, []))[0] == "kept"
    malformed = _drive(env, task, ['<tool_call>\n{"name": "search", "arguments": {"query": \n</tool_call>'])
    assert malformed.reward() == 1.0 and malformed.protocol_errors
    key, reasons = _verdict(malformed)
    assert key == "protocol_failed" and any(r.startswith("protocol error") for r in reasons["protocol"])
    unknown = _drive(env, task, ['<tool_call>\n{"name": "lookup", "arguments": {"q": "x"}}\n</tool_call>'])
    assert unknown.reward() == 1.0 and _verdict(unknown)[0] == "protocol_failed"
    gold = task.answer[0]
    after = _drive(env, task, [f'<answer>{gold}</answer>\n<tool_call>\n{{"name": "search", "arguments": '
                               f'{{"query": "more"}}}}\n</tool_call>'])
    assert after.reward() == 1.0 and not after.protocol_errors
    key, reasons = _verdict(after)
    assert key == "protocol_failed" and "a tool call after an answer" in reasons["protocol"]
    wrong = _drive(env, task, ["<answer>certainly not this</answer>"])
    assert _verdict(wrong)[0] == "reward_failed"
    limit = env.start(task, max_turns=1)
    limit.step(scripted_expert("search")(task, limit.messages))
    assert limit.end_reason and _verdict(limit)[0] == "reward_failed"


def test_retail_and_if_expert_episodes_pass_and_a_turn_limit_end_does_not(cfg):
    env = _env(cfg, "retail")
    eps = [env.start(t, max_turns=cfg.grpo.max_turns) for t in env.tasks("train", 3, seed=sdft.sample_seed(cfg))]
    run_episodes(ExpertPolicy(), eps)
    solved = [e for e in eps if e.reward() == 1.0]
    assert solved
    for ep in solved:
        assert sdft.protocol_violation(ep) is None
    # the same episode stopped from outside (a turn limit) is not a protocol end, whatever its reward
    Episode.end(solved[0], "turn limit (10) reached")
    assert sdft.protocol_violation(solved[0]).startswith("not ended by the environment")
    ienv = _env(cfg, "instruct")
    task = ienv.tasks("train", 1, seed=sdft.sample_seed(cfg))[0]
    assert _verdict(_drive(ienv, task, [None]))[0] == "kept"
    assert _verdict(_drive(ienv, task, ["<think>I will not close this"]))[0] != "kept"


def test_near_duplicates_are_dropped_within_a_domain(cfg):
    env = _env(cfg, "math")
    tasks = env.tasks("train", 2, seed=sdft.sample_seed(cfg))
    eps = [_drive(env, tasks[0], [None]), _drive(env, tasks[0], [None]), _drive(env, tasks[1], [None])]
    rows, stats = sdft.filter_episodes("math", eps, set(), threshold=0.9, n=3, samples=[0, 1, 0])
    assert stats["duplicates"] == 1 and stats["kept"] == 2
    assert [r["task_id"] for r in rows] == [tasks[0].id, tasks[1].id]
    words = " ".join(f"w{i}" for i in range(60))
    near = words.replace("w30", "x30")
    assert sdft.jaccard(sdft.ngrams(words, 3), sdft.ngrams(near, 3)) > 0.9
    assert sdft.dedup([words, near, "Something Else  entirely"], 0.9, 3) == [0, 2]
    assert sdft.dedup([words, near], 0.99, 3) == [0, 1]
    assert sdft.assistant_text([{"role": "assistant", "content": "A  B\nC"}]) == "a b c"


# --- mixture, order, dataset -------------------------------------------------------------------------------


def _rows():
    out = []
    for d, n in (("math", 4), ("search", 3), ("ecom", 2), ("if", 3)):
        for i in range(n):
            out.append({"domain": d, "task_id": f"{d}-{i}", "difficulty": float(n - i) if d == "math" else None,
                        "length": 10 * (i + 1) + (5 if d == "if" else 0),
                        "messages": [{"role": "user", "content": f"{d} {i}"},
                                     {"role": "assistant", "content": f"reply {d} {i}"}], "tools": "[]"})
    return out


def test_rows_per_domain_follow_the_weights_capped_at_what_was_kept():
    kept = {"math": 40, "search": 10, "ecom": 0, "if": 30}
    assert sdft.rows_per_domain(kept, {"math": 1, "search": 1, "ecom": 1, "if": 1}) == kept
    assert sdft.rows_per_domain(kept, {"math": 1, "search": 1, "ecom": 1, "if": 0.5}) == {
        "math": 40, "search": 10, "ecom": 0, "if": 20}
    assert sdft.rows_per_domain(kept, {"math": 0.25, "if": 1}) == {"math": 10, "search": 0, "ecom": 0, "if": 30}
    assert sdft.rows_per_domain({"math": 0}, {"math": 1}) == {"math": 0}


def test_orders_are_the_documented_ones():
    rows, cur = _rows(), ["math", "search", "ecom", "if"]
    staged = sdft.order_rows(rows, "staged", cur, seed=1)
    assert [r["domain"] for r in staged] == ["math"] * 4 + ["search"] * 3 + ["ecom"] * 2 + ["if"] * 3
    assert [r["task_id"] for r in staged[:4]] == ["math-0", "math-1", "math-2", "math-3"]  # a domain keeps its order
    shuffled = sdft.order_rows(rows, "shuffle", cur, seed=1)
    assert shuffled == sdft.order_rows(rows, "shuffle", cur, seed=1) != rows
    assert sorted(r["task_id"] for r in shuffled) == sorted(r["task_id"] for r in rows)
    assert len({r["domain"] for r in shuffled[:6]}) > 1  # interleaved
    easy = sdft.order_rows(rows, "difficulty", cur, seed=1)
    # math ranks by its level (math-3 easiest), the others by length; quantiles interleave the domains
    assert [r["task_id"] for r in easy if r["domain"] == "math"] == ["math-3", "math-2", "math-1", "math-0"]
    # each domain's easiest row first (quantile 0), ties by length (math-3, level 1, is the longest of them)
    assert [r["task_id"] for r in easy[:4]] == ["search-0", "ecom-0", "if-0", "math-3"]
    assert [r["task_id"] for r in easy[-4:]] == ["math-0", "ecom-1", "search-2", "if-2"]
    union, counts = sdft.build_union(rows, {"math": 1, "search": 0, "ecom": 1, "if": 1}, "staged", cur, seed=3)
    assert counts == {"math": 4, "search": 0, "ecom": 2, "if": 3} and [r["domain"] for r in union][:4] == ["math"] * 4
    with pytest.raises(ValueError, match="unknown SDFT order"):
        sdft.order_rows(rows, "random", cur, seed=0)


def test_dataset_round_trip_on_disk(cfg, tmp_path):
    env = _env(cfg, "search")
    tasks = env.tasks("train", 3, seed=sdft.sample_seed(cfg))
    eps = [_drive(env, t, []) for t in tasks] + [_drive(_env(cfg, "math"), _env(cfg, "math").tasks("train", 1)[0], [])]
    rows = []
    for ep in eps:
        got, _ = sdft.filter_episodes(ep.task.domain, [ep], set())
        rows += got
    assert any(m.get("tool_calls") for r in rows for m in r["messages"])
    sdft.save_rows(rows, tmp_path / "ds")
    assert sdft.load_rows(tmp_path / "ds") == rows


@pytest.mark.slow
def test_the_trainer_sees_the_rows_in_the_given_order(cfg, store, tmp_path, monkeypatch):
    import trl

    words = [f"item{i}" for i in range(5)]
    rows = [{"messages": [{"role": "user", "content": w}, {"role": "assistant", "content": f"reply {w}"}],
             "tools": "[]"} for w in reversed(words)]
    seen = []
    original = trl.SFTTrainer.training_step

    def recording(self, model, inputs, *args, **kwargs):
        seen.extend(self.processing_class.decode(ids) for ids in inputs["input_ids"])
        return original(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(trl.SFTTrainer, "training_step", recording)
    one_by_one = cfg.sdft.model_copy(update={"max_steps": 5, "batch_size": 1})
    small = sdft.sdft_cfg(cfg.model_copy(update={"sdft": one_by_one}))
    train_sft(small, pipeline.model_dir(pipeline.base_run(cfg)), rows, tmp_path / "out", sequential=True)
    order = [next(w for w in words if f"reply {w}" in text) for text in seen]
    assert order == list(reversed(words))


# --- end to end on the smoke profile -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def store(cfg):
    """The base (smoke pretraining), and the sequential stages and oracles as complete runs holding copies of the
    base (their training is not what these tests check); each oracle also keeps a perturbed cold-start model."""
    import torch
    from safetensors.torch import load_file, save_file

    build_base(cfg, evaluate=False)
    base = pipeline.model_dir(pipeline.base_run(cfg))

    def copy(r, noise=None):
        with r.atomic_dir("model") as tmp:
            shutil.copytree(base, tmp, dirs_exist_ok=True)
        if noise is not None:
            sft = r.path / "checkpoints" / "sft" / "model"
            shutil.copytree(base, sft)
            g = torch.Generator().manual_seed(noise)
            t = load_file(str(sft / "model.safetensors"))
            save_file({k: v + 0.01 * torch.randn(v.shape, generator=g) for k, v in t.items()},
                      str(sft / "model.safetensors"), metadata={"format": "pt"})

    for i in range(1, len(cfg.pipeline.curriculum) + 1):
        run_once(pipeline.sequential_run(cfg, i), copy)
    for k, d in enumerate(cfg.pipeline.curriculum):
        run_once(pipeline.oracle_run(cfg, d), lambda r, k=k: copy(r, noise=k))


@pytest.mark.slow
def test_cut_watch_marks_turns_that_ran_out_of_tokens(cfg, store):
    import torch

    torch.manual_seed(0)
    policy = sdft.sampling_policy(cfg, str(pipeline.model_dir(pipeline.base_run(cfg))), max_new_tokens=1)
    env = _env(cfg, "math")
    eps = [env.start(t) for t in env.tasks("train", 4, seed=sdft.sample_seed(cfg))]
    watch = sdft._CutWatch(policy)
    run_episodes(watch, eps)
    policy.close()
    # an untrained model's one-token turn almost never is its stop token: (nearly) every turn ran out of tokens
    assert watch.cut <= {id(e.messages) for e in eps} and len(watch.cut) >= len(eps) - 1
    assert all(sdft.protocol_violation(e, cut=True) for e in eps)


@pytest.mark.slow
def test_sdft_end_to_end_on_smoke(cfg, store):
    # the oracles here are untrained copies of the base: the scripted experts stand in for their samples
    data = sdft.run_sdft_data(cfg, policy_for=lambda d, model, max_new: ExpertPolicy())
    stats = data.read_json(sdft.FILTER_JSON)["domains"]
    for d, s in stats.items():
        assert s["tried"] == cfg.sdft.n_prompts * cfg.sdft.group_size
        assert s["tried"] == s["reward_failed"] + s["protocol_failed"] + s["duplicates"] + s["kept"]
        assert s["duplicates"] >= s["tried"] - s["prompts"] - s["reward_failed"] - s["protocol_failed"]
    rows = sdft.load_rows(data.path / sdft.DATASET_DIR)
    assert len(rows) == sum(s["kept"] for s in stats.values()) > 0

    run = sdft.run_sdft(cfg, sdft.SDFTSpec("sdft"))
    assert run.is_complete() and (run.path / "eval" / "metrics.json").is_file()
    summary = run.read_json(sdft.SUMMARY_JSON)
    assert summary["displacement_norm"] > 0 and summary["first_loss"] is not None
    assert summary["rows"] == len(rows) and summary["start_run"] == "seq_if"
    trained = [json.loads(x)["messages"] for x in (run.path / sdft.TRAIN_ROWS).read_text().splitlines()]
    union, _ = sdft.build_union(rows, cfg.sdft.mixture, "shuffle", cfg.pipeline.curriculum, sdft.sample_seed(cfg))
    assert trained == [r["messages"] for r in union]
    again = sdft.run_sdft(cfg, sdft.SDFTSpec("sdft"))  # complete: skipped
    assert again.read_json("COMPLETE.json") == run.read_json("COMPLETE.json")
    # weights that select the same rows (uniform, scaled) make the very same SFT job: copied with its evaluation
    twin = sdft.run_sdft(cfg, sdft.SDFTSpec("sdft_mix_same", mixture={d: 2.0 for d in cfg.pipeline.curriculum}))
    assert json.loads((twin.path / "same_as.json").read_text())["run"] == "sdft"
    assert json.loads((twin.path / "eval" / "same_as.json").read_text())["run"] == "sdft/eval"
    assert twin.read_json(sdft.SUMMARY_JSON)["same_as"] == "sdft"
    assert twin.read_json(sdft.SUMMARY_JSON)["mixture"] == {d: 2.0 for d in cfg.pipeline.curriculum}
    # another order presents other rows first: trained, not copied
    staged = sdft.run_sdft(cfg, sdft.SDFTSpec("sdft_staged", order="staged"), evaluate=False)
    assert staged.is_complete() and not (staged.path / "same_as.json").exists()

    sdft.run_sdft(cfg, sdft.SDFTSpec("sdft_base", start="base"), evaluate=False)
    directions = sdft.run_update_directions(cfg)
    same = directions["same_sft_from_base_vs_seq_final"]
    assert 0.99 < same < 1.0 + 1e-9  # seq_final is a copy of the base here: the same update
    assert directions["unrelated_single_domain_sft"]["kind"] == "cold-start SFT"
    assert len(directions["unrelated_single_domain_sft"]["pairs"]) == 6
    assert abs(directions["unrelated_single_domain_sft"]["mean"]) < 0.2  # independent noise: near orthogonal


def test_reading_says_what_each_run_wins_and_loses_and_the_directions():
    scores = {"seq_final": {"aime26": 10.0, "nq": 20.0, "retail": 5.0, "ifeval": 50.0},
              "sdft": {"aime26": 15.0, "nq": 10.0, "retail": 5.0, "ifeval": 40.0}}
    directions = {"same_sft_from_base_vs_seq_final": 0.8,
                  "unrelated_single_domain_sft": {"kind": "cold-start SFT", "pairs": {"math vs if": 0.02}, "mean": 0.02}}
    text = sdft.sdft_reading(scores, ["sdft", "sdft_staged"], {"sdft": {"aime26": 22.29}}, directions)
    assert "wins math (aime26 +5.0)" in text and "loses search (nq -10.0), if (ifeval -10.0)" in text
    assert "`sdft_staged`: not evaluated" in text and "aime26 15.0 (study 22.3" in text
    assert "cosine **0.80** (study 0.77)" in text and "**0.02** (study 0.05)" in text
    assert "No SDFT run is scored" in sdft.sdft_reading({"seq_final": scores["seq_final"]}, ["sdft"], {}, None)
