"""The loss mask of multi-turn GRPO, token by token, on real episodes.

A real multi-turn episode (tool responses *and* simulated-user turns) is driven by the scripted expert through
``trl_env.rollout_episodes`` (the code ``EpisodeRollout`` runs inside the trainer), then through a real
``GRPOTrainer`` step. The mask the trainer uses must be 1 exactly on the tokens the policy wrote and 0 on
every observation token, checked against the chat template's own rendering of the finished conversation.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from acl_lib.train import trl_env
from train_kit import DeskEnv, expert_policy, tiny_cfg

torch.set_num_threads(1)


def trained_conversation(episode):
    """The episode's messages up to its last assistant turn: what ends an episode (retail's customer saying
    ###STOP###) is never followed by a generation, so it is not part of the rollout."""
    msgs = list(episode.messages)
    while msgs[-1]["role"] != "assistant":
        msgs.pop()
    return msgs


def rendered_spans(tok, episode):
    """The rollout's conversation rendered by the template: ids and its assistant ({% generation %}) mask."""
    out = tok.apply_chat_template(trained_conversation(episode), tools=episode.task.tools, tokenize=True,
                                  return_dict=True, return_assistant_tokens_mask=True)
    return list(out["input_ids"]), list(out["assistant_masks"])


def _segments(ids, mask, value):
    """Maximal runs of ``ids`` whose mask equals ``value``."""
    out, cur = [], []
    for t, m in zip(ids, mask):
        if m == value:
            cur.append(t)
        elif cur:
            out.append(cur)
            cur = []
    return out + ([cur] if cur else [])


def check_against_template(tok, episode, prompt_ids, completion_ids, mask, turns=None):
    """Token by token against the template's rendering; returns the (masked, trained) completion texts.

    ``turns``: the raw policy turns; when given, each trained span must be exactly one turn + <|im_end|>.
    """
    ids, amask = rendered_spans(tok, episode)
    n = len(prompt_ids) + len(completion_ids)
    # The concatenated rollout is the template's rendering up to the last <|im_end|> (only its "\n" follows).
    assert prompt_ids + completion_ids == ids[:n]
    assert tok.decode(ids[n:]) == "\n"
    # Token by token: trained exactly where the template marks assistant output.
    assert list(mask) == amask[len(prompt_ids):n]
    # Span by span: each masked-out span is one group of observations (tool results of one turn, or one
    # customer reply), in order; each trained span is one policy turn and its <|im_end|>.
    convo = trained_conversation(episode)
    groups, cur = [], []
    for m in convo[len(episode.task.initial_messages()):]:
        if m["role"] == "assistant":
            if cur:
                groups.append(cur)
            cur = []
        else:
            cur.append(m)
    masked_spans = [tok.decode(seg) for seg in _segments(completion_ids, mask, 0)]
    assert len(masked_spans) == len(groups) > 0
    for text, group in zip(masked_spans, groups):
        assert all(m["content"] in text for m in group)
        assert text.startswith("\n<|im_start|>user\n") and text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    trained_spans = [tok.decode(seg) for seg in _segments(completion_ids, mask, 1)]
    assert len(trained_spans) == len(groups) + 1
    if turns is not None:
        assert trained_spans == [t + "<|im_end|>" for t in turns]
    return "".join(masked_spans), "".join(trained_spans)


def check_desk(tok, episode, prompt_ids, completion_ids, mask, turns=None):
    masked, trained = check_against_template(tok, episode, prompt_ids, completion_ids, mask, turns)
    assert "<tool_response>" in masked and "population of" in masked  # the tool response
    assert "I mean" in masked  # the simulated user's turn
    assert "<tool_response>" not in trained and "I mean" not in trained
    assert "<tool_call>" in trained and "Which city do you mean?" in trained


def test_rollout_mask_matches_rendered_assistant_spans(base_dir):
    from acl_lib.model import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer(base_dir)
    env = DeskEnv()
    episodes = [env.start(t, max_turns=6) for t in env.tasks("train", 3)]
    rolls = trl_env.rollout_episodes(episodes, expert_policy(tok), tok, max_completion_length=512)
    for ep, r in zip(episodes, rolls):
        assert ep.reward() == 1.0 and len(r.turns) == 3
        assert len(r.completion_ids) == len(r.env_mask)
        check_desk(tok, ep, r.prompt_ids, r.completion_ids, r.env_mask, r.turns)


def test_rollout_mask_on_real_retail_episodes(base_dir):
    """The real retail desk: tool results and the rule-based customer's replies carry no loss."""
    from acl_lib.envs import make_env, scripted_expert
    from acl_lib.model import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer(base_dir)
    env = make_env("retail", None, seed=0)
    episodes = [env.start(t, max_turns=12) for t in env.tasks("train", 2)]
    rolls = trl_env.rollout_episodes(episodes, expert_policy(tok, scripted_expert("retail")), tok, 20000)
    for ep, r in zip(episodes, rolls):
        assert ep.reward() == 1.0, ep.failure
        roles = {m["role"] for m in trained_conversation(ep)[2:]}
        assert {"tool", "user"} <= roles  # both kinds of observation happened
        masked, trained = check_against_template(tok, ep, r.prompt_ids, r.completion_ids, r.env_mask, r.turns)
        assert "<tool_response>" in masked and "<tool_response>" not in trained


def test_rollout_budget_cuts_the_episode_and_scores_zero(base_dir):
    from acl_lib.model import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer(base_dir)
    env = DeskEnv()
    ep = env.start(env.tasks("train", 1)[0])
    (r,) = trl_env.rollout_episodes([ep], expert_policy(tok), tok, max_completion_length=40)
    assert len(r.completion_ids) <= 40 and ep.done
    assert ep.reward() == 0.0 and "budget" in ep.failure
    # The per-turn cap (the evaluator's max_new_tokens) cuts a turn even with rollout budget left.
    ep = env.start(env.tasks("train", 1)[0])
    (r,) = trl_env.rollout_episodes([ep], expert_policy(tok), tok, max_completion_length=512, max_new_tokens=3)
    assert r.truncated and r.completion_ids == r.completion_ids[:3] and len(r.completion_ids) == 3
    assert ep.reward() == 0.0 and "cut off after 3 tokens" in ep.failure


@pytest.mark.slow
def test_grpo_trainer_loss_mask_on_expert_rollouts(base_dir, tmp_path):
    """The mask inside a real GRPOTrainer step (completion_mask * tool_mask, what the loss multiplies)."""
    from acl_lib.model import load_model_and_tokenizer
    from acl_lib.runs import Run
    from acl_lib.train import grpo

    cfg = tiny_cfg(tmp_path, **{"grpo.max_completion_length": 256, "grpo.batch_size": 4})
    run = Run(cfg, "mask_check")
    _, tok = load_model_and_tokenizer(base_dir)
    env = DeskEnv()
    tasks = env.tasks("train", 2)
    trainer = grpo.build_trainer(cfg, base_dir, env, tasks, run.path, policy=expert_policy(tok))
    batch = [trainer.train_dataset[i] for i in (0, 0, 1, 1)]  # num_generations=2: each prompt twice
    trainer.model.train()
    out = trainer._generate_and_score_completions(batch)
    loss_mask = out["completion_mask"] * out["tool_mask"]
    assert out["advantages"].shape == (4,)
    for k, env_ep in enumerate(trainer.environments):
        ep = env_ep.episode
        assert ep.reward() == 1.0
        n = int(out["completion_mask"][k].sum())
        prompt = out["prompt_ids"][k][out["prompt_mask"][k].bool()].tolist()
        check_desk(tok, ep, prompt, out["completion_ids"][k][:n].tolist(), loss_mask[k][:n].tolist())
    # The loss on these rollouts runs through the same mask (the training loop sets the accumulation count).
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer.compute_loss(trainer.model, out)
    assert torch.isfinite(loss)


# --- the context guard (issue 32, item 5) -------------------------------------------------------------------


def recording(policy, seen: list):
    """``policy`` that also records each request's (context tokens, new-token cap)."""

    def wrapped(reqs):
        seen.extend((len(r.ids), r.max_new_tokens) for r in reqs)
        return policy(reqs)

    return wrapped


def test_rollout_ends_the_episode_at_the_context_limit_instead_of_sending_it(base_dir):
    """A request whose context + per-turn cap would pass the model's context is never sent: the episode ends
    with a "context limit" failure, and its rollout ends on the last policy token (no dangling observation)."""
    from acl_lib.model import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer(base_dir)
    env, cap = DeskEnv(), 48
    task = env.tasks("train", 1)[0]
    free: list = []
    ep = env.start(task, max_turns=6)
    trl_env.rollout_episodes([ep], recording(expert_policy(tok), free), tok, 512, max_new_tokens=cap)
    assert ep.reward() == 1.0 and len(free) == 3  # unlimited: three turns
    ctx = free[1][0] + cap - 1  # the first turn fits, the second would pass the context by one token
    seen: list = []
    ep = env.start(task, max_turns=6)
    (r,) = trl_env.rollout_episodes([ep], recording(expert_policy(tok), seen), tok, 512, max_new_tokens=cap,
                                    max_context=ctx)
    assert seen == free[:1] and all(n + cap <= ctx for n, _ in seen)
    assert ep.done and ep.end_reason.startswith("context limit")
    assert ep.reward() == 0.0 and "context limit" in ep.failure
    assert len(r.turns) == 1 and r.env_mask == [1] * len(r.completion_ids) and r.completion_ids[-1] == tok.eos_token_id
    # A prompt that does not fit with one turn's cap: nothing is sent at all.
    seen.clear()
    ep = env.start(task, max_turns=6)
    (r,) = trl_env.rollout_episodes([ep], recording(expert_policy(tok), seen), tok, 512, max_new_tokens=cap,
                                    max_context=free[0][0] + cap - 1)
    assert seen == [] and r.completion_ids == [] and ep.end_reason.startswith("context limit")


@pytest.mark.slow
def test_grpo_trainer_rollout_stops_at_the_models_context(base_dir, tmp_path, monkeypatch):
    """In a real GRPOTrainer step on the HF backend: the context is the model's ``max_position_embeddings``
    (``trl_env.context_limit``); an episode whose request would pass it ends with "context limit" unsent, the
    others generate, and the batch's tensors stay consistent."""
    from acl_lib.model import load_model_and_tokenizer
    from acl_lib.runs import Run
    from acl_lib.train import grpo

    cfg = tiny_cfg(tmp_path, **{"grpo.batch_size": 4})
    cap = cfg.grpo.max_new_tokens
    _, tok = load_model_and_tokenizer(base_dir)
    env = DeskEnv()
    short, long = env.tasks("train", 2)
    long = dataclasses.replace(long, user_prompt=long.user_prompt + " Please answer quickly, thank you.")
    tasks = [short, long]
    lens = [len(trl_env.prompt_ids_for(tok, env.start(t))) for t in tasks]
    assert lens[0] < lens[-1]
    trainer = grpo.build_trainer(cfg, base_dir, env, tasks, Run(cfg, "ctx_check").path)
    ctx = lens[-1] + cap - 1  # the longest prompt does not fit with one turn's cap
    trainer.model.config.max_position_embeddings = ctx
    assert trl_env.context_limit(trainer) == ctx
    seen: list = []
    real = trl_env.hf_policy
    monkeypatch.setattr(trl_env, "hf_policy", lambda tr: recording(real(tr), seen))
    batch = [trainer.train_dataset[i] for i in (0, 0, 1, 1)]
    trainer.model.train()
    out = trainer._generate_and_score_completions(batch)
    assert all(n + c <= ctx for n, c in seen)
    blocked = [(e.episode.end_reason or "").startswith("context limit") for e in trainer.environments]
    assert any(blocked) and not all(blocked) and seen  # the desk's prompts differ in length
    for e, b in zip(trainer.environments, blocked):
        # a blocked episode's next request would not have fitted; one that was not blocked sent only requests that
        # fitted (``seen``) and may have ended otherwise (its world ended it) with a longer conversation
        if b:
            assert len(trl_env.prompt_ids_for(tok, e.episode)) + cap > ctx
    assert out["completion_ids"].shape == out["tool_mask"].shape == out["completion_mask"].shape


# --- one end-of-turn rule for training and evaluation (issue 32, item 10) ------------------------------------


@pytest.mark.parametrize("end", ["<|im_end|>", "<|endoftext|>", "length"])
def test_a_turn_ends_the_same_way_in_training_and_evaluation(base_dir, end):
    """Real ``generate`` on both paths, the model's output layer scripted to write "Answer: 7", then ``end``
    (a stop token, or nothing: the turn runs into its token cap), then an invented next turn. Both paths end the
    turn by ``policies.split_turn``: at either stop token a normal turn with the same text (training keeps the
    sampled stop token in the completion); without one, the same cut-off text, which training scores as a
    truncation (the rollout budget rule) while evaluation scores the text as written."""
    from types import SimpleNamespace

    from acl_lib.envs.base import SingleTurnEpisode, Task
    from acl_lib.eval import harness, policies
    from test_paper_eval import _Scripted

    cap = 12
    policy = policies.HFPolicy(str(base_dir), max_new_tokens=cap)
    tok, model = policy.tok, policy.model
    assert {tok.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")} == set(policy.stop_ids)
    text_ids = tok("Answer: 7", add_special_tokens=False)["input_ids"]
    invented = tok("user: thanks, and one more question", add_special_tokens=False)["input_ids"]
    stop = None if end == "length" else tok.convert_tokens_to_ids(end)
    script = text_ids + ([stop] if stop is not None else []) + invented * 3
    task = Task(id="t0", domain="math", benchmark="aime26", system_prompt="", user_prompt="What is 3+4?", answer="7")
    episode = lambda: SingleTurnEpisode(task, lambda text, t: (float(text == "Answer: 7"), "wrong"))  # noqa: E731

    model.lm_head = _Scripted(script, model.config.vocab_size)
    ev = episode()
    harness.run_episodes(policy, [ev])

    model.lm_head = _Scripted(script, model.config.vocab_size)
    trainer = SimpleNamespace(processing_class=tok, _acl_gen_model=model, generation_config=model.generation_config)
    tr = episode()
    (r,) = trl_env.rollout_episodes([tr], trl_env.hf_policy(trainer), tok, 64, max_new_tokens=cap)

    assert r.turns == [ev.messages[-1]["content"]]
    if stop is not None:
        assert r.turns == ["Answer: 7"] and r.completion_ids == text_ids + [stop] and not r.truncated
        assert tr.messages == ev.messages and tr.reward() == ev.reward() == 1.0
        assert tr.failure is None and ev.failure is None
    else:
        assert policies.split_turn(script[:cap], policy.stop_ids)[1] is None
        assert len(r.completion_ids) == cap and r.truncated
        assert tr.reward() == 0.0 and "turn cut off" in tr.failure
        assert ev.reward() == 0.0 and ev.failure == "wrong"  # scored as written


class _Remote:
    """Counts how many calls are in flight at once; each call waits as a remote simulator's request would."""

    def __init__(self, wait: float = 0.15):
        import threading

        self.wait, self.now, self.most, self.calls, self._lock = wait, 0, 0, 0, threading.Lock()

    def __call__(self):
        import time

        with self._lock:
            self.now += 1
            self.calls += 1
            self.most = max(self.most, self.now)
        time.sleep(self.wait)
        with self._lock:
            self.now -= 1


def test_remote_customers_are_started_and_answered_concurrently_in_training(base_dir):
    """Issue 32 item 8: episodes whose customer is a remote simulator (step_concurrency > 1) open and answer a
    rollout round in threads, as evaluation steps them; local ones stay in order in this thread."""
    from acl_lib.model import load_model_and_tokenizer
    from train_kit import DeskEnv, DeskEpisode

    _, tok = load_model_and_tokenizer(base_dir)
    remote = _Remote()

    class RemoteEpisode(DeskEpisode):
        step_concurrency = 4

        def __init__(self, task, max_turns=16):
            remote()  # the customer's opening message
            super().__init__(task, max_turns=max_turns)

        def on_text(self, content):
            remote()  # the customer's reply (or the end of the conversation)
            return super().on_text(content)

    class RemoteDesk(DeskEnv):
        def start(self, task, max_turns=16):
            return RemoteEpisode(task, max_turns=max_turns)

    env = RemoteDesk()
    envs = [trl_env.environment_factory(env, max_turns=6)() for _ in range(8)]
    for e, t in zip(envs, env.tasks("train", 8)):
        e.reset(task=trl_env.task_row(t)["task"])
    assert all(e.episode is None for e in envs)  # reset only takes the task: TRL resets one env after another
    episodes = trl_env.start_episodes(envs)
    assert remote.calls == 8 and remote.most == 4  # the first alone, then four at a time
    remote.most = 0
    rolls = trl_env.rollout_episodes(episodes, expert_policy(tok), tok, max_completion_length=512)
    assert all(ep.done and ep.reward() == 1.0 for ep in episodes) and len(rolls) == 8
    assert remote.calls == 8 + 8 * 2 and remote.most == 4  # the question and the answer turns, four at a time

    local = _Remote(wait=0.01)

    class LocalEpisode(DeskEpisode):  # step_concurrency 1: a local model plays the customer
        def on_text(self, content):
            local()
            return super().on_text(content)

    episodes = [LocalEpisode(t) for t in env.tasks("train", 4)]
    trl_env.rollout_episodes(episodes, expert_policy(tok), tok, max_completion_length=512)
    assert local.calls == 8 and local.most == 1


@pytest.mark.slow
def test_zero3_ranks_with_uneven_rollout_forwards_do_not_wait_on_each_other(tmp_path):
    """Issue 32 (found by the hostfile rehearsal): under ZeRO-3 the rank whose episodes all end first stops making
    forward passes; DeepSpeed's top-module hook, which TRL's ``remove_hooks`` leaves on, broadcasts at every
    forward, so the other rank waited forever. Two real ZeRO-3 ranks (CPU, gloo) make 1 and 4 forwards in the
    rollout, then train two steps together. Without ``zero3_forwards_stay_local`` (``--without-fix``) the worker
    hangs here (checked: killed at 90 s)."""
    import subprocess
    import sys

    from conftest import ROOT, child_env, free_port

    env = {**child_env(), "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--master_port", str(free_port()), str(ROOT / "tests" / "zero3_uneven_forwards.py")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)
    # on failure, the ranks' own lines (why one aborted) as well as torchrun's summary at the end
    assert res.returncode == 0, res.stdout[-3000:] + "\n--- stderr ---\n" + res.stderr[-12000:]
    assert "rank 0 done" in res.stdout and "rank 1 done" in res.stdout
    losses = {line.split(" loss ")[1] for line in res.stdout.splitlines() if " step 1 loss " in line}
    assert len(losses) == 1  # both ranks trained the same model after their uneven rollouts

