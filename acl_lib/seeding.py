"""One call to make a run repeatable: seed Python's ``random``, NumPy's global RNG and torch (CPU and CUDA).

Deterministic *algorithms* (``torch.use_deterministic_algorithms``) are not switched on: they slow GPU kernels
and some ops have no deterministic version; seeding makes CPU runs repeatable, which is what the tests need.
"""

from __future__ import annotations

import os
import random

import numpy as np


def seed_everything(seed: int) -> None:
    """Seed ``random``, ``numpy.random`` and torch (all devices) with ``seed`` (a non-negative int).

    torch is imported here, not at module import, so ``acl --help`` and config-only code stay light.
    ``PYTHONHASHSEED`` is set for child processes (data-loader workers, launched trainers); it cannot change
    the hash seed of the running interpreter.
    """
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)  # NumPy's legacy global RNG takes 32-bit seeds
    import torch

    torch.manual_seed(seed)  # seeds every device's default generator, CUDA included
