"""CPU rehearsal of the paper profile (issue 15, item 3, and defect 3): the ``paper`` profile's own code paths at
toy size, on a tiny Qwen3 checkpoint shaped as Qwen3-8B-Base ships (Qwen3's own chat template, TRL's copy of it in
``trl/chat_templates/qwen3.jinja``; eos = pad = ``<|endoftext|>``; no response template), so the hub-base path
of ``acl_lib.model.apply_chat_convention`` runs as it will on the cluster.

What each test covers (issue 15):

* ``test_qwen3s_own_template_breaks_rollouts_and_its_training_variant_fixes_them``: defect 3. With Qwen3's
  template the rollout cannot append an observation (the last assistant turn's empty think block disappears once
  an observation follows); rollouts render with TRL's training variant, and the loss mask matches that
  template's own ``{% generation %}`` spans token by token.
* ``test_multi_turn_grpo_step_with_qwen3s_template``: defect 3 and item 3 ("a multi-turn GRPO step"): a real
  ``GRPOTrainer`` step on both observation kinds (tool results, a simulated user) moves the weights.
* ``test_paper_profile_rehearsal``: item 3 with items 1 and 2: ``load_config("paper")`` with overrides that only
  shrink sizes and point at local files: the data layout ``acl data prepare`` writes (built from tests/data by
  tests/paper_layout.py) and checked complete by ``acl data check``; multi-turn GRPO on real tau2
  retail tasks whose customer is the LLM user simulator (backend ``hf``, the tiny Qwen3 model), through
  ``launcher.launch``; the trained checkpoint evaluated on the whole suite (real-data loaders of every benchmark)
  through the process boundary the cluster uses (``launcher.eval_subprocess``: ``pipeline.evaluate_checkpoint``).
* ``test_what_needs_a_gpu_is_rendered_from_the_paper_profile``: item 3 ("rendered and validated"): vLLM itself
  does not run on CPU; the unshrunk paper profile's engine and sampling arguments (evaluation and GRPO rollouts:
  max model length, stop tokens, per-turn budget, colocate mode) are built from the Qwen3 tokenizer and checked.
  The suite has no LoRA settings yet (MLE, notebook 11, is a later issue): nothing to render for them.
* ``test_the_customer_model_loads_whole_inside_a_zero3_job``: item 1 inside item 3: the LLM user simulator on a
  local model (backend ``hf``) in a ZeRO-3 training process, a defect the hostfile rehearsal found.
* ``test_hostfile_launch_on_two_local_processes`` (marked ``rehearsal``; ``make rehearsal``, which ``.ci/run``
  calls): item 3 ("the hostfile launcher on two local processes"): the paper profile's ``multi_node`` launch with
  a hostfile naming ``localhost slots=2`` runs the generated ``deepspeed.sh`` for real: two DeepSpeed ZeRO-3
  workers on the CPU accelerator take a multi-turn GRPO step on real retail tasks with the LLM user simulator.
  Not in ``make test``: DeepSpeed's CPU accelerator JIT-builds a comm extension on first use (~5 min, cached in
  ``~/.cache/torch_extensions``) and the job itself takes about a minute.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from acl_lib.config import load_config
from acl_lib.train import trl_env
from conftest import ROOT
from train_kit import DeskEnv, desk_corpus, desk_expert

torch.set_num_threads(1)

TAU2 = ROOT / "tests" / "data" / "tau2"
ENDOFTEXT, IM_END = "<|endoftext|>", "<|im_end|>"
THINK = "<think>\n\n</think>\n\n"  # what Qwen3 writes before a turn it does not think about


def _retail_text() -> list[str]:
    """The real retail agent prompt (policy + 15 tool schemas), so the tokenizer compresses it (~2.5k tokens)."""
    from acl_lib.envs.retail_db import tool_schemas

    policy = (TAU2 / "retail" / "policy.md").read_text()
    return [policy, json.dumps(tool_schemas(compact=False))] * 3


def _teach_short_turns(model, tok, steps: int = 80) -> None:
    """A few seconds of next-token training on desk conversations rendered by Qwen3's template, so that the model
    writes short turns that end at ``<|im_end|>`` (as agent and as customer) instead of random tokens that never
    stop: the rehearsal's episodes then go on past their first turn, with observations and customer replies."""
    env = DeskEnv()
    ids: list[int] = []
    for t in env.tasks("train", 24, seed=7):
        ep = env.start(t)
        while not ep.done:
            ep.step(desk_expert(t, ep.messages))
        text = tok.apply_chat_template(ep.messages, tokenize=False)
        ids += tok(text, add_special_tokens=False)["input_ids"]
    # Whole retail-shaped conversations too (policy + 15 tool schemas, ~2.5k tokens): a short turn must also end
    # after a long prompt.
    from acl_lib.envs.retail_db import tool_schemas

    policy, tools = (TAU2 / "retail" / "policy.md").read_text(), tool_schemas(compact=False)
    desk = [{"role": "system", "content": policy}, {"role": "user", "content": "I want to return a lamp."},
            {"role": "assistant", "content": "Which order is it?"}, {"role": "user", "content": "Order 12, thanks."},
            {"role": "assistant", "content": "Done. Anything else?"}]
    long = torch.tensor([tok.apply_chat_template(desk, tools=tools, tokenize=True, return_dict=False)])
    n_prompt = len(tok.apply_chat_template(desk[:2], tools=tools, tokenize=True, return_dict=False))
    long_labels = long.clone()
    long_labels[:, :n_prompt] = -100  # learn the turns, not the schemas
    seq = 96
    data = torch.tensor(ids[: len(ids) // seq * seq]).view(-1, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    g = torch.Generator().manual_seed(0)
    for step in range(steps):
        batch = data[torch.randint(len(data), (8,), generator=g)]
        batch, labels = (long, long_labels) if step % 2 else (batch, batch)
        loss = model(input_ids=batch, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.eval()


def make_qwen3_base(path: Path, vocab_size: int = 4096) -> Path:
    """A tiny Qwen3 checkpoint whose tokenizer looks like Qwen3-8B-Base's: Qwen3's own chat template, eos = pad =
    ``<|endoftext|>``, no ``response_template`` (``load_model_and_tokenizer`` installs them). Its weights are
    random, briefly trained to write short chat turns (``_teach_short_turns``)."""
    from trl.chat_template_utils import qwen3_chat_template

    from acl_lib.model import build_model, save, train_tokenizer

    cfg = load_config("smoke")
    torch.manual_seed(0)
    tok = train_tokenizer(list(desk_corpus()) + _retail_text(), vocab_size, model_max_length=8192)
    model = build_model(cfg.model.model_copy(update={"max_position_embeddings": 8192}), tok)
    tok.chat_template = qwen3_chat_template
    _teach_short_turns(model, tok)
    tok.response_template = None
    tok.eos_token = ENDOFTEXT
    eos = tok.convert_tokens_to_ids(ENDOFTEXT)
    model.config.eos_token_id = model.generation_config.eos_token_id = eos
    save(model, tok, path)
    conf = json.loads((path / "tokenizer_config.json").read_text())
    assert conf.get("response_template") is None and conf["eos_token"] == ENDOFTEXT
    return path


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory):
    return make_qwen3_base(tmp_path_factory.mktemp("qwen3") / "model")


@pytest.fixture(scope="module")
def qwen3_tok(qwen3_dir):
    from acl_lib.model import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer(qwen3_dir)
    return tok


def thinking_expert(tok, wrong_every: int = 0):
    """The desk's scripted expert as a token policy that writes Qwen3's empty think block before every turn.
    ``wrong_every`` > 0: every ``wrong_every``-th episode (by first appearance) gives a wrong final answer."""
    order: dict[int, int] = {}

    def policy(reqs):
        outs = []
        for r in reqs:
            k = order.setdefault(id(r.episode), len(order))
            text = desk_expert(r.episode.task, r.episode.messages)
            if wrong_every and k % wrong_every == wrong_every - 1 and text.startswith("It has"):
                text = "It has 0 inhabitants."
            outs.append(tok.encode(THINK + text, add_special_tokens=False) + [tok.eos_token_id])
        return outs, None

    return policy


def _conversation(episode):
    msgs = list(episode.messages)
    while msgs[-1]["role"] != "assistant":
        msgs.pop()
    return msgs


def check_mask_against_template(tok, template, episode, prompt_ids, completion_ids, mask):
    """The rollout equals the template's rendering of the finished conversation, and is trained exactly on the
    template's assistant spans (except the newline after each ``<|im_end|>``, which the template puts in the span
    and the rollout in the next observation: the policy stops at ``<|im_end|>`` and never writes it)."""
    out = tok.apply_chat_template(_conversation(episode), tools=episode.task.tools, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True, chat_template=template)
    ids, amask = list(out["input_ids"]), list(out["assistant_masks"])
    n = len(prompt_ids) + len(completion_ids)
    assert prompt_ids + completion_ids == ids[:n]
    assert tok.decode(ids[n:]) == "\n"
    eos = tok.eos_token_id
    expected = [0 if i > 0 and ids[i - 1] == eos else amask[i] for i in range(len(prompt_ids), n)]
    assert list(mask) == expected
    assert sum(mask) > 0 and 0 in mask
    trained = tok.decode([t for t, m in zip(completion_ids, mask) if m])
    assert trained.count(THINK) == len([m for m in _conversation(episode) if m["role"] == "assistant"])
    assert "<tool_response>" not in trained and "I mean" not in trained


# --- defect 3 ------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_qwen3s_own_template_breaks_rollouts_and_its_training_variant_fixes_them(qwen3_tok):
    from trl.chat_template_utils import qwen3_chat_template, qwen3_training_chat_template

    tok = qwen3_tok
    # The hub-base conventions were applied on load: eos <|im_end|>, TRL's Qwen3 response parser.
    assert tok.chat_template == qwen3_chat_template and tok.eos_token == IM_END and tok.pad_token == ENDOFTEXT
    assert tok.response_template["fields"]["tool_calls"]
    # The defect: after an assistant turn, appending a user message or a tool result re-renders that turn.
    for obs in ([{"role": "user", "content": "I mean Paris."}], [{"role": "tool", "name": "lookup", "content": "1"}]):
        with pytest.raises(ValueError, match="prefix-preserving"):
            trl_env.observation_ids(tok, obs)
    template = trl_env.rollout_chat_template(tok)
    assert template == qwen3_training_chat_template
    assert tok.chat_template == qwen3_chat_template  # the tokenizer (and the checkpoint it is saved with) keeps its own

    env = DeskEnv()
    episodes = [env.start(t, max_turns=6) for t in env.tasks("train", 2)]
    # The prompt is the same under both templates: what the evaluator renders is what training starts from.
    for ep in episodes:
        assert trl_env.prompt_ids_for(tok, ep, template) == trl_env.prompt_ids_for(tok, ep)
    rolls = trl_env.rollout_episodes(episodes, thinking_expert(tok), tok, 1024, chat_template=template)
    for ep, r in zip(episodes, rolls):
        assert ep.reward() == 1.0, ep.failure
        assert {"tool", "user"} <= {m["role"] for m in ep.messages[2:]}  # both observation kinds were appended
        check_mask_against_template(tok, template, ep, r.prompt_ids, r.completion_ids, r.env_mask)


@pytest.mark.slow
def test_a_template_without_a_training_variant_is_refused_before_training(qwen3_tok):
    """A non-prefix-preserving template TRL does not know is an error naming the cause, not a silent mis-mask."""
    tok = qwen3_tok
    saved = tok.chat_template
    try:
        tok.chat_template = saved.replace("# Tools", "# Our tools")  # Qwen3's behaviour, an unknown text
        with pytest.raises(ValueError, match="not prefix-preserving.*no training variant"):
            trl_env.rollout_chat_template(tok)
    finally:
        tok.chat_template = saved


@pytest.mark.slow
def test_multi_turn_grpo_step_with_qwen3s_template(qwen3_dir, tmp_path):
    from acl_lib.runs import Run
    from acl_lib.train import grpo

    cfg = load_config("smoke", overrides={"output_dir": str(tmp_path / "outputs"), "torch_threads": 1,
                                          "grpo.max_steps": 1, "grpo.batch_size": 4, "grpo.num_generations": 2,
                                          "grpo.max_episode_tokens": 512, "grpo.learning_rate": 1e-2})
    run = Run(cfg, "grpo_qwen3")
    from acl_lib.model import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer(qwen3_dir)
    env = DeskEnv()
    trainer = grpo.build_trainer(cfg, qwen3_dir, env, env.tasks("train", 2), run.path,
                                 policy=thinking_expert(tok, wrong_every=2))
    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    rewards = sorted(e.episode.reward() for e in trainer.environments)
    assert rewards == [0.0, 0.0, 1.0, 1.0]  # one right and one wrong episode per group: non-zero advantages
    after = trainer.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    log = trainer.state.log_history[0]
    assert log["reward"] == 0.5 and log["rewards/EpisodeEnv/mean"] == 0.5


# --- item 3: the paper profile at toy size ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def layout(paper_layout):
    """The data layout of ``acl data prepare`` built from the test fixtures (conftest.py's ``paper_layout``)."""
    return paper_layout[0]


def rehearsal_overrides(tmp_path: Path, layout: Path, model_dir: Path) -> dict:
    """Overrides of the paper profile that only shrink sizes and point at local files: the tiny Qwen3 checkpoint
    as the base, the shipped mini base as the customer (``worlds.user_sim`` backend ``hf``, a local model, instead
    of gpt-4.1 through the OpenAI API; a poor customer, the one small model here that writes customer turns), the
    fixture data layout, HF generation instead of vLLM (no GPU), float32
    (bf16 matmuls are slow on CPU), one thread."""
    return {
        "output_dir": str(tmp_path / "outputs"), "torch_threads": 1,
        "model.base_model": str(model_dir), "model.max_position_embeddings": 8192, "model.dtype": "float32",
        "worlds.data_dir": str(layout), "worlds.n_train": 2, "worlds.n_test": 1, "worlds.n_ood": 1,
        "worlds.user_sim.backend": "hf", "worlds.user_sim.model": "acl_lib/data/mini_base", "worlds.user_sim.url": "",
        "worlds.user_sim.api_key_env": "", "worlds.user_sim.max_new_tokens": 16, "worlds.user_sim.max_turns": 3,
        # sampled: greedy, the mini base (mid-trained as the desk's agent) answers the policy in neither training
        # task (the hostfile rehearsal below keeps it greedy for what that does to two ranks)
        "worlds.user_sim.temperature": 1.0,
        "eval.backend": "hf", "eval.k": 1, "eval.max_new_tokens": 24, "eval.max_turns": 2, "eval.batch_size": 4,
        "grpo.max_steps": 1, "grpo.num_generations": 2, "grpo.batch_size": 4, "grpo.max_new_tokens": 24,
        "grpo.max_turns": 3, "grpo.max_completion_length": 24, "grpo.max_episode_tokens": 256,
        "grpo.use_vllm": False, "grpo.learning_rate": 1e-3,
        "launcher.mixed_precision": "no", "eval.shards": 2,
    }


def tok_decode(model_dir, ids) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir).decode(ids)


@pytest.mark.slow
def test_paper_profile_rehearsal(qwen3_dir, layout, tmp_path, monkeypatch):
    from acl_lib import paper_data
    from acl_lib.envs import benchmarks_for, make_env
    from acl_lib.pipeline import evaluate_checkpoint
    from acl_lib.runs import Run, run_once
    from acl_lib.train import launcher

    report = paper_data.check(layout)
    assert report.complete, report.format()  # what `acl data check` says before any GPU time
    cfg = load_config("paper", overrides={**rehearsal_overrides(tmp_path, layout, qwen3_dir),
                                          "launcher.mode": "in_process"})
    # What the rehearsal keeps of the paper profile: the ZeRO-3 / multi-node launcher settings, evaluation in a
    # subprocess, activation checkpointing, the real data under worlds.data_dir, every suite.
    assert cfg.launcher.eval_subprocess and cfg.launcher.activation_checkpointing and cfg.launcher.zero_stage == 3
    assert cfg.pretrain.enabled is False and cfg.eval.suites == "all"

    # E-commerce GRPO on real tau2 retail tasks: the customer is the LLM user simulator, the policy samples. The
    # rollouts the trainer drives are kept to be read afterwards (the function itself runs unchanged).
    from acl_lib.envs.llm_user import LLMUserEpisode

    seen = []
    real_rollout = trl_env.rollout_episodes

    def keep(episodes, *a, **kw):
        rolls = real_rollout(episodes, *a, **kw)
        seen.extend(zip(episodes, rolls))
        return rolls

    monkeypatch.setattr(trl_env, "rollout_episodes", keep)
    stage = Run(cfg, "seq_ecom")
    run_once(stage, lambda r: launcher.launch(cfg, "grpo", r.path, model_dir=str(qwen3_dir), domain="ecom"))
    summary = json.loads((stage.path / "train_summary.json").read_text())
    assert summary["multi_turn"] is True and summary["steps"] == 1 and summary["tasks"] == 2
    assert len(seen) == 4 and all(isinstance(ep, LLMUserEpisode) for ep, _ in seen)
    # The simulated customer opened the conversations (the mini base, mid-trained as the desk's agent, opens some
    # with tool-call markup: that episode ends with the simulator's reason), and answered the policy inside at least
    # one rollout: that reply's tokens (rendered with Qwen3's training template) are in the completion with no loss
    # on them.
    assert all(ep.messages[1]["role"] == "user" for ep, _ in seen)
    assert all(ep.messages[1]["content"] or "tool-call markup" in ep.user.error for ep, _ in seen), \
        [(ep.messages[1], ep.user.error) for ep, _ in seen]
    assert any(ep.messages[1]["content"] for ep, _ in seen)
    replied = [(ep, r) for ep, r in seen if sum(m["role"] == "user" for m in ep.messages) >= 2 and 0 in r.env_mask]
    assert replied, [ep.failure for ep, _ in seen]
    for ep, r in replied:
        masked = tok_decode(qwen3_dir, [t for t, m in zip(r.completion_ids, r.env_mask) if not m])
        assert "<|im_start|>user\n" in masked and ep.user.said[1][:10] in masked
    retail_ids = {t["id"] for t in json.loads((TAU2 / "retail" / "tasks.json").read_text())}
    env = make_env("retail", cfg.worlds, seed=cfg.worlds.seed)
    train = env.tasks("train", 2, seed=cfg.seed)
    assert all(t.id.removeprefix("retail-") in retail_ids for t in train), [t.id for t in train]
    assert all((t.meta or {}).get("user_scenario") for t in train)
    # The trained checkpoint keeps Qwen3's own template (rollouts rendered with the training variant only).
    from trl.chat_template_utils import qwen3_chat_template

    from acl_lib.model import load_model_and_tokenizer

    _, tok = load_model_and_tokenizer(stage.path / "model")
    assert tok.chat_template == qwen3_chat_template

    # Evaluation of that checkpoint as the pipeline does it at the paper profile: in a process of its own.
    ev = evaluate_checkpoint(cfg, stage)
    metrics = json.loads((ev.path / "metrics.json").read_text())
    expected = {b.key for b in benchmarks_for("all")}
    assert set(metrics["scores"]) == expected and all(n >= 1 for n in metrics["n_tasks"].values())
    assert metrics["model"] == str(stage.path / "model")
    records = [json.loads(line) for line in (ev.path / "records" / "retail.jsonl").read_text().splitlines()]
    assert records and all(r["user_sim"]["model"] == f"policy:{ROOT / 'acl_lib/data/mini_base'}" for r in records)


@pytest.mark.slow
def test_what_needs_a_gpu_is_rendered_from_the_paper_profile(qwen3_tok, tmp_path):
    from types import SimpleNamespace

    from acl_lib.eval import policies
    from acl_lib.train.grpo import grpo_args

    cfg = load_config("paper", overrides={"output_dir": str(tmp_path / "outputs")})
    tok = qwen3_tok
    stops = policies.stop_token_ids(tok)
    vocab = tok.get_vocab()
    assert stops == sorted({vocab[IM_END], vocab[ENDOFTEXT]})  # a turn ends at <|im_end|> whatever the eos

    # GRPO rollouts on colocated vLLM: the engine's context is the model's, one turn per call, stops at a turn's end.
    multi = grpo_args(cfg, tmp_path / "m", multi_turn=True, stop_ids=stops)
    assert multi.use_vllm and multi.vllm_mode == "colocate"
    assert multi.vllm_max_model_length == cfg.model.max_position_embeddings == 32768
    assert multi.generation_kwargs == {"stop_token_ids": stops, "max_tokens": cfg.grpo.max_new_tokens}
    assert multi.max_completion_length == cfg.grpo.max_episode_tokens <= multi.vllm_max_model_length
    single = grpo_args(cfg, tmp_path / "s", multi_turn=False, stop_ids=stops)
    assert single.generation_kwargs == {"stop_token_ids": stops}
    assert single.max_completion_length == cfg.grpo.max_completion_length
    assert multi.bf16 and multi.activation_checkpointing

    # Evaluation: the vLLM engine and sampling arguments the policy passes, with a stand-in engine.
    captured = {}

    class Engine:
        def generate(self, prompts, params, use_tqdm=False):
            captured["params"] = params
            return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=[vocab[IM_END]])]) for _ in prompts]

    engine_args = policies.vllm_engine_args("Qwen/Qwen3-8B-Base", cfg.model.dtype, cfg.model.max_position_embeddings,
                                           seed=cfg.seed)
    assert engine_args == {"model": "Qwen/Qwen3-8B-Base", "tokenizer": "Qwen/Qwen3-8B-Base", "dtype": "bfloat16",
                           "max_model_len": 32768, "seed": 0, "enable_prefix_caching": True,
                           "gpu_memory_utilization": 0.9}
    sampling = policies.vllm_sampling_args(stops, cfg.eval.max_new_tokens, cfg.eval.temperature, cfg.eval.top_p)
    assert sampling == {"max_tokens": 8192, "temperature": 0.6, "top_p": 0.95, "stop_token_ids": stops,
                        "skip_special_tokens": True, "n": 1}
    assert cfg.eval.max_new_tokens < cfg.model.max_position_embeddings  # the context guard leaves room for a prompt


def test_the_customer_model_loads_whole_inside_a_zero3_job(monkeypatch):
    """In a ZeRO-3 training process transformers partitions every model ``from_pretrained`` loads; the LLM user
    simulator's model (backend hf) must load whole, or its first turn fails ("'weight' must be 2-D"). Found by the
    hostfile rehearsal below."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from transformers.integrations import deepspeed as hf_ds
    from transformers.integrations.deepspeed import HfDeepSpeedConfig

    from acl_lib.config import UserSimConfig
    from acl_lib.envs import llm_user
    from acl_lib.eval import policies  # noqa: F401 - hands llm_user the evaluator's policies (backend hf)

    monkeypatch.setattr(llm_user, "_SIMULATORS", {})
    ds = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    try:
        assert hf_ds.is_deepspeed_zero3_enabled()
        chat = llm_user.simulator_for(UserSimConfig(backend="hf", model="acl_lib/data/mini_base", max_new_tokens=4))
        assert hf_ds.is_deepspeed_zero3_enabled()  # the job's own setting is back
    finally:
        hf_ds.unset_hf_deepspeed_config()
        del ds
    emb = chat.policy.model.get_input_embeddings().weight
    assert emb.dim() == 2 and emb.numel() > 0
    assert isinstance(chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]), str)


# --- item 3: the hostfile launcher on two local processes (make rehearsal) -----------------------------------


# DeepSpeed's runner checks a hostfile's first host with `ssh <host> hostname` and asks it for its address with
# `ssh <host> hostname -I`, even when that host is this machine; the test machine runs no ssh server. This `ssh`
# runs the command here, as an ssh to localhost would.
_LOCAL_SSH = """#!/bin/bash
while [[ "$1" == -* ]]; do case "$1" in -o|-p) shift 2;; *) shift;; esac; done
[[ "$1" == localhost ]] || { echo "ssh shim: only localhost, not $1" >&2; exit 255; }
shift
exec bash -c "$*"
"""


@pytest.mark.rehearsal
@pytest.mark.timeout(1200)
def test_hostfile_launch_on_two_local_processes(qwen3_dir, layout, tmp_path, monkeypatch):
    from acl_lib.runs import Run, run_once
    from acl_lib.train import launcher

    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "ssh").write_text(_LOCAL_SSH)
    (bindir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    cfg = load_config("paper", overrides={**rehearsal_overrides(tmp_path, layout, qwen3_dir),
                                          "launcher.hostfile": str(hostfile), "launcher.num_nodes": 1,
                                          "launcher.num_processes": 2, "torch_threads": 2,
                                          # the ZeRO-3 config is bf16 (zero3_bf16.json): the paper's precision
                                          "launcher.mixed_precision": "bf16",
                                          # greedy, the mini base opens one of the two training tasks with tool
                                          # calls: that rank's episodes end at once and the other rank generates
                                          # alone, which hung under ZeRO-3 until
                                          # trl_env.zero3_forwards_stay_local (issue 32)
                                          "worlds.user_sim.temperature": 0.0})
    assert cfg.launcher.mode == "multi_node" and cfg.launcher.zero_stage == 3
    stage = Run(cfg, "seq_ecom")

    def job(r):
        r.checkpoint_dir()
        launcher.launch(cfg, "grpo", r.path, model_dir=str(qwen3_dir), domain="ecom")

    run_once(stage, job)
    summary = json.loads((stage.path / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["deepspeed_zero_stage"] == 3, summary
    assert summary["zero3_partitioned_load"] is True, summary  # each rank loaded its shard, not a whole copy
    assert summary["multi_turn"] is True and summary["steps"] == 1
    script = (stage.path / "launch" / "deepspeed.sh").read_text()
    assert f"--hostfile {hostfile}" in script and "--deepspeed-config" in script
    assert (stage.path / "model" / "model.safetensors").exists()


def _perturbed_copy(src: Path, dst: Path, seed: int) -> str:
    from acl_lib.model import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(src)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    model.save_pretrained(dst)
    tok.save_pretrained(dst)
    return str(dst)


def test_mmopd_teachers_load_whole_inside_a_zero3_job(qwen3_dir, tmp_path, monkeypatch):
    """Issue 32 item 1: the MMOPD job registers ZeRO-3 with transformers (its GRPOConfig) before it loads the
    teachers; they must load whole, not as zero.Init placeholders nobody gathers."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from transformers.integrations import deepspeed as hf_ds
    from transformers.integrations.deepspeed import HfDeepSpeedConfig

    from acl_lib.consolidate.mmopd import TeacherPool

    ds = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    try:
        assert hf_ds.is_deepspeed_zero3_enabled()
        pool = TeacherPool({"t": str(qwen3_dir)}, torch.device("cpu"), "offload")
        assert hf_ds.is_deepspeed_zero3_enabled()  # the job's own setting is back
    finally:
        hf_ds.unset_hf_deepspeed_config()
        del ds
    emb = pool.models["t"].get_input_embeddings().weight
    assert emb.dim() == 2 and emb.numel() > 0
    ids = torch.tensor([[1, 2, 3, 4]])
    assert pool.logits("t", ids, torch.ones_like(ids), 2).shape[:2] == (1, 2)


@pytest.mark.rehearsal
@pytest.mark.timeout(1200)
def test_mmopd_step_under_two_process_zero3(qwen3_dir, layout, tmp_path):
    """Issue 32 item 1 (make rehearsal): one MMOPD step as the paper profile launches it, on two DeepSpeed ZeRO-3
    worker processes (CPU accelerator), math and IF prompts of the real data routed to two teachers."""
    from acl_lib.consolidate import mmopd
    from acl_lib.runs import Run, run_once
    from acl_lib.train import launcher

    cfg = load_config("paper", overrides={**rehearsal_overrides(tmp_path, layout, qwen3_dir),
                                          "launcher.mode": "multi_process", "launcher.num_processes": 2,
                                          "torch_threads": 2, "mmopd.max_steps": 1, "mmopd.batch_size": 4,
                                          "mmopd.n_prompts": 2, "mmopd.teacher_placement": "offload",
                                          # the ZeRO-3 config is bf16 (zero3_bf16.json): the paper's precision
                                          "launcher.mixed_precision": "bf16"})
    assert cfg.launcher.zero_stage == 3
    teachers = {"t_math": _perturbed_copy(qwen3_dir, tmp_path / "t_math", 1),
                "t_if": _perturbed_copy(qwen3_dir, tmp_path / "t_if", 2)}
    run = Run(cfg, "mmopd_rehearsal")

    def job(r):
        r.checkpoint_dir()
        launcher.launch(cfg, "mmopd", r.path, student_dir=str(qwen3_dir), teacher_dirs=teachers,
                        teacher_of={"math": "t_math", "if": "t_if"}, mixture={"math": 1.0, "if": 1.0}, alpha=1.0)

    run_once(run, job)
    summary = json.loads((run.path / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["deepspeed_zero_stage"] == 3 and summary["steps"] == 1, summary
    assert summary["zero3_partitioned_load"] is True, summary  # the student loaded as shards (zero.Init)
    log = [json.loads(line) for line in (run.path / "train_log.jsonl").read_text().splitlines()]
    step = next(r for r in log if "mmopd/reverse" in r)
    assert step["mmopd/reverse"] > 0  # the teachers scored the rows: real weights, not placeholders
    assert mmopd.movement(qwen3_dir, run.path / "model")["update_norm"] > 0
