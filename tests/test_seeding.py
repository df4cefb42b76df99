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
