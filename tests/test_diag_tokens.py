"""Token diagnostics: teacher forcing over assistant tokens only; an identical checkpoint is 100% consistent,
a perturbed one is not; the summaries count what they say."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from acl_lib.diagnostics import tokens as T

MINI_BASE = Path(__file__).resolve().parents[1] / "acl_lib" / "data" / "mini_base"
SEARCH_TOOL = {"type": "function", "function": {"name": "search", "description": "Search the corpus.",
                                                "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                                                               "required": ["query"]}}}
TOOL_TEXT = "Dibriand is a town in Norland, founded in 1821."
EPISODES = [
    {"benchmark": "aime26", "id": "m1", "tools": [], "messages": [
        {"role": "user", "content": "What is 12 + 30? End with a line 'Answer: <value>'."},
        {"role": "assistant", "content": "12 + 30 = 42\nAnswer: 42"}]},
    {"benchmark": "nq", "id": "s1", "tools": [SEARCH_TOOL], "messages": [
        {"role": "system", "content": "You answer questions with the help of a search engine."},
        {"role": "user", "content": "In which country is Dibriand located?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "search", "arguments": '{"query": "Dibriand"}'}}]},
        {"role": "tool", "name": "search", "content": TOOL_TEXT},
        {"role": "assistant", "content": "<answer>Norland</answer>"}]},
    {"benchmark": "ifeval", "id": "i1", "tools": [], "messages": [
        {"role": "user", "content": "Write two words in lowercase."},
        {"role": "assistant", "content": "hello world"}]},
]


def _copy(tmp_path, name, noise=0.0, seed=0):
    d = tmp_path / name
    shutil.copytree(MINI_BASE, d)
    if noise:
        g = torch.Generator().manual_seed(seed)
        sd = load_file(str(d / "model.safetensors"))
        save_file({k: (v + noise * v.std() * torch.randn(v.shape, generator=g)).contiguous() for k, v in sd.items()},
                  str(d / "model.safetensors"))
    return str(d)


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tok")
    models = {"ref": str(MINI_BASE), "same": _copy(tmp, "same"), "perturbed": _copy(tmp, "perturbed", noise=0.5, seed=1)}
    return T.score_reference(EPISODES, models, "ref", batch_size=2, progress=False)


def test_only_assistant_tokens_are_scored(scored):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MINI_BASE)
    text = {e: tok.decode([scored.ids[e][p] for p in scored.pos[scored.episode == e]]) for e in range(len(EPISODES))}
    assert "Answer: 42" in text[0] and "12 + 30" in text[0] and "What is" not in text[0]
    assert "<answer>Norland</answer>" in text[1] and "Dibriand" in text[1]  # the tool call's query is the model's
    assert TOOL_TEXT not in text[1] and "In which country" not in text[1] and "search engine" not in text[1]
    assert "hello world" in text[2] and "lowercase" not in text[2]
    assert scored.positions == scored.ref_entropy.size == scored.token.size
    assert (scored.ref_entropy >= 0).all() and np.isfinite(scored.ref_entropy).all()


def test_identical_checkpoint_is_fully_consistent_and_a_perturbed_one_is_not(scored):
    summary = T.consistency_summary(scored, high_entropy_share=0.2)
    same, pert = summary["checkpoints"]["same"], summary["checkpoints"]["perturbed"]
    assert same["consistency"] == 1.0 and same["changed_positions"] == 0 and same["low_entropy_stable"] == 1.0
    assert same["changed_share_in_high_entropy"] is None and all(v == 1.0 for v in same["by_decile"] if v is not None)
    assert pert["consistency"] < 0.9 and pert["changed_positions"] > 0
    changed = scored.top1["perturbed"] != scored.ref_top1
    assert pert["changed_positions"] == int(changed.sum())
    high = scored.ref_entropy > summary["entropy_threshold"]
    assert pert["changed_share_in_high_entropy"] == pytest.approx((changed & high).sum() / changed.sum())
    assert pert["low_entropy_stable"] == pytest.approx(1 - (changed & ~high).sum() / (~high).sum())
    assert summary["high_entropy_positions"] == int(high.sum())
    assert set(pert["by_benchmark"]) == {"aime26", "nq", "ifeval"}


def test_thresholds_and_deciles(scored):
    fixed = T.consistency_summary(scored, threshold=1e9)
    assert fixed["entropy_threshold"] == 1e9 and fixed["high_entropy_positions"] == 0
    assert fixed["checkpoints"]["perturbed"]["high_entropy_consistency"] is None
    share = T.consistency_summary(scored, high_entropy_share=0.1)
    assert share["high_entropy_fraction"] == pytest.approx(0.1, abs=1.5 / scored.positions + 1e-9)
    d = T.deciles(np.array([0.0] * 15 + [1.0] * 5))  # ties still make equal-count buckets
    assert np.bincount(d).tolist() == [2] * 10
    with pytest.raises(ValueError, match="high_entropy_share"):
        T.consistency_summary(scored, high_entropy_share=1.5)


def test_examples_and_saved_arrays(scored, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MINI_BASE)
    ex = T.changed_examples(scored, tok, "perturbed", n=2)
    assert 1 <= len(ex) <= 2 and ex[0]["reference_top1"] != ex[0]["checkpoint_top1"]
    assert "| benchmark |" in T.examples_markdown(ex) and T.changed_examples(scored, tok, "same") == []
    path = scored.save(tmp_path / "pos.npz")
    back = np.load(path)
    assert (back["top1__perturbed"] == scored.top1["perturbed"]).all() and back["ref_entropy"].size == scored.positions


def test_missing_reference_is_named():
    with pytest.raises(KeyError, match="reference checkpoint 'nope'"):
        T.score_reference(EPISODES, {"ref": str(MINI_BASE)}, "nope", progress=False)


def test_a_template_without_generation_spans_uses_trls_training_variant():
    """Qwen3-8B-Base ships Qwen3's own template, which has no {% generation %} spans: the assistant tokens come
    from TRL's training variant of it; a template TRL does not know is refused with a clear error."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_chat_template

    tok = AutoTokenizer.from_pretrained(MINI_BASE)
    tok.chat_template = qwen3_chat_template
    assert T.mask_template(tok) is not None
    ((ids, mask),) = T.encode_episodes(tok, EPISODES[1:2], 4096)
    text = tok.decode([i for i, m in zip(ids, mask) if m])
    assert "<answer>Norland</answer>" in text and TOOL_TEXT not in text and "In which country" not in text
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(ValueError, match="does not mark assistant turns"):
        T.encode_episodes(tok, EPISODES[:1], 4096)
