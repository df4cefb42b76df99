"""Multi-turn generation with per-episode KV caches (acl_lib/eval/turns.py): what it generates is what
re-encoding every prompt whole generates, and it encodes only what is new."""

from __future__ import annotations

import json

import pytest
import torch

from acl_lib.eval.turns import TurnGenerator, common_prefix


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([5] * 100 + [1], [5] * 100 + [2]) == 100
    assert common_prefix([1, 2], [1, 2, 3]) == 2


@pytest.fixture(scope="module")
def tiny_model():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, max_position_embeddings=1024, tie_word_embeddings=True)
    model = Qwen3ForCausalLM(cfg)
    model.eval()
    return model


def _turns(model, reuse: bool, eos: int, prompts, batch_size=3):
    """Three turns of six episodes; between turns each episode appends an observation to its prompt and what it
    generated, with the last two generated tokens re-written for even episodes (a template that re-renders a
    turn differently from what the model wrote)."""
    gen = TurnGenerator(model, pad_token_id=0, eos_token_id=eos, batch_size=batch_size, reuse=reuse)
    g = torch.Generator().manual_seed(1)
    convs = [list(p) for p in prompts]
    outs = []
    for turn in range(3):
        new = gen.generate([(k, c) for k, c in enumerate(convs)], max_new_tokens=12)
        outs.append(new)
        for k, ids in enumerate(new):
            body = [t for t in ids if t != eos]
            if k % 2 == 0 and len(body) >= 2:
                body = body[:-2] + [7, 8]
            obs = torch.randint(10, 250, (3 + 4 * k,), generator=g).tolist()
            convs[k] = convs[k] + body + [eos] + obs
        if turn == 1:
            gen.forget(5)  # an episode whose cache was dropped starts over, whole
    return outs, gen.stats


def test_cached_turns_generate_what_whole_prompts_generate(tiny_model):
    g = torch.Generator().manual_seed(0)
    system = torch.randint(10, 250, (40,), generator=g).tolist()  # a shared system prompt
    prompts = [system + torch.randint(10, 250, (5 + 7 * k,), generator=g).tolist() for k in range(6)]
    # an eos the model does write: the third token row 0 generates, so rows end at different steps
    probe = TurnGenerator(tiny_model, 0, 1, reuse=False).generate([(0, prompts[0])], max_new_tokens=6)[0]
    eos = probe[2]
    plain, plain_stats = _turns(tiny_model, False, eos, prompts)
    cached, stats = _turns(tiny_model, True, eos, prompts)
    assert cached == plain
    assert any(eos in ids and len(ids) < 12 for turn in cached for ids in turn)  # some rows stopped early
    assert plain_stats["encoded_tokens"] == plain_stats["prompt_tokens"]
    assert plain_stats["reencoded_tokens"] > 0.4 * plain_stats["prompt_tokens"]  # turns 2 and 3 repeat turn 1
    assert stats["prompt_tokens"] == plain_stats["prompt_tokens"]
    assert stats["encoded_tokens"] < 0.5 * stats["prompt_tokens"]
    # only the re-written tokens and the forgotten episode are encoded twice
    assert 0 < stats["reencoded_tokens"] < 0.1 * stats["encoded_tokens"] + 300


def test_sampled_turns_run_and_respect_the_budget(tiny_model):
    gen = TurnGenerator(tiny_model, 0, 1, batch_size=2)
    rows = [(k, list(range(10, 30 + k))) for k in range(3)]
    outs = gen.generate(rows, max_new_tokens=5, temperature=1.0, seeds=[1, 2, 3])
    assert all(1 <= len(o) <= 5 for o in outs)
    with pytest.raises(ValueError, match="empty prompt"):
        gen.generate([(9, [])], max_new_tokens=3)


@pytest.mark.slow
def test_greedy_transcripts_are_the_same_with_cached_turns_in_every_world(tmp_path):
    """The harness before (every prompt re-encoded whole) and after (per-episode caches), on the shipped mini
    base, in every world of the suite: the same transcripts, episode by episode."""
    from acl_lib.config import load_config
    from acl_lib.eval.harness import evaluate
    from acl_lib.eval.policies import HFPolicy
    from acl_lib.model.shipped import shipped_dir

    cfg = load_config("smoke", [f"output_dir={tmp_path}", "worlds.n_test=3", "worlds.n_ood=2", "eval.max_turns=4"])
    base = str(shipped_dir(load_config("mini")))
    runs = {}
    for reuse in (False, True):
        policy = HFPolicy(base, max_new_tokens=24, batch_size=4, reuse_kv=reuse)
        out = tmp_path / f"reuse{reuse}"
        evaluate(cfg, base, out, policy=policy)
        runs[reuse] = (out, policy.stats)
    keys = sorted(p.stem for p in (runs[True][0] / "records").glob("*.jsonl"))
    assert len(keys) == 11
    for key in keys:
        a, b = ((runs[r][0] / "records" / f"{key}.jsonl").read_text().splitlines() for r in (False, True))
        for x, y in zip(a, b, strict=True):
            assert json.loads(x)["messages"] == json.loads(y)["messages"], key
    plain, cached = runs[False][1], runs[True][1]
    assert cached["prompt_tokens"] == plain["prompt_tokens"]
    assert cached["encoded_tokens"] < 0.5 * plain["encoded_tokens"]
