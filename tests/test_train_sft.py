"""Rejection-sampled SFT: what is kept, how rows render, what carries loss, and a short real training run."""

from __future__ import annotations

import json

import pytest
import torch

from acl_lib.chat import format_tool_call
from acl_lib.train import sft
from train_kit import DeskEnv, desk_expert, tiny_cfg

torch.set_num_threads(1)


def test_collect_demos_keeps_only_clean_successes():
    env = DeskEnv()
    tasks = env.tasks("train", 6)

    def sloppy(task, messages):  # a malformed call beside the good one: succeeds, with a protocol error
        text = desk_expert(task, messages)
        if "<tool_call>" in text:
            return '<tool_call>\n{"name": "lookup", "arguments": \n</tool_call>\n' + text
        return text

    def wrong(task, messages):
        return "About seven."

    rows, stats = sft.collect_demos(env, desk_expert, tasks, max_turns=6)
    assert stats["kept"] == 6 and len(rows) == 6
    rows, stats = sft.collect_demos(env, sloppy, tasks, max_turns=6)
    assert rows == [] and stats["tried"] == 6 and "protocol error" in next(iter(stats["rejected"]))
    rows, stats = sft.collect_demos(env, wrong, tasks, max_turns=6)
    assert rows == [] and "wrong or missing answer" in next(iter(stats["rejected"]))
    rows, _ = sft.collect_demos(env, desk_expert, tasks, max_turns=6, num_demos=2)
    assert len(rows) == 2


def test_rows_survive_arrow_and_render_like_the_episode(base_dir):
    """Through a datasets.Dataset (Arrow) the rows render exactly as the original conversation."""
    from datasets import Dataset

    from acl_lib.model import load_model_and_tokenizer
    from acl_lib.model.chat_template import render_chat

    _, tok = load_model_and_tokenizer(base_dir)
    env = DeskEnv()
    tasks = env.tasks("train", 4)
    rows, _ = sft.collect_demos(env, desk_expert, tasks, max_turns=6)
    call = rows[0]["messages"][4]["tool_calls"][0]["function"]
    assert isinstance(call["arguments"], str) and json.loads(call["arguments"])["city"]
    ds = Dataset.from_list(rows)
    for row, task in zip(ds, tasks):
        ep = env.start(task, max_turns=6)
        while not ep.done:
            ep.step(desk_expert(task, ep.messages))
        text = tok.apply_chat_template(row["messages"], tools=json.loads(row["tools"]), tokenize=False)
        assert text == render_chat(ep.messages, tools=task.tools)
        # The tool call renders exactly as a model should write it.
        assert format_tool_call("lookup", {"city": task.meta["city"]}) in text


@pytest.mark.slow
def test_sft_trains_on_assistant_tokens_only_and_resumes(base_dir, tmp_path):
    from datasets import Dataset
    from trl import SFTTrainer

    from acl_lib.model import load_model_and_tokenizer
    from acl_lib.runs import Run, run_once
    from acl_lib.train.common import read_log

    cfg = tiny_cfg(tmp_path, **{"sft.max_steps": 6, "sft.batch_size": 4, "sft.learning_rate": 3e-3})
    env = DeskEnv()
    rows, _ = sft.collect_demos(env, desk_expert, env.tasks("train", 8), max_turns=6)

    # The labels SFTTrainer builds: loss exactly on the assistant turns.
    model, tok = load_model_and_tokenizer(base_dir)
    run = Run(cfg, "sft_probe")
    trainer = SFTTrainer(model=model, args=sft.sft_args(cfg, run.path), train_dataset=Dataset.from_list(rows),
                         processing_class=tok)
    ex = trainer.train_dataset[0]
    labels = ex.get("labels") or [t if m else -100 for t, m in zip(ex["input_ids"], ex["assistant_masks"])]
    trained = tok.decode([t for t, lab in zip(ex["input_ids"], labels) if lab != -100])
    ignored = tok.decode([t for t, lab in zip(ex["input_ids"], labels) if lab == -100])
    assert "Which city do you mean?" in trained and "<tool_call>" in trained and "inhabitants" in trained
    assert "<tool_response>" not in trained and "I mean" not in trained and "You run a desk." not in trained
    assert "<tool_response>" in ignored and "I mean" in ignored
    assert trained.count("<|im_end|>") == 3  # each assistant turn learns to stop

    # A real short run: loss goes down, model + log + summary written, checkpoint kept.
    run = Run(cfg, "sft_desk")
    run_once(run, lambda r: sft.train_sft(cfg, base_dir, rows, r.path))
    log = read_log(run.path / "train_log.jsonl")
    losses = [r["loss"] for r in log if "loss" in r]
    assert len(losses) == 6 and losses[-1] < losses[0]
    summary = json.loads((run.path / "train_summary.json").read_text())
    assert summary["steps"] == 6 and summary["world_size"] == 1 and summary["tokens_per_s"] > 0
    assert (run.path / "model" / "model.safetensors").exists()
    assert (run.path / "checkpoints" / "checkpoint-6").is_dir()

    # Resume: a longer run under the same directory continues from checkpoint-6 instead of restarting.
    cfg2 = tiny_cfg(tmp_path, **{"sft.max_steps": 8, "sft.batch_size": 4, "sft.learning_rate": 3e-3})
    sft.train_sft(cfg2, base_dir, rows, run.path)
    steps = [r["step"] for r in read_log(run.path / "train_log.jsonl") if "loss" in r]
    assert steps == [1, 2, 3, 4, 5, 6, 7, 8]


def test_collect_demos_from_a_model_teacher_reuses_each_episodes_cache(base_dir):
    """A model teacher goes through the evaluator's HFPolicy: its multi-turn episodes encode only what is new
    at every turn; what it fails is rejected with a reason."""
    from acl_lib.eval.policies import HFPolicy

    env = DeskEnv()
    teacher = HFPolicy(base_dir, max_new_tokens=8, batch_size=4)
    rows, stats = sft.collect_demos(env, teacher, env.tasks("train", 6), max_turns=3, batched=True, batch_size=4)
    assert stats["tried"] == 6 and stats["kept"] == len(rows)
    assert sum(stats["rejected"].values()) == 6 - len(rows)
    assert teacher.stats["calls"] and teacher.stats["encoded_tokens"] < teacher.stats["prompt_tokens"]


@pytest.mark.slow
def test_prefix_shared_loss_and_gradients_equal_the_plain_path(base_dir, tmp_path):
    """Real retail demos (the scripted expert on the real desk) share their policy and tool schemas: the
    prefix-shared trainer gives TRL's own loss and the same gradients, and still has rows that differ."""
    from datasets import Dataset
    from trl import SFTTrainer

    from acl_lib.envs import make_env, scripted_expert
    from acl_lib.model import load_model_and_tokenizer

    env = make_env("retail", None, seed=0)
    rows, _ = sft.collect_demos(env, scripted_expert("retail"), env.tasks("train", 3), max_turns=12)
    assert len(rows) == 3
    cfg = tiny_cfg(tmp_path, **{"sft.max_steps": 1, "sft.batch_size": 3, "sft.max_length": 8192})

    def loss_and_grads(cls):
        torch.manual_seed(0)
        model, tok = load_model_and_tokenizer(base_dir)
        trainer = cls(model=model, args=sft.sft_args(cfg, tmp_path / cls.__name__),
                      train_dataset=Dataset.from_list(rows), processing_class=tok)
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(3)])
        model.train()
        loss = trainer.compute_loss(model, dict(batch))
        loss.backward()
        return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, batch

    plain, g_plain, batch = loss_and_grads(SFTTrainer)
    shared, g_shared, _ = loss_and_grads(sft._prefix_shared_trainer())
    L = sft.shared_prefix_length(batch["input_ids"], batch["attention_mask"], batch["labels"])
    assert L > 500 and L < batch["input_ids"].size(1) - 50  # a long common opening, then rows that differ
    assert abs(shared - plain) < 1e-4 * abs(plain)
    assert g_plain.keys() == g_shared.keys()
    for n in g_plain:
        assert torch.allclose(g_plain[n], g_shared[n], rtol=1e-3, atol=1e-6), n


def test_shared_prefix_length_stops_before_the_first_difference_and_the_first_loss():
    ids = torch.tensor([[1, 2, 3, 4, 5, 0], [1, 2, 3, 9, 9, 9]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    labels = torch.full_like(ids, -100)
    assert sft.shared_prefix_length(ids, mask, labels) == 2  # rows differ at 3: the prefix keeps 0..1, 2 predicts 3
    labels[:, 2] = 7
    assert sft.shared_prefix_length(ids, mask, labels) == 1


def test_cold_start_budget_is_capped_in_passes_over_the_demos(base_dir, tmp_path):
    """Issue 32 item 11: sft.max_epochs caps the steps at that many passes over the kept rows (a small real train
    split is not repeated hundreds of times); the summary records steps and epochs."""
    from acl_lib.config import SFTConfig

    assert sft.sft_steps(SFTConfig(max_steps=500, batch_size=64, max_epochs=3), 74 * 4) == 14  # ceil(888 / 64)
    assert sft.sft_steps(SFTConfig(max_steps=500, batch_size=64, max_epochs=3), 2000) == 94
    assert sft.sft_steps(SFTConfig(max_steps=10, batch_size=64, max_epochs=3), 2000) == 10  # max_steps still binds
    assert sft.sft_steps(SFTConfig(max_steps=500, batch_size=64), 74) == 500  # 0: no cap (the mini profile)
    assert sft.sft_steps(SFTConfig(max_steps=500, batch_size=64, max_epochs=0.1), 5) == 1

    cfg = tiny_cfg(tmp_path, **{"sft.max_steps": 50, "sft.batch_size": 4, "sft.max_epochs": 2.0})
    env = DeskEnv()
    rows, _ = sft.collect_demos(env, desk_expert, env.tasks("train", 6), max_turns=6)
    summary = sft.train_sft(cfg, base_dir, rows, tmp_path / "run")
    assert len(rows) == 6 and summary["steps"] == 3 == summary["planned_steps"]  # ceil(2 x 6 / 4)
    assert summary["epochs"] == 2.0


def test_tool_call_counts_pass_only_episodes_that_call_tools_cleanly():
    """The cold start's criterion: an episode counts when it made at least one tool call and none was malformed (a
    model that stops calling tools, or writes one broken call beside good ones, does not pass)."""
    env = DeskEnv()
    tasks = env.tasks("train", 4)

    def play(policy):
        eps = [env.start(t, max_turns=6) for t in tasks]
        for ep in eps:
            while not ep.done:
                ep.step(policy(ep.task, ep.messages))
        return eps

    def sloppy(task, messages):
        text = desk_expert(task, messages)
        broken = '<tool_call>\n{"name": "lookup", "arguments": \n</tool_call>\n'
        return broken + text if "<tool_call>" in text else text

    clean = sft.tool_call_counts(play(desk_expert))
    assert clean["well_formed_share"] == 1.0 and clean["episodes_calling"] == 4
    assert clean["attempts"] == clean["well_formed"] > 0
    broken = sft.tool_call_counts(play(sloppy))
    assert broken["well_formed_share"] == 0.0 and broken["attempts"] - broken["well_formed"] == 4
    silent = sft.tool_call_counts(play(lambda task, messages: "About seven."))
    assert silent == {"episodes": 4, "attempts": 0, "well_formed": 0, "episodes_calling": 0, "well_formed_share": 0.0}
    mixed = sft.tool_call_counts(play(desk_expert)[:3] + play(sloppy)[:1])
    assert mixed["well_formed_share"] == 0.75


@pytest.mark.slow
def test_the_cold_start_stops_at_the_first_check_that_reaches_the_criterion(base_dir, tmp_path, monkeypatch):
    """sft.stop_at_well_formed: checked every stop_check_every steps on the held-out tasks; the run stops at the
    first check at or above the threshold (max_steps the cap), the checks are recorded, and a run that never
    reaches it trains max_steps and says so. The check itself runs the trainer's model through the engine."""
    import acl_lib.train.trl_env as trl_env

    env = DeskEnv()
    rows, _ = sft.collect_demos(env, desk_expert, env.tasks("train", 6), max_turns=6)
    held_out = tmp_path / "check_tasks.jsonl"
    held_out.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in env.tasks("train", 3, seed=5)))
    monkeypatch.setattr(trl_env, "make_env", lambda domain, cfg: env)
    real = sft.check_tool_syntax
    shares, seen = iter([0.25, 0.5, 0.875, 1.0]), []

    def scripted(model, tok, env_, tasks, max_turns, max_new_tokens, batch_size):
        out = real(model, tok, env_, tasks, max_turns, max_new_tokens, batch_size)  # the real check runs
        seen.append((out["episodes"], model.training))
        return {**out, "well_formed_share": next(shares)}

    monkeypatch.setattr(sft, "check_tool_syntax", scripted)
    cfg = tiny_cfg(tmp_path, **{"sft.max_steps": 12, "sft.batch_size": 2, "sft.stop_at_well_formed": 0.8,
                                "sft.stop_check_every": 2, "grpo.max_turns": 3, "grpo.max_new_tokens": 8})
    summary = sft.train_sft(cfg, base_dir, rows, tmp_path / "run", domain="desk", check_tasks=held_out)
    assert summary["steps"] == 6 and summary["stopped_at_step"] == 6  # 0.25 at 2, 0.5 at 4, 0.875 at 6: stop
    assert summary["checks"] == [[2, 0.25], [4, 0.5], [6, 0.875]]
    assert seen == [(3, True)] * 3  # three held-out episodes each time; the model back in training mode after
    checks = sft.read_checks(tmp_path / "run" / sft.STOP_CHECKS)
    assert [c["step"] for c in checks] == [2, 4, 6] and all(c["threshold"] == 0.8 for c in checks)

    shares = iter([0.0] * 10)
    never = tiny_cfg(tmp_path, **{"sft.max_steps": 5, "sft.batch_size": 2, "sft.stop_at_well_formed": 0.8,
                                  "sft.stop_check_every": 2, "grpo.max_turns": 3, "grpo.max_new_tokens": 8})
    summary = sft.train_sft(never, base_dir, rows, tmp_path / "never", domain="desk", check_tasks=held_out)
    assert summary["steps"] == 5 and summary["stopped_at_step"] is None
    assert [s for s, _ in summary["checks"]] == [2, 4, 5]  # and once more at the cap, for the record


def test_heldout_rows_are_evenly_spaced_and_the_rest_keep_their_order():
    rows = [{"i": i} for i in range(40)]
    train, held = sft.split_heldout(rows, 0.25)
    assert len(held) == 10 and [r["i"] for r in held] == list(range(0, 40, 4))
    assert [r["i"] for r in train] == [i for i in range(40) if i % 4]
    assert sft.split_heldout(rows, 0.0) == (rows, [])
    assert len(sft.split_heldout(rows, 0.01)[1]) == sft.MIN_HELDOUT  # at least eight
    assert len(sft.split_heldout(rows[:6], 0.5)[1]) == 3  # half at most


@pytest.mark.slow
def test_sft_stops_when_the_heldout_loss_stops_falling(base_dir, tmp_path):
    """heldout_fraction (SDFT's stopping): the held-out loss every eval_every steps; the run stops after `patience`
    measurements without a new low (read back from the recorded losses), and runs to max_steps when patience is
    never spent."""
    env = DeskEnv()
    rows, _ = sft.collect_demos(env, desk_expert, env.tasks("train", 12), max_turns=6)
    over = {"sft.batch_size": 2, "sft.learning_rate": 0.05}
    # six training rows: the held-out loss stops falling within a few dozen steps (56 when this was written)
    cfg = tiny_cfg(tmp_path, **over, **{"sft.max_steps": 200})
    s = sft.train_sft(cfg, base_dir, rows, tmp_path / "run", heldout_fraction=0.34, eval_every=4, patience=2)
    losses = s["heldout_losses"]
    assert s["heldout_rows"] == 6 and s["rows"] == 6 and [x for x, _ in losses] == list(range(4, s["steps"] + 1, 4))
    best, bad, stop = float("inf"), 0, None
    for step, loss in losses:
        best, bad = (loss, 0) if loss < best - 1e-4 else (best, bad + 1)
        if bad >= 2:
            stop = step
            break
    assert stop is not None and s["stopped_at_step"] == stop == s["steps"] < 200
    patient = tiny_cfg(tmp_path, **over, **{"sft.max_steps": 12})
    s = sft.train_sft(patient, base_dir, rows, tmp_path / "patient", heldout_fraction=0.34, eval_every=4,
                      patience=50)
    assert s["steps"] == 12 and s["stopped_at_step"] is None and len(s["heldout_losses"]) == 3
