"""seed_everything makes Python, NumPy and torch draws repeatable."""

import random

import numpy as np
import pytest

from acl_lib.seeding import seed_everything


def _draws():
    import torch

    return random.random(), float(np.random.rand()), torch.rand(3).tolist(), torch.randint(0, 1000, (2,)).tolist()


def test_same_seed_same_draws_other_seed_other_draws():
    seed_everything(7)
    a = _draws()
    seed_everything(7)
    b = _draws()
    seed_everything(8)
    c = _draws()
    assert a == b
    assert all(x != y for x, y in zip(a, c))


def test_rejects_bad_seed():
    with pytest.raises(ValueError):
        seed_everything(-1)


def test_follow_thread_share_takes_up_the_number_the_scheduler_wrote(tmp_path, monkeypatch):
    import torch

    from acl_lib import seeding

    share = tmp_path / "0.threads"
    monkeypatch.setenv(seeding.THREADS_FILE_ENV, str(share))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert seeding.follow_thread_share(min_interval_s=0) is None  # no file yet: nothing changes
        assert seeding.thread_share(3) == 3
        share.write_text("2\n")
        assert seeding.thread_share(3) == 2
        assert seeding.follow_thread_share(min_interval_s=0) == 2 and torch.get_num_threads() == 2
        assert seeding.follow_thread_share(min_interval_s=0) is None  # unchanged
        share.write_text("1\n")
        assert seeding.follow_thread_share(min_interval_s=3600) is None  # looked too recently: not yet
        assert seeding.follow_thread_share(min_interval_s=0) == 1 and torch.get_num_threads() == 1
        share.write_text("garbage")
        assert seeding.follow_thread_share(min_interval_s=0) is None and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_training_and_greedy_decoding_are_the_same_at_one_and_two_threads():
    """What lets a notebook change its thread count mid-run (acl run --jobs): the pinned CPU kernels give the same
    bits at one and at two threads. MKL must be in its strict mode for it (``seeding.CPU_KERNEL_ENV``): with
    ``MKL_CBWR=AVX2`` in the environment this fails on some processors (weights 5e-5 apart)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    # the mini profile's widths (acl_lib/profiles/mini.yaml), where two threads run its matmuls about 2x faster
    cfg = Qwen3Config(vocab_size=2048, hidden_size=192, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=48, max_position_embeddings=256)
    before = torch.get_num_threads()

    def run(threads):
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(cfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randint(0, 2048, (16, 96), generator=torch.Generator().manual_seed(1))
        for _ in range(3):
            model(input_ids=x, labels=x).loss.backward()
            opt.step()
            opt.zero_grad()
        with torch.no_grad():
            out = model.generate(input_ids=x[:, :24], max_new_tokens=16, do_sample=False, pad_token_id=0)
        return torch.cat([p.detach().flatten() for p in model.parameters()]), out

    try:
        (w1, g1), (w2, g2) = run(1), run(2)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(w1, w2) and torch.equal(g1, g2)
