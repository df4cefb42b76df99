"""MLE (acl_lib.consolidate.mle): the backbone stays bit-identical while a LoRA expert trains (cold start + GRPO,
real search world, tiny model); the context router reads no label field; a mixed batch through PEFT's
``adapter_names`` gives each episode exactly what its adapter alone gives (greedy, token for token, through the
evaluator's multi-turn loop); the learned router is scored on held-out contexts it never trained on; the vLLM
multi-LoRA requests are rendered without vLLM; an evaluation another router would repeat decision for decision is
copied."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from acl_lib import pipeline
from acl_lib.config import load_config
from acl_lib.consolidate import mle
from acl_lib.envs import BENCHMARKS
from acl_lib.envs.base import Task
from acl_lib.eval.harness import run_episodes, world
from acl_lib.runs import Run, run_once
from acl_lib.train.common import read_log
from train_kit import DeskEnv, tiny_cfg

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def smoke_cfg(tmp_path_factory):
    return load_config("smoke", {"output_dir": str(tmp_path_factory.mktemp("mle") / "outputs"), "torch_threads": 1,
                                 "worlds.n_test": 2, "worlds.n_ood": 2})


def _adapters(base_dir, root: Path, names=("a", "b"), rank=4) -> dict:
    """Randomly initialised (non-zero) LoRA adapters of the tiny base, saved in PEFT format."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out = {}
    for k, n in enumerate(names):
        torch.manual_seed(100 + k)
        model = AutoModelForCausalLM.from_pretrained(str(base_dir))
        cfg = LoraConfig(r=rank, lora_alpha=4 * rank, target_modules=["q_proj", "v_proj", "down_proj"],
                         init_lora_weights=False)
        peft = get_peft_model(model, cfg)
        peft.save_pretrained(str(root / n))
        out[n] = root / n
    return out


# --- the backbone ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_backbone_is_bit_identical_after_expert_training(base_dir, tmp_path):
    from safetensors.torch import load_file

    cfg = tiny_cfg(tmp_path, **{"grpo.max_turns": 3, "sft.max_length": 4096, "model.max_position_embeddings": 4096,
                                "grpo.max_completion_length": 32, "mle.num_demos": 4, "mle.sft_max_steps": 1,
                                "mle.grpo_max_steps": 1, "mle.rank": 2, "mle.target_modules": ["q_proj", "v_proj"],
                                "mle.cold_start": True})
    assert cfg.pipeline.cold_start["search"]
    before = mle.file_digests(base_dir)
    info = mle.train_expert(cfg, "search", base_dir, tmp_path / "expert")
    assert info["cold_start"] and info["sft_steps"] == 1 and info["grpo_steps"] == 1
    assert info["backbone_unchanged_in_memory"] and info["backbone_files_unchanged"]
    assert mle.file_digests(base_dir) == before and info["backbone_tensors"] > 0
    adapter = tmp_path / "expert" / mle.ADAPTER_DIR
    conf = json.loads((adapter / "adapter_config.json").read_text())
    assert conf["r"] == 2 and sorted(conf["target_modules"]) == ["q_proj", "v_proj"]
    weights = load_file(str(adapter / "adapter_model.safetensors"))
    assert weights and all("lora_" in k for k in weights)
    # the cold start moved lora_B off its zero init: the adapter is trained, the backbone is not
    assert any(v.abs().sum() > 0 for k, v in weights.items() if "lora_B" in k)
    # with the adapter attached (and a second one), every backbone tensor still equals the file's
    model, _ = mle.load_routed_model(base_dir, {"search": adapter, "other": adapter})
    assert mle.backbone_tensors_equal(model, base_dir)["equal"]


@pytest.mark.parametrize("profile", ["smoke", "mini", "paper"])
def test_experts_are_lora_rl_unless_a_cold_start_is_asked_for(profile):
    """The study's experts are LoRA-RL: no expert has a cold start by default (the setting's default, and every
    profile's); mle.cold_start gives one to the domains whose stage has one."""
    from acl_lib.config import MLEConfig

    assert MLEConfig().cold_start is False
    cfg = load_config(profile, seed=0)
    assert cfg.mle.cold_start is False
    assert not any(mle.expert_cold_start(cfg, d) for d in cfg.pipeline.curriculum)
    assert not any(mle.expert_run(cfg, mle.MLESpec(), d).extra["cold_start"] for d in cfg.pipeline.curriculum)
    on = load_config(profile, ["mle.cold_start=true"], seed=0)
    assert [d for d in on.pipeline.curriculum if mle.expert_cold_start(on, d)] == \
        [d for d in on.pipeline.curriculum if on.pipeline.cold_start.get(d)]


def _expert_cfg(tmp_path, **extra):
    return tiny_cfg(tmp_path, **{"grpo.max_turns": 3, "sft.max_length": 4096, "model.max_position_embeddings": 4096,
                                 "grpo.max_completion_length": 32, "mle.num_demos": 4, "mle.sft_max_steps": 2,
                                 "mle.grpo_max_steps": 2, "mle.rank": 2, "mle.target_modules": ["q_proj", "v_proj"],
                                 "mle.cold_start": True, **extra})


@pytest.mark.slow
def test_an_interrupted_expert_resumes_without_redoing_finished_work(base_dir, tmp_path):
    """A crash after the cold start and one GRPO step: the restart keeps the cold start (no SFT step re-run) and
    continues GRPO from its checkpoint (one more step logged, not two)."""
    import shutil

    cfg = _expert_cfg(tmp_path)
    out = tmp_path / "expert"
    mle.train_expert(cfg, "search", base_dir, out)
    sft_dir, grpo_dir = out / mle.SFT_SUBDIR, out / mle.GRPO_SUBDIR
    sft_model = (sft_dir / "model" / "adapter_model.safetensors").read_bytes()
    sft_log = (sft_dir / "train_log.jsonl").read_text()
    steps = lambda: [r["step"] for r in read_log(grpo_dir / "train_log.jsonl") if "loss" in r]  # noqa: E731
    assert steps() == [1, 2]
    # the state a crash during GRPO's second step leaves: checkpoint-1, no final model, no adapter
    shutil.rmtree(grpo_dir / "model")
    shutil.rmtree(grpo_dir / "checkpoints" / "checkpoint-2")
    shutil.rmtree(out / mle.ADAPTER_DIR)
    (grpo_dir / "train_summary.json").unlink()
    info = mle.train_expert(cfg, "search", base_dir, out)
    assert (sft_dir / "model" / "adapter_model.safetensors").read_bytes() == sft_model  # not retrained
    assert (sft_dir / "train_log.jsonl").read_text() == sft_log
    assert steps() == [1, 2, 2]  # the first run's two steps, then the resumed run's step 2 only
    assert info["backbone_unchanged_in_memory"] and (out / mle.ADAPTER_DIR / "adapter_model.safetensors").is_file()


@pytest.mark.rehearsal
@pytest.mark.timeout(900)
def test_expert_trains_as_two_process_deepspeed_jobs(base_dir, tmp_path):
    """Both phases of an expert through the launcher's ``multi_process`` mode (2 DeepSpeed workers, ZeRO-2 on
    the CPU accelerator): the adapter lands in the run, the backbone's files are unchanged."""
    cfg = _expert_cfg(tmp_path, **{"launcher.mode": "multi_process", "launcher.num_processes": 2,
                                   "torch_threads": 2, "sft.batch_size": 2, "grpo.batch_size": 4,
                                   "grpo.num_generations": 2})
    before = mle.file_digests(base_dir)
    info = mle.train_expert(cfg, "search", base_dir, tmp_path / "expert")
    for sub in (mle.SFT_SUBDIR, mle.GRPO_SUBDIR):
        summary = json.loads((tmp_path / "expert" / sub / "train_summary.json").read_text())
        assert summary["world_size"] == 2 and summary["deepspeed_zero_stage"] == 2, summary
        assert (tmp_path / "expert" / sub / "launch" / "job.log").is_file()
    assert info["backbone_files_unchanged"] and info["backbone_unchanged_in_memory"]
    assert mle.file_digests(base_dir) == before


# --- routers -----------------------------------------------------------------------------------------------


class _Guarded:
    """A task whose label fields raise when read: only ``tools`` and the opening messages are there."""

    def __init__(self, task):
        self._t = task

    tools = property(lambda self: self._t.tools)

    def initial_messages(self):
        return self._t.initial_messages()

    def __getattr__(self, name):
        raise AssertionError(f"a router read the label field {name!r}")


def test_context_router_reads_no_label_field(smoke_cfg):
    router = mle.ContextRouter(smoke_cfg.mle.fallback)
    tasks = mle.benchmark_tasks(smoke_cfg)
    junk = {"id": "x-0", "benchmark": "gpqa", "answer": {"gold": "ecom"}, "meta": {"domain": "math"}, "domain": "mock"}
    for key, ts in tasks.items():
        assert ts, key
        for t in ts:
            scrambled = replace(t, **junk)
            got = router.route_task(t)
            assert router.route_task(scrambled) == got == router.route_task(_Guarded(t))
            # the rule sends every benchmark to the expert of the domain it measures
            assert got == BENCHMARKS[key].domain, (key, got)
    # the ambiguous contexts still get a choice, from what is left
    retail = tasks["retail"][0]
    assert router.route_task(replace(retail, tools=[])) == "ecom"  # the desk's system prompt
    assert router.route_task(replace(retail, system_prompt="")) == "ecom"  # its tool schemas
    assert router.route_task(replace(retail, tools=[], system_prompt="")) == smoke_cfg.mle.fallback


def test_learned_router_is_held_out_on_contexts_it_never_trained_on(smoke_cfg):
    train, held = mle.router_contexts(smoke_cfg, 12, 6)
    assert held and train
    assert not {i for i, _, _ in train} & {i for i, _, _ in held}
    assert not {c.text() for _, c, _ in train} & {c.text() for _, c, _ in held}
    router = mle.LearnedRouter(smoke_cfg.pipeline.curriculum, 512)
    losses = router.fit([c for _, c, _ in train], [d for _, _, d in train], steps=60, seed=0)
    assert losses[-1] < losses[0]
    assert mle.accuracy(router, train) == 1.0
    assert 0.0 <= mle.accuracy(router, held) <= 1.0
    # saved and loaded: the same choices
    again = mle.LearnedRouter.load(router.save(Path(smoke_cfg.output_dir).parent / "r.pt"))
    assert again.predict([c for _, c, _ in held]) == router.predict([c for _, c, _ in held])


# --- serving -----------------------------------------------------------------------------------------------


class _ByUser(mle.Router):
    """Routes on the first user turn's text (a stand-in for the real rules; reads the context only)."""

    def __init__(self, table):
        self.table = table

    def route(self, context):
        return self.table(context.user)


def test_mixed_batch_equals_each_adapter_alone_token_for_token(base_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    adapters = _adapters(base_dir, tmp_path)
    model, tok = mle.load_routed_model(base_dir, adapters)
    tok.padding_side = "left"
    # one forward per step for a mixed batch (PEFT adapter_names) equals each adapter on its own rows
    prompts = ["Where is Paris?", "Tell me a story", "lookup Rome", "add 2 and 3"]
    names = ["a", "b", mle.BASE_ADAPTER, "a"]
    enc = tok(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        mixed = model.generate(**enc, max_new_tokens=6, do_sample=False, adapter_names=names,
                               pad_token_id=tok.pad_token_id)
        for i, n in enumerate(names):
            alone = model.generate(**enc, max_new_tokens=6, do_sample=False, adapter_names=[n] * len(prompts),
                                   pad_token_id=tok.pad_token_id)
            assert torch.equal(mixed[i], alone[i])
        logits = {n: model(**enc, adapter_names=[n] * len(prompts)).logits for n in ("a", "b", mle.BASE_ADAPTER)}
    assert not torch.allclose(logits["a"], logits["b"])  # the experts differ: the equality above means something
    plain = AutoModelForCausalLM.from_pretrained(str(base_dir)).eval()
    with torch.no_grad():
        ref = plain.generate(**enc, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    assert torch.equal(mixed[2], ref[2])  # __base__ is the backbone itself

    # the evaluator's multi-turn loop (per-episode KV caches, the shared first prefix) with a mixed batch
    env = DeskEnv()
    # distinct openings (the router's input) after a system prompt long enough to be encoded once per expert
    tasks = [replace(t, system_prompt="You run a desk of city facts. " * 8, user_prompt=f"{t.user_prompt} Case {i}.")
             for i, t in enumerate(env.tasks("train", 6, seed=3))]
    pick = {t.user_prompt: ("a", "b")[i % 2] for i, t in enumerate(tasks)}

    def transcripts(router, only=None):
        policy = mle.MLEPolicy(base_dir, {k: v for k, v in adapters.items() if only in (None, k)}, router,
                               max_new_tokens=8, batch_size=8)
        eps = [env.start(t, max_turns=3) for t in tasks if only is None or pick[t.user_prompt] == only]
        run_episodes(policy, eps, batch_size=6)
        return {ep.task.user_prompt: ep.messages for ep in eps}, policy

    together, policy = transcripts(_ByUser(lambda u: pick[u]))
    assert sorted(d for d, how in policy.route_log) == sorted(pick.values())  # once per episode
    assert any(n == len(tasks) for n, _, _ in policy.gen.stats["calls"])  # one generate for the mixed batch
    for n in ("a", "b"):
        alone, _ = transcripts(_ByUser(lambda u: n), only=n)
        assert alone and all(together[u] == m for u, m in alone.items())


def test_vllm_multi_lora_requests_are_rendered_without_vllm(base_dir, tmp_path):
    adapters = {"search": tmp_path / "s", "ecom": tmp_path / "e"}
    calls = []

    class Out:
        def __init__(self, ids):
            self.outputs = [type("O", (), {"token_ids": ids})()]

    class LLM:
        def generate(self, prompts, params, lora_request=None, use_tqdm=False):
            calls.append((prompts, params, lora_request))
            return [Out([5, 6]) for _ in prompts]

    router = mle.ContextRouter("if")
    pol = mle.VLLMMLEPolicy(base_dir, adapters, router, max_new_tokens=4, max_model_len=4096, max_rank=8,
                            llm=LLM(), sampling_params=lambda **kw: kw)
    assert pol.engine_args["enable_lora"] is True and pol.engine_args["max_loras"] == 2
    assert pol.engine_args["max_lora_rank"] == 8 and pol.engine_args["model"] == str(base_dir)
    search = Task(id="1", domain="search", benchmark="nq", system_prompt="", user_prompt="q?",
                  tools=[{"type": "function", "function": {"name": "search", "parameters": {}}}])
    desk = replace(search, id="2", tools=[{"type": "function", "function": {"name": "get_order_details"}}])
    plain = replace(search, id="3", tools=[])
    batch = [(t, t.initial_messages()) for t in (search, desk, plain)]
    out = pol(batch)
    assert len(out) == 3 and all(isinstance(o, str) for o in out)
    prompts, params, loras = calls[0]
    assert [list(p) for p in prompts] == [["prompt_token_ids"]] * 3
    assert params["max_tokens"] == 4 and params["temperature"] == 0.0
    assert [(r.lora_name, r.lora_int_id, r.lora_path) for r in loras[:2]] == [("search", 1, str(adapters["search"])),
                                                                             ("ecom", 2, str(adapters["ecom"]))]
    assert loras[2] is None  # routed to an expert with no adapter here (if): the backbone
    # decided once per episode: the same expert on the next turn
    pol(batch[:1])
    assert calls[1][2][0].lora_name == "search"


def test_switch_episode_changes_desk_and_keeps_one_message_list(smoke_cfg):
    search, retail = world(smoke_cfg, "search"), world(smoke_cfg, "retail")
    a = search.start(search.tasks("test", 1, seed=0)[0], max_turns=4)
    b = retail.start(retail.tasks("test", 1, seed=0)[0], max_turns=4)
    ep = mle.SwitchEpisode(a, b, k=1)
    msgs = ep.messages
    assert ep.task is a.task
    ep.step('<tool_call>\n{"name": "search", "arguments": {"query": "x"}}\n</tool_call>')
    assert ep.messages is msgs and ep.task is b.task and not ep.done
    assert msgs[0]["role"] == "system" and msgs[0]["content"] == b.task.system_prompt
    assert any(m["role"] == "tool" for m in msgs)  # the search turn is still in the conversation
    router = mle.ContextRouter("if")
    assert router.route_task(ep.task, msgs) == "ecom" != router.route_task(a.task, a.messages)  # the new desk


# --- an evaluation that another router would repeat -------------------------------------------------------------


def test_an_mle_evaluation_whose_routes_another_router_repeats_is_copied(tmp_path, monkeypatch):
    """``mle_learned`` is evaluated by copying ``mle``'s evaluation when the learned router makes every routing
    decision the context router recorded there (then both policies generate the same tokens); one decision it
    would make differently and it is evaluated itself."""
    cfg = load_config("smoke", [f"output_dir={tmp_path / 'outputs'}"], seed=0)
    done = lambda r: None  # noqa: E731  the runs the evaluation depends on, complete without training
    for run in [mle.start_run(cfg, "sdft_base"), mle.router_run(cfg)] + \
            [mle.expert_run(cfg, mle.MLESpec(), d) for d in cfg.pipeline.curriculum]:
        run_once(run, done)
    ctx, learned_spec = mle.MLESpec("mle"), mle.MLESpec("mle_learned", router="learned")
    contexts = [mle.Context.of(t) for ts in mle.benchmark_tasks(cfg).values() for t in ts]
    learned = mle.LearnedRouter(cfg.pipeline.curriculum, 64)  # untrained: one class everywhere, unlike the rule
    learned.save(mle.router_run(cfg).path / mle.ROUTER_FILE)
    for spec in (ctx, learned_spec):
        run_once(mle.mle_run(cfg, spec), lambda r, spec=spec: r.write_json(mle.MLE_JSON, {
            "name": spec.name, "start": spec.start, "router": spec.router, "rank": cfg.mle.rank}))

    def evaluated(decisions):
        ev = Run(cfg, f"mle/{pipeline.EVAL_DIR}", sections=pipeline.EVAL_SECTIONS, inputs=[mle.mle_run(cfg, ctx)])

        def fn(r):
            r.write_json("metrics.json", {"scores": {"aime26": 12.5}, "model": "mle"})
            (r.path / "records").mkdir()
            (r.path / "records" / "aime26.jsonl").write_text("{}\n")
            r.write_json(mle.ROUTES_JSON, {"episodes_per_expert": {}, "decisions": mle.decisions_json(decisions)})

        run_once(ev, fn)
        return ev

    same = [(c, learned.route(c)) for c in contexts]
    blob = mle.decisions_json(same)
    assert len(blob["strings"]) < 3 * len(same)  # system prompts and tool lists stored once
    assert mle.decisions_from_json(json.loads(json.dumps(blob))) == same
    differ = same[:-1] + [(same[-1][0], next(d for d in cfg.pipeline.curriculum if d != same[-1][1]))]

    evaluated(differ)
    assert mle.eval_twin(cfg, learned_spec) is None  # the last episode would go to another expert
    import shutil

    shutil.rmtree(mle.mle_run(cfg, ctx).path / pipeline.EVAL_DIR)
    evaluated(same)
    assert mle.eval_twin(cfg, learned_spec).name == f"mle/{pipeline.EVAL_DIR}"
    assert mle.eval_twin(cfg, mle.MLESpec("mle_r4", rank=4)) is None  # other experts: never a twin

    serving = mle.serving  # where run_mle looks both up
    monkeypatch.setattr(serving, "make_mle_policy", lambda *a, **k: pytest.fail("a twin's evaluation must be copied"))
    monkeypatch.setattr(serving, "backbone_check", lambda *a, **k: pytest.fail("mle_learned is complete already"))
    mle.run_mle(cfg, learned_spec)
    out = mle.mle_run(cfg, learned_spec).path / pipeline.EVAL_DIR
    assert json.loads((out / "metrics.json").read_text()) == {"scores": {"aime26": 12.5}, "model": "mle_learned"}
    assert json.loads((out / "same_as.json").read_text())["run"] == f"mle/{pipeline.EVAL_DIR}"
    assert (out / "records" / "aime26.jsonl").is_file() and (out / mle.ROUTES_JSON).is_file()


# --- scoring in a child process -----------------------------------------------------------------------------


def _scored_mle(base_dir, made: dict, store, **overrides) -> Path:
    """MLE of the smoke profile scored into ``store`` (``overrides`` on top), its backbone and experts complete
    without training (the adapters ``made`` and their records): its evaluation directory."""
    import shutil

    cfg = load_config("smoke", {"output_dir": str(store), "torch_threads": 1, "worlds.n_test": 2, "worlds.n_ood": 1,
                                **overrides})
    spec = mle.MLESpec()
    run_once(mle.start_run(cfg, spec.start), lambda r: shutil.copytree(base_dir, r.path / "model"))
    digests = mle.file_digests(pipeline.model_dir(mle.start_run(cfg, spec.start)))
    for d in cfg.pipeline.curriculum:
        def expert(r, d=d):
            shutil.copytree(made[d], r.path / mle.ADAPTER_DIR)
            r.write_json(mle.EXPERT_JSON, {"backbone_files_before": digests, "backbone_files_after": digests,
                                           "backbone_unchanged_in_memory": True})
        run_once(mle.expert_run(cfg, spec, d), expert)
    mle.run_mle(cfg, spec)
    return mle.mle_run(cfg, spec).path / pipeline.EVAL_DIR


def _same_records(here: Path, there: Path) -> None:
    files = sorted(p.name for p in (here / "records").iterdir())
    assert files and files == sorted(p.name for p in (there / "records").iterdir())
    for name in files:
        assert (there / "records" / name).read_text() == (here / "records" / name).read_text(), name


@pytest.mark.slow
def test_mle_scored_in_a_child_process_equals_scored_in_process(base_dir, tmp_path, monkeypatch):
    """``launcher.eval_subprocess`` (the paper profile's switch) makes ``run_mle`` score the MLE system in a process
    of its own: the same scores, records and routing decisions as scoring it in the notebook's process."""
    from acl_lib import processes
    from acl_lib.consolidate.mle import serving

    smoke = load_config("smoke")
    made = _adapters(base_dir, tmp_path / "adapters", names=tuple(smoke.pipeline.curriculum), rank=smoke.mle.rank)
    children = []
    monkeypatch.setattr(serving, "call_in_child",
                        lambda fn, *a, **k: children.append(fn.__name__) or processes.call_in_child(fn, *a, **k))
    here = _scored_mle(base_dir, made, tmp_path / "store_here")
    assert children == []
    there = _scored_mle(base_dir, made, tmp_path / "store_child", **{"launcher.eval_subprocess": True})
    assert children == ["score_mle"]
    read = lambda p: json.loads(p.read_text())  # noqa: E731
    assert read(there / "metrics.json")["scores"] == read(here / "metrics.json")["scores"]
    assert read(there / mle.ROUTES_JSON) == read(here / mle.ROUTES_JSON)
    assert len(read(here / mle.ROUTES_JSON)["episodes_per_expert"]) > 1  # more than one expert served
    _same_records(here, there)


@pytest.mark.slow
def test_mle_scored_over_two_processes_equals_one(base_dir, tmp_path):
    """``eval.shards`` 2: each process builds the MLE system (``serving.shard_policy``, named to the sharded
    evaluation's children), scores every other task and writes its routes; the merged evaluation has one
    process's scores and records, and the routes count the same episodes per expert."""
    smoke = load_config("smoke")
    made = _adapters(base_dir, tmp_path / "adapters", names=tuple(smoke.pipeline.curriculum), rank=smoke.mle.rank)
    one = _scored_mle(base_dir, made, tmp_path / "one")
    two = _scored_mle(base_dir, made, tmp_path / "two", **{"eval.shards": 2})
    read = lambda p: json.loads(p.read_text())  # noqa: E731
    assert read(two / "metrics.json")["scores"] == read(one / "metrics.json")["scores"]
    assert read(two / "metrics.json")["shards"] == 2 and (two / "shards" / "1" / mle.ROUTES_JSON).is_file()
    assert read(two / mle.ROUTES_JSON)["episodes_per_expert"] == read(one / mle.ROUTES_JSON)["episodes_per_expert"]
    _same_records(one, two)
