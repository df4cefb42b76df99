"""The cold start's teacher (``sft.teacher``): rejection sampling from a model, the filter and the duplicate rule on
real episodes, the report in demos.json / stage.json / the notebooks' tables, and the error when nothing is kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from acl_lib import views
from acl_lib.chat import ToolCall, ToolCallError
from acl_lib.config import load_config
from acl_lib.envs import scripted_expert
from acl_lib.eval.endpoint import EndpointPolicy, reply_turn
from acl_lib.train import sft, stage
from acl_lib.train.trl_env import make_env
from test_llm_user import served  # noqa: F401 (the transformers serve fixture: the mini base over HTTP)
from train_kit import tiny_cfg

torch.set_num_threads(1)

MINI_BASE = Path(__file__).resolve().parents[1] / "acl_lib" / "data" / "mini_base"


def consistent(stats: dict) -> bool:
    """The report's counts add up: every episode tried is kept, surplus, a duplicate or rejected for a reason."""
    return (stats["tried"] == stats["tasks"] * stats["samples_per_task"]
            and stats["kept"] + stats["surplus"] + stats["duplicates"] + stats["rejected_total"] == stats["tried"]
            and sum(stats["rejected"].values()) == stats["rejected_total"]
            and stats["kept_fraction"] == pytest.approx(stats["kept"] / stats["tried"]))


# --- the filter and the duplicate rule, on real search episodes -------------------------------------------------


def variant(j: int, text: str) -> str:
    """Sample ``j`` of a task, made from the scripted expert's turn ``text``: 0 the expert; 1 an exact repeat; 2 the
    repeat in upper case (the same after normalisation); 3 a wrong answer; 4 a malformed call beside the right one
    (succeeds, with a protocol error); 5 a different success (a sentence before the answer)."""
    if "<answer>" not in text:  # the tool-call turn
        return '<tool_call>\n{"name": "search", "arguments": \n</tool_call>\n' + text if j == 4 else text
    answer = text.split("<answer>", 1)[1].split("</answer>", 1)[0]
    return {2: f"<answer>{answer.upper()}</answer>", 3: "<answer>nobody</answer>",
            5: f"The search result names it. <answer>{answer}</answer>"}.get(j, text)


def variants_policy(k: int):
    expert = scripted_expert("search")
    sample: dict[int, int] = {}  # an episode's message list -> its sample index (episodes start in sample order)

    def policy(batch):
        return [variant(sample.setdefault(id(m), len(sample)) % k, expert(t, m)) for t, m in batch]

    return policy


def test_rejection_and_duplicates_on_real_search_episodes(tmp_path):
    cfg = tiny_cfg(tmp_path)
    env = make_env("search", cfg)
    tasks = env.tasks("train", 4, seed=1)
    rows, stats = sft.collect_demos(env, variants_policy(6), tasks, max_turns=4, batched=True, samples_per_task=6,
                                    dedup=True)
    assert consistent(stats) and stats["tried"] == 24
    # per task: the expert and the different success kept; the repeat and the upper-case repeat dropped as duplicates;
    # the wrong answer and the malformed call rejected, each with its reason
    assert (stats["kept"], stats["duplicates"], stats["rejected_total"]) == (8, 8, 8)
    assert sum(n for r, n in stats["rejected"].items() if r.startswith("wrong answer")) == 4
    assert sum(n for r, n in stats["rejected"].items() if r.startswith("protocol error")) == 4
    finals = [r["messages"][-1]["content"] for r in rows]
    assert sum(f.startswith("The search result") for f in finals) == 4 and not any("nobody" in f for f in finals)
    # duplicates are per task: without the rule every success is kept, and the four tasks' demos all differ
    rows, stats = sft.collect_demos(env, variants_policy(6), tasks, max_turns=4, batched=True, samples_per_task=6)
    assert stats["kept"] == 16 and stats["duplicates"] == 0 and consistent(stats)
    assert len({sft.assistant_text(r["messages"]) for r in rows}) == 8
    # num_demos reached inside a block: the rest of the block's successes are surplus, still counted
    rows, stats = sft.collect_demos(env, variants_policy(6), tasks, max_turns=4, num_demos=3, batched=True,
                                    batch_size=2, samples_per_task=6, dedup=True)
    assert len(rows) == stats["kept"] == 3 and stats["surplus"] == 1 and stats["tasks"] == 2 and consistent(stats)


def test_assistant_text_ignores_case_and_whitespace_but_not_words():
    a = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The  Answer\nis 4"}]
    b = [{"role": "user", "content": "other"}, {"role": "assistant", "content": "the answer is 4 "}]
    assert sft.assistant_text(a) == sft.assistant_text(b) == "the answer is 4"
    assert sft.assistant_text(a) != sft.assistant_text([{"role": "assistant", "content": "the answer is 5"}])


# --- a model teacher at the smoke profile --------------------------------------------------------------------


@pytest.mark.slow
def test_cold_start_samples_the_base_checkpoint_filters_and_reports(base_dir, tmp_path):
    """The base checkpoint (the shipped mini base as ``model.base_model``) teaches the math cold start of a stage
    that starts from another model (the untrained smoke model): 8 samples per task, rejection-filtered, de-duplicated,
    reported, and the kept demos trained on."""
    cfg = tiny_cfg(tmp_path, **{"model.base_model": str(MINI_BASE), "pipeline.cold_start.math": True,
                                "sft.teacher": "base", "sft.samples_per_task": 8, "sft.teacher_temperature": 0.3,
                                "grpo.max_steps": 0})
    out = tmp_path / "seq_math"
    info = stage.run_stage(cfg, "math", base_dir, out)
    demos = info["demos"]
    assert demos == json.loads((out / "checkpoints" / "sft" / "demos.json").read_text())
    assert demos["teacher"] == "base" and demos["teacher_model"] == str(MINI_BASE)
    assert str(MINI_BASE) in demos["source"] and demos["temperature"] == 0.3
    assert demos["tasks"] == 2 * cfg.sft.num_demos and demos["samples_per_task"] == 8 and consistent(demos)
    # sampled from a model: some kept, most rejected for wrong answers (the scripted expert never fails)
    assert 0 < demos["kept"] < demos["tried"] and any(r.startswith("wrong answer") for r in demos["rejected"])
    rows = sft.read_rows(out / "checkpoints" / "sft" / "demos.jsonl")
    assert len(rows) == demos["kept"]
    env = make_env("math", cfg)
    by_prompt = {t.user_prompt: t for t in stage.demo_tasks(env, cfg)}
    for r in rows:  # every kept demo scores 1 when replayed in its world
        task = by_prompt[r["messages"][-2]["content"]]
        ep = env.start(task, max_turns=1)
        ep.step(r["messages"][-1]["content"])
        assert ep.reward() == 1.0
    assert info["sft"]["rows"] == demos["kept"] and (out / "model" / "model.safetensors").exists()
    # the notebooks' tables say where the demos came from
    phase = views.phases_frame(out).loc["SFT cold start"]
    assert phase["demos kept"].startswith(f"{demos['kept']} of {demos['tried']}")
    assert str(MINI_BASE) in phase["demos from"]
    recipe = views.recipe_frame(cfg, "math")["value"]
    assert recipe["sft.teacher"] == "base" and recipe["sft.samples_per_task"] == "8"


def test_a_cold_start_that_keeps_nothing_fails_before_training(base_dir, tmp_path):
    """The incoming checkpoint (the untrained smoke model) solves nothing: the stage stops with the teacher, the
    counts and the main reasons, having trained nothing."""
    cfg = tiny_cfg(tmp_path, **{"pipeline.cold_start.math": True, "sft.teacher": "incoming", "grpo.max_steps": 0})
    out = tmp_path / "seq_math"
    with pytest.raises(stage.ColdStartError) as err:
        stage.run_stage(cfg, "math", base_dir, out)
    msg = str(err.value)
    n = 2 * cfg.sft.num_demos
    assert "stage math (seq_math)" in msg and "sft.teacher=incoming" in msg and str(base_dir) in msg
    assert f"0 of {n} episodes ({n} tasks x 1 samples) kept, {n} rejected, 0 duplicates" in msg
    sft_dir = out / "checkpoints" / "sft"
    demos = json.loads((sft_dir / "demos.json").read_text())
    assert demos["kept"] == 0 and demos["rejected_total"] == n and consistent(demos)
    assert not (sft_dir / "demos.jsonl").exists() and not (sft_dir / "model").exists()
    assert not (sft_dir / "train_log.jsonl").exists() and not (out / "stage.json").exists()


# --- an endpoint teacher ----------------------------------------------------------------------------------------


def test_an_endpoints_reply_is_the_turn_a_local_model_would_write(tmp_path):
    """Structured tool calls become <tool_call> blocks the world runs; an unreadable one is a protocol error."""
    env = make_env("search", tiny_cfg(tmp_path))
    task = env.tasks("train", 1, seed=1)[0]
    ep = env.start(task, max_turns=4)
    ep.step(reply_turn({"content": "Let me look.", "tool_calls": [ToolCall("search", {"query": task.user_prompt})]}))
    assert ep.messages[-2]["tool_calls"][0]["function"]["name"] == "search" and ep.messages[-1]["role"] == "tool"
    assert not ep.protocol_errors and ep.messages[-2]["content"] == "Let me look."
    ep.step(reply_turn({"content": "", "tool_calls": [ToolCallError("unreadable tool call", "{'name': 'x'")]}))
    assert ep.protocol_errors
    assert reply_turn("<answer>x</answer>") == "<answer>x</answer>"


def test_an_unreachable_teacher_endpoint_rejects_its_episodes_with_the_reason(base_dir, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tiny_cfg(tmp_path, **{"pipeline.cold_start.math": True, "sft.teacher": "served-model",
                                "sft.teacher_url": f"http://127.0.0.1:{port}/v1", "grpo.max_steps": 0})
    policy = stage.teacher_policy(cfg, "served-model")
    assert isinstance(policy, EndpointPolicy) and policy.chat.top_p == 1.0 and policy.chat.temperature == 1.0
    policy.chat.retries = 0
    rows, stats = sft.collect_demos(make_env("math", cfg), policy, stage.demo_tasks(make_env("math", cfg), cfg)[:3],
                                    max_turns=2, batched=True)
    assert rows == [] and stats["rejected_total"] == 3 and consistent(stats)
    (reason,) = stats["rejected"]
    assert reason.startswith("teacher endpoint failed: cannot reach") and policy.failed_requests == 3


@pytest.mark.slow
def test_a_teacher_served_over_http_is_sampled_filtered_and_reported(served, tmp_path):  # noqa: F811
    """The mini base behind ``transformers serve`` (its serving copy: replies read as text) teaches the math cold start
    through the endpoint: every request answered, the samples filtered and counted like a local model's."""
    cfg = tiny_cfg(tmp_path, **{"pipeline.cold_start.math": True, "sft.teacher": served["copy"],
                                "sft.teacher_url": served["url"], "sft.samples_per_task": 2,
                                "sft.teacher_temperature": 0.3, "sft.num_demos": 2})
    rows, stats = stage.cold_start_demos(cfg, "math", "unused: the teacher is served")
    assert stats["teacher_url"] == served["url"] and stats["source"] == f"{served['copy']} served at {served['url']}"
    assert stats["tried"] == 8 and consistent(stats) and len(rows) == stats["kept"]
    assert not any(r.startswith("teacher endpoint failed") for r in stats["rejected"]), stats["rejected"]
    assert all(r.startswith(("wrong answer", "no Answer")) for r in stats["rejected"]), stats["rejected"]


# --- what the profiles say ---------------------------------------------------------------------------------------


def test_the_paper_profile_samples_its_cold_starts_from_the_base_and_mini_keeps_the_experts():
    paper, mini, smoke = (load_config(p) for p in ("paper", "mini", "smoke"))
    assert paper.sft.teacher == "base" and paper.sft.samples_per_task > 1 and paper.sft.teacher_temperature > 0
    assert {d for d, on in paper.pipeline.cold_start.items() if on} == {"search", "ecom"}
    assert mini.sft.teacher == smoke.sft.teacher == "expert"
    # at their defaults the new keys stay out of the sft hash: every expert cold start made before keeps its run
    assert not {k for k in mini.to_dict()["sft"] if "teacher" in k or k == "samples_per_task"}
    assert {"teacher", "samples_per_task"} <= set(paper.to_dict()["sft"])
    recipe = views.recipe_frame(paper, "search")["value"]
    assert recipe["sft.teacher"] == "base" and recipe["sft.samples_per_task"] == "4"
    recipe = views.recipe_frame(mini, "search")["value"]
    assert recipe["sft.teacher"] == "expert" and "sft.samples_per_task" not in recipe


def test_with_engines_in_child_processes_the_demos_are_the_same(tmp_path):
    """Issue 32 item 6: with launcher.eval_subprocess (the paper profile's switch) a local teacher samples in a
    process of its own, so its engine's memory is gone before the SFT job; the demos are the in-process ones."""
    over = {"model.base_model": str(MINI_BASE), "pipeline.cold_start.math": True, "sft.teacher": "base",
            "sft.samples_per_task": 4, "sft.teacher_temperature": 0.3, "sft.num_demos": 4}
    here = stage.cold_start_demos(tiny_cfg(tmp_path / "a", **over), "math", str(MINI_BASE))
    child = stage.cold_start_demos(tiny_cfg(tmp_path / "b", **over, **{"launcher.eval_subprocess": True}), "math",
                                   str(MINI_BASE))
    assert child == here and here[1]["tried"] > 0


def test_call_in_child_returns_raises_and_reports_a_dead_child():
    import os

    from acl_lib.processes import call_in_child

    assert call_in_child(divmod, 17, 5) == (3, 2)
    with pytest.raises(RuntimeError, match=r"(?s)failed in a child process:.*ZeroDivisionError"):
        call_in_child(divmod, 1, 0)
    with pytest.raises(RuntimeError, match="ended with exit code 3 before returning"):
        call_in_child(os._exit, 3)


def test_merge_validation_and_sdft_sampling_in_child_processes_score_the_same(base_dir, tmp_path):
    """Issue 32 item 6: a merge candidate's validation and an oracle's SDFT samples, each in a child process
    (launcher.eval_subprocess), are what they are in the notebook's process."""
    from acl_lib.consolidate.merging import validation_scores
    from acl_lib.consolidate.sdft.sampling import sample_oracle

    cfg = tiny_cfg(tmp_path)
    child_cfg = tiny_cfg(tmp_path, **{"launcher.eval_subprocess": True})
    ids_here, ids_child = {}, {}
    here = validation_scores(cfg, str(base_dir), ["math", "if"], 2, ids_here)
    child = validation_scores(child_cfg, str(base_dir), ["math", "if"], 2, ids_child)
    assert child == here and ids_child == ids_here and set(ids_here) == {"math", "if"}
    from acl_lib.processes import call_in_child

    assert call_in_child(sample_oracle, cfg, "if", str(base_dir)) == sample_oracle(cfg, "if", str(base_dir))


def test_the_stopping_checks_use_held_out_training_tasks_of_tool_worlds_only(tmp_path):
    """sft.stop_check_tasks training tasks, none a task the teacher was run on; none for a world without tools
    (math), nor with the criterion off."""
    from acl_lib.train.stage import check_tasks, demo_tasks

    cfg = load_config("mini", overrides={"output_dir": str(tmp_path), "sft.stop_at_well_formed": 0.8,
                                         "sft.stop_check_tasks": 24})
    env = make_env("search", cfg)
    demos = demo_tasks(env, cfg)
    held = check_tasks(env, cfg, demos)
    assert len(held) == 24 and not {t.id for t in held} & {t.id for t in demos}
    assert all(t.tools for t in held) and len({t.id for t in held}) == 24
    math = make_env("math", cfg)
    assert check_tasks(math, cfg, demo_tasks(math, cfg)) == []
    off = load_config("mini", overrides={"output_dir": str(tmp_path), "sft.stop_at_well_formed": 0})
    assert check_tasks(env, off, demos) == []


@pytest.mark.slow
def test_an_oracles_sdft_sampling_sharded_over_processes_keeps_the_same_rows(base_dir, tmp_path):
    """eval.shards > 1: an oracle's SDFT sampling runs in that many processes at once (every n-th task each), its
    verdicts put back in order before the domain-wide filter: the rows and statistics of one process (the HF
    policy samples each episode from its own stream). A failing shard stops the others and says which failed."""
    import os

    from acl_lib.consolidate.sdft.sampling import sample_oracle
    from acl_lib.processes import map_in_children

    over = {"sdft.n_prompts": 5, "sdft.group_size": 2, "torch_threads": 2}
    one = sample_oracle(tiny_cfg(tmp_path, **over), "if", str(base_dir))
    three = sample_oracle(tiny_cfg(tmp_path, **over, **{"eval.shards": 3}), "if", str(base_dir))
    assert three == one and one[1]["tried"] == 10
    assert map_in_children(divmod, [(7, 2), (9, 4)]) == [(3, 1), (2, 1)]
    with pytest.raises(RuntimeError, match="failed in child 1 of 2"):
        map_in_children(divmod, [(7, 2), (9, 0)])
    with pytest.raises(RuntimeError, match="child 0 of 1 ended with exit code 3"):
        map_in_children(os._exit, [(3,)])


def test_a_training_split_the_teacher_used_whole_leaves_the_check_what_is_left(tmp_path, caplog):
    """tau2 retail's real training split has 74 tasks, all of them the teacher's: the stopping check runs on the
    held-out tasks there are (at least 8) or is off, and a warning says which; it never fails the stage."""
    from acl_lib.train.stage import MIN_CHECK_TASKS, check_tasks

    cfg = load_config("mini", overrides={"output_dir": str(tmp_path), "sft.stop_at_well_formed": 0.8,
                                         "sft.stop_check_tasks": 32})
    env = make_env("search", cfg)
    pool = env.tasks("train", 32 + 40, seed=cfg.seed + 2)

    class Small:  # the search world, its training split cut to the 40 + 10 tasks below
        name = "search"

        def tasks(self, split, n, seed=0):
            return (pool[:40] + extra)[:n]

    extra = env.tasks("train", 10, seed=99)
    held = check_tasks(Small(), cfg, pool[:40])  # 40 demos' tasks: 10 left
    assert len(held) == 10 >= MIN_CHECK_TASKS and "the stopping check runs on those" in caplog.text
    extra = extra[:5]
    assert check_tasks(Small(), cfg, pool[:40]) == [] and "too few to check on" in caplog.text
