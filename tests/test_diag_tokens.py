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
SEARCH_TOOL = {"type": "function", "function": {
    "name": "search", "description": "Search the corpus.",
    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
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
    models = {"ref": str(MINI_BASE), "same": _copy(tmp, "same"),
              "perturbed": _copy(tmp, "perturbed", noise=0.5, seed=1)}
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


def test_consistency_is_against_the_rollouts_own_token(scored):
    """A checkpoint identical to the reference agrees with it everywhere, so it is exactly as consistent with the
    rollout as the reference itself (these episodes are hand-written: the reference did not write every token); a
    perturbed one is less. Every count is what it says."""
    thr = float(np.quantile(scored.ref_entropy, 0.8))
    summary = T.consistency_summary(scored, threshold=thr)
    same, pert = summary["checkpoints"]["same"], summary["checkpoints"]["perturbed"]
    own = summary["reference_consistency"]
    assert summary["consistency_against"] == "rollout token" and summary["threshold_rule"] == "fixed (nats)"
    assert (scored.top1["same"] == scored.ref_top1).all()
    assert same["consistency"] == own["consistency"] == summary["reference_self_consistency"]
    assert same["consistency"] == pytest.approx(float((scored.ref_top1 == scored.token).mean()))
    assert same["consistency"] < 1.0  # hand-written text: the reference does not rank every one of its tokens first
    assert same["changed_positions"] == int((scored.ref_top1 != scored.token).sum())

    changed = scored.top1["perturbed"] != scored.token
    high = scored.ref_entropy > thr
    assert pert["consistency"] < same["consistency"] and pert["changed_positions"] == int(changed.sum())
    assert pert["changed_share_in_high_entropy"] == pytest.approx((changed & high).sum() / changed.sum())
    assert pert["low_entropy_stable"] == pytest.approx(1 - (changed & ~high).sum() / (~high).sum())
    assert pert["high_entropy_consistency"] == pytest.approx(1 - (changed & high).sum() / high.sum())
    assert summary["high_entropy_positions"] == int(high.sum())
    assert summary["low_entropy_positions"] == int((~high).sum())
    assert summary["high_entropy_fraction"] == pytest.approx(high.mean())
    assert set(pert["by_benchmark"]) == {"aime26", "nq", "ifeval"}
    per = pert["per_episode"]  # per reference episode, summing to the totals
    assert len(per["low"]) == len(scored.benchmarks) > 1 and sum(per["low"]) == summary["low_entropy_positions"]
    assert sum(per["changed"]) == pert["changed_positions"] and sum(per["changed_high"]) == int((changed & high).sum())
    assert per["low_stable"][0] == int((~changed & ~high & (scored.episode == 0)).sum())
    frame = T.summary_frame(summary, {"low_entropy_positions_stable_fraction": 0.94,
                                      "high_entropy_positions_fraction": 0.06})
    assert list(frame.index) == ["ref (reference)", "same", "perturbed", "study"]
    assert frame.loc["study", "positions above threshold %"] == pytest.approx(6.0)
    assert frame.loc["same", "positions above threshold %"] == pytest.approx(100 * high.mean())


def test_a_position_the_reference_sampled_counts_against_the_rollouts_token():
    """Four positions; at the last the rollout's token (7) is not the reference's top-1 (9), as when the
    reference samples. A checkpoint that keeps the reference's top-1 there still no longer ranks the rollout's token
    first: consistency 3/4, not 1 (the earlier definition, against the reference's top-1, said 1)."""
    scores = T.TokenScores(reference="ref", benchmarks=["aime26"], ids=[[1, 2, 3, 4, 7]],
                           episode=np.zeros(4, dtype=np.int64), pos=np.arange(1, 5), token=np.array([2, 3, 4, 7]),
                           ref_entropy=np.array([0.1, 0.2, 0.3, 2.5]), ref_top1=np.array([2, 3, 4, 9]),
                           top1={"later": np.array([2, 3, 4, 9]), "other": np.array([2, 5, 4, 7])})
    summary = T.consistency_summary(scores, threshold=1.0)
    later, other = summary["checkpoints"]["later"], summary["checkpoints"]["other"]
    assert summary["high_entropy_fraction"] == 0.25 and summary["reference_self_consistency"] == 0.75
    assert later["consistency"] == 0.75 and later["low_entropy_stable"] == 1.0
    assert later["high_entropy_consistency"] == 0.0 and later["changed_share_in_high_entropy"] == 1.0
    assert other["consistency"] == 0.75 and other["low_entropy_stable"] == pytest.approx(2 / 3)
    assert other["changed_share_in_high_entropy"] == 0.0
    # the counts per reference episode that cluster F3's standard errors (one episode here)
    assert later["per_episode"] == {"low": [3], "low_stable": [3], "changed": [1], "changed_high": [1]}
    assert other["per_episode"] == {"low": [3], "low_stable": [2], "changed": [1], "changed_high": [0]}


def test_fixed_thresholds_and_deciles(scored):
    from acl_lib.config import available_profiles, load_config

    profiles = available_profiles()
    thresholds = {load_config(p).diagnostics.entropy_threshold for p in profiles}
    assert len(profiles) >= 3 and thresholds == {1.0}  # one value for every profile, in the config
    fixed = T.consistency_summary(scored, threshold=1e9)
    assert fixed["entropy_threshold"] == 1e9 and fixed["high_entropy_positions"] == 0
    assert fixed["high_entropy_fraction"] == 0.0
    assert fixed["checkpoints"]["perturbed"]["high_entropy_consistency"] is None
    everything = T.consistency_summary(scored, threshold=0.0)
    assert everything["high_entropy_fraction"] == pytest.approx(float((scored.ref_entropy > 0).mean()))
    d = T.deciles(np.array([0.0] * 15 + [1.0] * 5))  # ties still make equal-count buckets
    assert np.bincount(d).tolist() == [2] * 10
    with pytest.raises(ValueError, match="threshold"):
        T.consistency_summary(scored, threshold=-1.0)


def test_the_reading_measures_and_leaves_the_verdict_to_the_rules(scored):
    from acl_lib.diagnostics import figures

    summary = T.consistency_summary(scored, threshold=float(np.quantile(scored.ref_entropy, 0.8)))
    summary["episodes"] = len(EPISODES)
    study = {"low_entropy_positions_stable_fraction": 0.94, "high_entropy_positions_fraction": 0.06}
    text = figures.tokens_reading(summary, study, "smoke", 0)
    assert "the study: ~6% high-entropy positions" in text and "(study 94%)" in text
    assert "rank the rollout's token first" in text
    assert "as in the study" not in text and "F3" not in text and "reproduced" not in text


def test_examples_and_saved_arrays(scored, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MINI_BASE)
    ex = T.changed_examples(scored, tok, "perturbed", n=2)
    assert 1 <= len(ex) <= 2 and ex[0]["rollout_token"] != ex[0]["checkpoint_top1"]
    assert "| benchmark |" in T.examples_markdown(ex)
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
