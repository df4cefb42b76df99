"""MMOPD (notebook 08): the hybrid loss against a direct computation, routing, the tool mask on real multi-turn
rollouts, the distillation trainer on real worlds, and the memory plan the launcher renders."""

from __future__ import annotations

import json
import math

import pytest
import torch

from acl_lib.config import load_config
from acl_lib.consolidate import mmopd
from acl_lib.consolidate.mmopd import hybrid_kl, route
from acl_lib.envs import make_env, scripted_expert
from acl_lib.model import load_model_and_tokenizer
from acl_lib.model.checkpoint_files import checkpoint_parameter_count
from acl_lib.train import trl_env
from train_kit import tiny_cfg

torch.set_num_threads(1)


def _direct(student, teacher, mask, alpha, q, w):
    """The mixed KL written out position by position, with plain Python sums over the vocabulary."""
    total, n = 0.0, 0
    for b in range(student.shape[0]):
        for t in range(student.shape[1]):
            if not mask[b, t]:
                continue
            p = torch.softmax(student[b, t].double(), -1).tolist()
            r = torch.softmax(teacher[b, t].double(), -1).tolist()
            rev = sum(pi * (math.log(pi) - math.log(ri)) for pi, ri in zip(p, r))
            ent = -sum(ri * math.log(ri) for ri in r)
            fwd = 0.0
            if alpha is not None and ent > alpha:
                top = sorted(range(len(r)), key=lambda v: -r[v])[:q]
                z = sum(r[v] for v in top)
                fwd = sum((r[v] / z) * (math.log(r[v] / z) - math.log(p[v])) for v in top)
            total += rev + w * fwd
            n += 1
    return total / n


def _logits(seed, shape=(2, 5, 7), scale=2.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * scale


def test_hybrid_loss_is_reverse_kl_when_alpha_is_infinite():
    s, t = _logits(0), _logits(1)
    mask = torch.tensor([[1, 1, 0, 1, 1], [0, 1, 1, 1, 0]])
    loss, stats = hybrid_kl(s, t, mask, None, 3, 1.0)
    assert loss.item() == pytest.approx(_direct(s, t, mask, None, 3, 1.0), rel=1e-6)
    assert stats["high_entropy_share"] == 0.0 and stats["forward"] == 0.0
    assert loss.item() == pytest.approx(stats["reverse"], rel=1e-6)


@pytest.mark.parametrize("q,w", [(3, 1.0), (7, 0.5), (1, 2.0)])
def test_hybrid_loss_adds_the_top_q_forward_term_at_high_entropy_positions(q, w):
    s, t = _logits(2), _logits(3, scale=1.0)
    t[0, 1] *= 0.05  # a flat teacher: high entropy
    t[1, 2] *= 5.0  # a peaked one: low entropy
    mask = torch.ones(2, 5, dtype=torch.long)
    entropy = -(torch.softmax(t, -1) * torch.log_softmax(t, -1)).sum(-1)
    e = entropy.flatten().sort().values
    alpha = float(e[4] + e[5]) / 2  # half the positions above it, none near the threshold
    loss, stats = hybrid_kl(s, t, mask, alpha, q, w)
    assert loss.item() == pytest.approx(_direct(s, t, mask, alpha, q, w), rel=1e-6)
    rev, _ = hybrid_kl(s, t, mask, None, q, w)
    assert loss.item() > rev.item()  # the forward term is non-negative and present
    assert 0 < stats["high_entropy_share"] < 1
    assert entropy[0, 1] > alpha and entropy[1, 2] < alpha


def test_hybrid_loss_gradient_flows_to_the_student_only_at_masked_positions():
    s, t = _logits(4).requires_grad_(True), _logits(5)
    mask = torch.tensor([[1, 0, 1, 0, 0], [0, 0, 0, 1, 1]])
    loss, _ = hybrid_kl(s, t, mask, 0.0, 3, 1.0)
    loss.backward()
    per_pos = s.grad.abs().sum(-1)
    assert torch.all(per_pos[mask == 0] == 0) and torch.all(per_pos[mask == 1] > 0)


@pytest.mark.parametrize("chunk", [1, 3, 1000])
@pytest.mark.parametrize("alpha", [None, 0.0, 1.5])
def test_chunked_loss_from_hidden_states_equals_the_whole_logits_loss(chunk, alpha):
    """Issue 32 item 2: the trainer's divergence, projected chunk by chunk through the heads from hidden states,
    gives the loss, the statistics and the gradients (student hidden states and head) of the whole-logits one."""
    g = torch.Generator().manual_seed(11)
    B, T, H, V = 4, 6, 8, 40
    head_s = torch.nn.Linear(H, V, bias=False)
    heads_t = {"a": torch.nn.Linear(H, V, bias=False), "b": torch.nn.Linear(H, V, bias=False)}
    for m in (head_s, *heads_t.values()):
        with torch.no_grad():
            m.weight.copy_(torch.randn(V, H, generator=g))
    for m in heads_t.values():
        m.requires_grad_(False)
    hs = torch.randn(B, T, H, generator=g, requires_grad=True)
    ht = torch.randn(B, T, H, generator=g)
    rows = ["a", "b", "a", "b"]
    mask = torch.tensor([[1, 1, 0, 1, 1, 0], [0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1]])

    teacher_logits = torch.stack([heads_t[r](ht[i]) for i, r in enumerate(rows)])
    whole, whole_stats = hybrid_kl(head_s(hs), teacher_logits, mask, alpha, 3, 0.7)
    whole.backward()
    want_h, want_w = hs.grad.clone(), head_s.weight.grad.clone()
    hs.grad, head_s.weight.grad = None, None

    loss, stats = mmopd.chunked_hybrid_kl(hs, head_s, ht, heads_t, rows, mask, alpha, 3, 0.7, chunk)
    loss.backward()
    assert loss.item() == pytest.approx(whole.item(), rel=1e-5)
    assert stats == pytest.approx(whole_stats, rel=1e-5, abs=1e-7)
    assert torch.allclose(hs.grad, want_h, rtol=1e-4, atol=1e-6)
    assert torch.allclose(head_s.weight.grad, want_w, rtol=1e-4, atol=1e-6)
    assert torch.all(hs.grad[mask == 0] == 0)


def test_a_teachers_hidden_states_through_its_head_are_its_logits(base_dir):
    from acl_lib.consolidate.mmopd import TeacherPool

    for placement in ("resident", "offload"):
        pool = TeacherPool({"t": str(base_dir)}, torch.device("cpu"), placement)
        ids = torch.tensor([[5, 6, 7, 8, 9], [3, 4, 5, 6, 7]])
        am = torch.ones_like(ids)
        want = pool.logits("t", ids, am, 3)
        got = pool.head("t")(pool.hidden("t", ids, am, 3))
        assert torch.allclose(got, want, atol=1e-5)


def test_routing_sends_each_row_to_its_own_domain_teacher():
    domains = ["math", "retail", "math", "instruct", "search", "retail"]
    teacher_of = {"math": "seq_math", "search": "seq_search", "retail": "seq_ecom", "instruct": "seq_if"}
    groups = route(domains, teacher_of)
    assert groups == {"seq_math": [0, 2], "seq_ecom": [1, 5], "seq_if": [3], "seq_search": [4]}
    with pytest.raises(KeyError, match="domain 'retail'"):
        route(domains, {"math": "seq_math"})


def test_spec_rejects_prompts_without_a_teacher():
    with pytest.raises(ValueError, match="no teacher"):
        mmopd.DistillSpec("x", "seq_if", teachers={"math": "seq_math"}, mixture={"math": 1, "search": 1})


def test_prompts_per_domain_split_by_weight():
    assert mmopd.prompts_per_domain({"math": 1, "search": 1, "ecom": 1, "if": 1}, 8) == {
        "math": 2, "search": 2, "ecom": 2, "if": 2}
    c = mmopd.prompts_per_domain({"math": 3, "search": 1, "ecom": 0}, 8)
    assert c == {"math": 6, "search": 2} and sum(c.values()) == 8


def _perturbed(src, dst, seed, scale=0.05):
    model, tok = load_model_and_tokenizer(src)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    model.save_pretrained(dst)
    tok.save_pretrained(dst)
    return str(dst)


def test_env_tokens_carry_no_distillation_loss_on_a_real_retail_rollout(base_dir, tmp_path):
    """The scripted expert drives a real retail episode (tool results and the simulated customer's turns) through
    ``trl_env.rollout_episodes``; with a teacher that disagrees with the student everywhere, the loss gradient
    reaches the student's logits at the policy's tokens and nowhere in the environment's."""
    from train_kit import expert_policy

    model, tok = load_model_and_tokenizer(base_dir)
    teacher, _ = load_model_and_tokenizer(_perturbed(base_dir, tmp_path / "teacher", 1))
    env = make_env("retail", None, seed=0)
    ep = env.start(env.tasks("train", 1)[0], max_turns=12)
    (r,) = trl_env.rollout_episodes([ep], expert_policy(tok, scripted_expert("retail")), tok, 20000)
    assert ep.reward() == 1.0 and 0 in r.env_mask and 1 in r.env_mask
    ids = torch.tensor([r.prompt_ids + r.completion_ids])
    keep = len(r.completion_ids)
    s = model(input_ids=ids, logits_to_keep=keep + 1).logits[:, :-1]
    s.retain_grad()
    with torch.no_grad():
        t = teacher(input_ids=ids, logits_to_keep=keep + 1).logits[:, :-1]
    mask = torch.tensor([r.env_mask])
    loss, stats = hybrid_kl(s, t, mask, 0.0, 4, 1.0)
    loss.backward()
    per_pos = s.grad.abs().sum(-1)[0]
    env_pos = [i for i, m in enumerate(r.env_mask) if m == 0]
    pol_pos = [i for i, m in enumerate(r.env_mask) if m == 1]
    assert len(env_pos) > 50  # tool results and customer turns: most of the rollout
    assert torch.all(per_pos[env_pos] == 0) and torch.all(per_pos[pol_pos] > 0)
    assert stats["reverse"] > 0


@pytest.mark.slow
def test_mmopd_trainer_distils_on_real_worlds_and_routes_by_domain(base_dir, tmp_path, monkeypatch):
    """One optimizer step on a mixture of math (single-turn) and retail (multi-turn, tools and a simulated
    customer) prompts from the real worlds: each row is scored by its domain's teacher, the student moves."""
    cfg = tiny_cfg(tmp_path, **{"mmopd.max_steps": 1, "mmopd.batch_size": 4, "mmopd.n_prompts": 2,
                                "grpo.max_episode_tokens": 160, "grpo.max_new_tokens": 24})
    teachers = {"seq_math": _perturbed(base_dir, tmp_path / "tm", 1), "seq_ecom": _perturbed(base_dir, tmp_path / "te", 2)}
    seen: list[dict] = []
    real_route = mmopd.route

    def spy(domains, teacher_of):
        groups = real_route(domains, teacher_of)
        seen.append({"domains": list(domains), "groups": groups})
        return groups

    monkeypatch.setattr(mmopd.training, "route", spy)  # where the trainer looks it up
    out = tmp_path / "mmopd"
    summary = mmopd.train_mmopd(cfg, out, str(base_dir), teachers, {"math": "seq_math", "ecom": "seq_ecom"},
                                {"math": 1.0, "ecom": 1.0}, alpha=0.0)
    assert seen, "the loss never routed a batch"
    for s in seen:
        for teacher, rows in s["groups"].items():
            want = {"seq_math": "math", "seq_ecom": "retail"}[teacher]
            assert {s["domains"][i] for i in rows} == {want}
    assert {d for s in seen for d in s["domains"]} == {"math", "retail"}
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    step = next(r for r in log if "mmopd/reverse" in r)
    assert step["mmopd/reverse"] > 0 and step["mmopd/high_entropy_share"] > 0  # alpha 0: every position
    assert summary["job"] == "mmopd"
    moved = mmopd.movement(base_dir, out / "model")
    assert moved["update_norm"] > 0


def test_memory_plan_written_beside_the_job(tmp_path, base_dir):
    cfg = load_config("paper", overrides=["mmopd.teacher_placement=offload"])
    plan = mmopd.memory_plan(cfg, 8_190_000_000, 4)
    gpus = cfg.launcher.num_nodes * cfg.launcher.num_processes
    assert plan["gpus"] == gpus and plan["student_gib_per_gpu"] == pytest.approx(16 * 8.19e9 / gpus / 2**30)
    assert plan["teachers_gib_per_gpu"] == pytest.approx(2 * 8.19e9 / 2**30)  # one teacher at a time, whole
    assert plan["teachers_cpu_gib_per_node"] == pytest.approx(cfg.launcher.num_processes * 4 * 2 * 8.19e9 / 2**30)
    resident = mmopd.memory_plan(cfg.model_copy(update={"mmopd": cfg.mmopd.model_copy(
        update={"teacher_placement": "resident"})}), 8_190_000_000, 4)
    assert resident["teachers_gib_per_gpu"] == pytest.approx(4 * 2 * 8.19e9 / 2**30)  # whole on every rank
    # Qwen3-8B's vocabulary and width: the chunked divergence's float32 logits, and the offloaded teachers' heads
    full = mmopd.memory_plan(cfg, 8_190_000_000, 4, vocab_size=151_936, hidden_size=4096)
    chunk = cfg.mmopd.chunk_tokens
    assert full["divergence_gib_per_gpu"] == pytest.approx(mmopd.DIVERGENCE_COPIES * chunk * 151_936 * 4 / 2**30)
    assert full["teachers_gib_per_gpu"] == pytest.approx((8.19e9 + 3 * 151_936 * 4096) * 2 / 2**30)
    # ZeRO-3's gather buffers (the shipped config's 1e9 live parameters and the prefetch bucket, bf16) and the
    # colocated vLLM engine, awake through a multi-turn rollout (TRL's 0.3 of the GPU)
    assert full["zero3_gather_gib_per_gpu"] == pytest.approx(2 * (1e9 + 0.9 * 4096**2) / 2**30)
    assert cfg.grpo.use_vllm and full["vllm_gib_per_gpu"] == pytest.approx(0.3 * cfg.launcher.gpu_memory_gib)
    assert full["total_gib_per_gpu"] == pytest.approx(full["student_gib_per_gpu"] + full["teachers_gib_per_gpu"]
                                                      + full["divergence_gib_per_gpu"]
                                                      + full["zero3_gather_gib_per_gpu"] + full["vllm_gib_per_gpu"])
    # host memory per node: the offloaded teachers' copies and the student, loaded partitioned under ZeRO-3
    assert full["student_cpu_gib_per_node"] == pytest.approx(cfg.launcher.num_processes * 2 * 8.19e9 / gpus / 2**30)
    assert full["host_gib_per_node"] == pytest.approx(full["teachers_cpu_gib_per_node"]
                                                      + full["student_cpu_gib_per_node"])
    zero2 = mmopd.memory_plan(load_config("paper", ["launcher.zero_stage=2"]), 8_190_000_000, 4, 151_936, 4096)
    assert zero2["zero3_gather_gib_per_gpu"] == 0.0  # a whole copy per process instead:
    assert zero2["student_cpu_gib_per_node"] == pytest.approx(cfg.launcher.num_processes * 2 * 8.19e9 / 2**30)
    path = mmopd.write_memory_plan(cfg, tmp_path / "job", base_dir, 4)
    text = path.read_text()
    n = checkpoint_parameter_count(base_dir)
    assert json.loads((path.parent / "memory_plan.json").read_text())["n_params"] == n
    assert "| divergence, " in text and json.loads((path.parent / "memory_plan.json").read_text())[
        "divergence_gib_per_gpu"] > 0
    assert f"{gpus} GPUs" in text and "teachers offload" in text
    assert "| teachers in CPU memory per node (a copy per process) |" in text and "| host memory per node" in text


def test_run_specs_are_mmopd_and_the_ablations_the_config_turns_on():
    names = lambda overrides: [s.name for s in mmopd.run_specs(load_config("smoke", overrides))]  # noqa: E731
    off = ["ablations.mmopd_reverse_kl=false", "ablations.mmopd_single_teacher=false"]
    assert names(off) == ["mmopd"]
    assert names(["ablations.mmopd_reverse_kl=true", "ablations.mmopd_single_teacher=true"]) == [
        "mmopd", "mmopd_rkl", "mmopd_single"]
    rkl = mmopd.run_specs(load_config("smoke", ["ablations.mmopd_reverse_kl=true"]))[1]
    assert rkl.alpha is None


def test_distillation_skips_the_importance_sampling_forward_it_never_reads(tmp_path):
    """Under vLLM TRL runs a whole no-grad forward of the student every step for its importance-sampling
    correction (``vllm_importance_sampling_correction``, on by default); the distillation loss does not use it."""
    from acl_lib.train.grpo import grpo_args

    cfg = load_config("smoke", [f"output_dir={tmp_path}", "grpo.use_vllm=true"])
    dcfg = mmopd.distill_cfg(cfg)
    assert grpo_args(dcfg, tmp_path, multi_turn=True).vllm_importance_sampling_correction is True  # TRL's default
    args = mmopd.distill_args(dcfg, tmp_path, [1])
    assert args.use_vllm and args.vllm_importance_sampling_correction is False
