"""GRPO's log-probabilities with each prompt encoded once (acl_lib/train/shared_prompt.py) against TRL's own fused
head on the same batch: the same per-token log-probabilities and entropies, and the same gradient of a GRPO-style
loss, up to floating point."""

from __future__ import annotations

import copy

import pytest
import torch


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    from acl_lib.config import load_config
    from acl_lib.model.shipped import shipped_dir

    return AutoModelForCausalLM.from_pretrained(shipped_dir(load_config("mini")))


def _batch(groups=3, generations=4, seed=0):
    """TRL's layout: left-padded prompts (one per group, repeated), right-padded completions."""
    g = torch.Generator().manual_seed(seed)
    P, C = 30, 12
    ids, mask = [], []
    for i in range(groups):
        n = 10 + 7 * i
        prompt = [0] * (P - n) + torch.randint(5, 2000, (n,), generator=g).tolist()
        pm = [0] * (P - n) + [1] * n
        for _ in range(generations):
            c = int(torch.randint(3, C + 1, (1,), generator=g))
            comp = torch.randint(5, 2000, (c,), generator=g).tolist() + [0] * (C - c)
            ids.append(prompt + comp)
            mask.append(pm + [1] * c + [0] * (C - c))
    return torch.tensor(ids), torch.tensor(mask), C


def _trl(model, ids, mask, keep, temperature):
    from trl.trainer.utils import add_fused_lm_head

    m = copy.deepcopy(model)
    add_fused_lm_head(m, temperature=temperature, outputs=("log_probs", "entropy"))
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    out = m(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return m, out.log_probs[:, -keep:], out.entropy[:, -keep:]


def test_shared_prompt_log_probabilities_and_gradient_equal_trls(model):
    from acl_lib.train.shared_prompt import _backbone_and_head, shared_prompt_logps

    ids, mask, keep = _batch()
    temperature = 0.7
    ref_model, ref_lp, ref_ent = _trl(model, ids, mask, keep, temperature)
    ours_model = copy.deepcopy(model)
    backbone, head = _backbone_and_head(ours_model)
    lp, ent = shared_prompt_logps(backbone, head, ids, mask, keep, temperature, compute_entropy=True)
    assert lp.shape == ref_lp.shape == (12, keep)
    assert torch.allclose(lp, ref_lp, atol=2e-5, rtol=1e-5), (lp - ref_lp).abs().max()
    assert torch.allclose(ent, ref_ent, atol=2e-5, rtol=1e-5)
    assert torch.all(lp[mask[:, -keep:] == 0] == 0)
    # a GRPO-like loss: advantages per row, token mean over the completion mask
    adv = torch.linspace(-1, 1, ids.size(0))[:, None]
    cm = mask[:, -keep:].float()
    for logps in (ref_lp, lp):
        loss = -((torch.exp(logps - logps.detach()) * adv) * cm).sum() / cm.sum()
        loss.backward()
    for (name, a), (_, b) in zip(ref_model.named_parameters(), ours_model.named_parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6, rtol=1e-4), name
    # the prompts ran once per group: three prompt rows, not twelve
    calls = []
    hook = backbone.embed_tokens.register_forward_hook(lambda mod, inp, out: calls.append(tuple(inp[0].shape)))
    shared_prompt_logps(backbone, head, ids, mask, keep, temperature, compute_entropy=False)
    hook.remove()
    assert calls == [(3, 30), (12, keep)]


@pytest.mark.slow
@pytest.mark.parametrize("domain", ["math", "ecom"])
def test_a_grpo_step_with_shared_prompts_trains_as_trls_does(model, tmp_path, domain, monkeypatch):
    """Two GRPO steps through ``build_trainer`` (the shared-prompt trainer) and through TRL's own trainer on the
    same samples: the same losses and weights, up to floating point. Math is single-turn; the retail desk is
    multi-turn, its completions carrying tool observations that ``tool_mask`` leaves out of the loss, and runs
    DAPO without a KL term, so the rows of a group whose rewards are all equal are skipped too."""
    from trl import GRPOTrainer

    from acl_lib.config import load_config
    from acl_lib.model.shipped import shipped_dir
    from acl_lib.train import grpo, trl_env
    from acl_lib.train.shared_prompt import trainer_class

    sizes = (["grpo.batch_size=16", "grpo.max_completion_length=16"] if domain == "math" else
             ["grpo.batch_size=8", "grpo.temperature=0.7", "grpo.max_episode_tokens=1536"])
    cfg = load_config("mini", [f"output_dir={tmp_path}", "torch_threads=1", "grpo.max_steps=2",
                               "grpo.num_generations=4", *sizes])
    env = trl_env.make_env(domain, cfg)
    tasks = env.tasks("train", 8, seed=0)
    base = shipped_dir(cfg)
    if domain == "ecom":
        # The shipped base solves none of these retail tasks at this temperature: every advantage would be 0 and
        # both losses trivially 0. The rollouts stay the real multi-turn episodes; only the reward is a stand-in
        # with spread inside a group (the parity of the policy's characters over the episode).
        monkeypatch.setattr(trl_env.EpisodeEnv, "get_reward", lambda self: float(sum(
            len(m.get("content") or "") for m in self.episode.messages if m["role"] == "assistant") % 2))
    weights, losses, norms = {}, {}, {}
    for name in ("shared", "trl"):
        torch.manual_seed(0)
        trainer = grpo.build_trainer(cfg, base, env, tasks, tmp_path / name)
        if name == "trl":
            assert type(trainer) is trainer_class()
            trainer.__class__ = GRPOTrainer  # TRL's own log-probability passes, the same samples
        trainer.train()
        losses[name] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        norms[name] = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
        weights[name] = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    assert len(losses["trl"]) == 2
    assert any(loss != 0.0 for loss in losses["trl"]), "no step had a reward to learn from: the test compares nothing"
    assert losses["shared"] == pytest.approx(losses["trl"], abs=1e-5)
    assert norms["shared"] == pytest.approx(norms["trl"], rel=1e-4)
    # Adam moves a weight by at most about lr a step: the two runs stay within a quarter of two steps' move (a
    # gradient that differs in its last digits can flip Adam's sign where the gradient is near 0)
    bound = 0.25 * 2 * cfg.grpo.learning_rate
    for k, v in weights["trl"].items():
        assert torch.allclose(v, weights["shared"][k], atol=bound, rtol=0), k


def test_activation_checkpointing_takes_trls_path(model):
    """transformers drops the key-value cache under activation checkpointing, so the shortcut must not run there
    (the paper profile checkpoints activations): the trainer then takes TRL's own log-probability pass."""
    from acl_lib.train.shared_prompt import _checkpointing

    m = copy.deepcopy(model)
    assert not _checkpointing(m)
    m.gradient_checkpointing_enable()
    assert _checkpointing(m)
    from peft import LoraConfig, get_peft_model

    assert _checkpointing(get_peft_model(m, LoraConfig(r=2, target_modules=["q_proj"])))


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "bnpo", "dr_grpo"])
def test_rows_without_advantage_are_skipped_with_the_same_loss_and_gradient(tmp_path, loss_type):
    """A group whose rewards are all equal has advantage 0: its rows are left out of the loss's forward and
    backward, and the loss and gradient stay TRL's (the same normalisation); a micro-batch of such rows alone
    gives zero gradients, not none. With a KL term every row runs."""
    from trl import GRPOTrainer

    from acl_lib.config import load_config
    from acl_lib.model.shipped import shipped_dir
    from acl_lib.train import grpo, trl_env
    from acl_lib.train.shared_prompt import zero_advantage_rows

    cfg = load_config("mini", [f"output_dir={tmp_path}", "torch_threads=1", "grpo.max_steps=1",
                               f"grpo.loss_type={loss_type}"])
    env = trl_env.make_env("math", cfg)
    trainer = grpo.build_trainer(cfg, shipped_dir(cfg), env, env.tasks("train", 4, seed=0), tmp_path / "t")
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    ids, mask, keep = _batch(groups=3, generations=4)
    inputs = {"prompt_ids": ids[:, :-keep], "prompt_mask": mask[:, :-keep], "completion_ids": ids[:, -keep:],
              "completion_mask": mask[:, -keep:], "num_items_in_batch": mask[:, -keep:].sum()}
    params = [p for p in trainer.model.parameters() if p.requires_grad]

    def loss_and_grads(fn, advantages):
        trainer.model.zero_grad(set_to_none=True)
        loss = fn(trainer, trainer.model, dict(inputs, advantages=advantages))
        loss.backward()
        return loss.detach(), [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]

    skipped = trainer._metrics["train"]["zero_advantage_rows_skipped"]
    adv = torch.tensor([0.0] * 4 + [1.0, -0.5, 0.5, -0.25] + [0.0] * 4)  # groups 0 and 2 all-equal
    assert zero_advantage_rows(trainer, dict(inputs, advantages=adv)).tolist() == [4, 5, 6, 7]
    ref_loss, ref_grads = loss_and_grads(GRPOTrainer._compute_loss, adv)
    loss, grads = loss_and_grads(type(trainer)._compute_loss, adv)
    assert skipped[-1] == pytest.approx(2 / 3)
    assert float(ref_loss) != 0.0
    assert torch.allclose(loss, ref_loss, atol=1e-7, rtol=1e-5), (loss, ref_loss)
    for a, b in zip(ref_grads, grads):
        assert torch.allclose(a, b, atol=1e-7, rtol=1e-4)
    # no row with an advantage: a zero loss whose gradients are zeros
    loss, grads = loss_and_grads(type(trainer)._compute_loss, torch.zeros(12))
    assert float(loss) == 0.0 and skipped[-1] == 1.0
    assert all(g is not None and not g.any() for g in grads)
    # a KL term makes every row count
    trainer.beta = 0.1
    assert zero_advantage_rows(trainer, dict(inputs, advantages=adv)) is None
