"""Repeatable runs: seed every generator, and run the same CPU kernels on every x86 processor.

* ``seed_everything(seed)``: Python's ``random``, NumPy's global RNG and torch (CPU and CUDA). Called at the
  start of base building and of every evaluation (training seeds through the trainers' own ``seed``).
* ``pin_cpu_kernels()``: called when ``acl_lib`` is imported, before torch. Two x86 processors of different
  generations run different vectorised kernels (AVX-512 where present, else AVX2), which round differently,
  and on a tiny model trained for hundreds of steps a rounding difference grows into a different checkpoint.
  Pinning PyTorch's ATen kernels, MKL and oneDNN to their AVX2 code paths gives every AVX2-capable x86
  processor the same arithmetic. MKL's conditional reproducibility is asked for in its strict form
  (``MKL_CBWR=AVX2,STRICT``): without it the bits of MKL's matrix products depend on the number of threads
  on some processors (the same 12 math GRPO steps at one and at two threads: weights 4e-6 apart, and
  ``tests/test_seeding.py`` fails), and a run's numbers would depend on the schedule that ran it; strict mode
  costs about 3% of a training step. Each variable is only set when unset, so ``ATEN_CPU_CAPABILITY=avx512``
  (say) in the environment wins; it has no effect on GPU kernels.

* ``follow_thread_share()``: under ``acl run --jobs N`` each notebook's process may use a share of the machine's
  threads that changes while it runs (both cores once the notebook beside it has ended); the scheduler writes the
  share to the file named by ``ACL_THREADS_FILE`` and the long loops (a trainer's steps, an evaluation's rounds)
  call this to take it up. On the CPU kernels pinned here a result does not depend on the thread count
  (``tests/test_seeding.py`` checks training steps and greedy decoding at one and two threads bit for bit), so
  the schedule changes a run's time, never its numbers.

Deterministic *algorithms* (``torch.use_deterministic_algorithms``) are not switched on: they slow GPU kernels
and some ops have no deterministic version; CPU kernels at a fixed thread count are deterministic already.
"""

from __future__ import annotations

import os
import random
import sys
import time

THREADS_FILE_ENV = "ACL_THREADS_FILE"

# Environment variables read by torch / MKL / oneDNN when they load: the AVX2 code path on any x86 processor.
# STRICT: the same bits whatever the number of threads (MKL's strict CNR mode), not only on the same thread count.
CPU_KERNEL_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2,STRICT", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def pin_cpu_kernels() -> dict[str, str]:
    """Set ``CPU_KERNEL_ENV`` where unset (must run before torch is imported to take effect); returns the
    values in force. Child processes (papermill kernels, launched trainers) inherit them."""
    for key, value in CPU_KERNEL_ENV.items():
        os.environ.setdefault(key, value)
    return {k: os.environ[k] for k in CPU_KERNEL_ENV}


def seed_everything(seed: int) -> None:
    """Seed ``random``, ``numpy.random`` and torch (all devices) with ``seed`` (a non-negative int).

    torch is imported here, not at module import, so ``acl --help`` and config-only code stay light.
    ``PYTHONHASHSEED`` is set for child processes (data-loader workers, launched trainers); it cannot change
    the hash seed of the running interpreter.
    """
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    import numpy as np  # here, not at module level: acl_lib's import (and `acl --help`) stays light

    os.environ["PYTHONHASHSEED"] = str(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)  # NumPy's legacy global RNG takes 32-bit seeds
    import torch

    torch.manual_seed(seed)  # seeds every device's default generator, CUDA included


def local_world_size() -> int:
    """Processes of this job on this machine: ``LOCAL_WORLD_SIZE`` (torchrun, accelerate) or ``LOCAL_SIZE``
    (DeepSpeed's launcher); 1 outside a launched job."""
    for name in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"):
        if os.environ.get(name, "").isdigit() and int(os.environ[name]) > 0:
            return int(os.environ[name])
    return 1


def available_cpus() -> int:
    """CPU cores this process may run on (its affinity mask: what a Slurm allocation or ``taskset`` grants)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def threads_per_rank(torch_threads: int, local_ranks: int | None = None) -> int:
    """Intra-op threads of one process: the node's thread budget split over the job's processes on this node.

    ``torch_threads`` is the budget of one machine (the config's ``torch_threads``); 0 means all the cores this
    process may use. ``local_ranks`` defaults to ``local_world_size()``: the ranks of *this* node, not of the
    whole job (16 ranks on 2 nodes x 8 GPUs share 8 ranks' worth of cores per node). At least 1."""
    if torch_threads < 0:
        raise ValueError(f"torch_threads must be >= 0 (0 = all available cores), got {torch_threads}")
    budget = torch_threads or available_cpus()
    return max(1, budget // max(1, local_ranks if local_ranks is not None else local_world_size()))


def _shared_threads() -> int | None:
    """The number in ``$ACL_THREADS_FILE``, or None (no scheduler, the file not written yet or being replaced)."""
    path = os.environ.get(THREADS_FILE_ENV)
    if not path:
        return None
    try:
        with open(path) as f:
            n = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return n if n > 0 else None


def thread_share(torch_threads: int) -> int:
    """This machine's thread budget for this process now: the number ``acl run --jobs N`` wrote to
    ``$ACL_THREADS_FILE`` (see ``follow_thread_share``) when there is one, else ``torch_threads``."""
    return _shared_threads() or torch_threads


_last_follow = [0.0]


def follow_thread_share(min_interval_s: float = 2.0) -> int | None:
    """Set torch's intra-op threads to this rank's part of ``thread_share`` if it changed (at most one look at the
    file every ``min_interval_s``); returns the thread count set, or None when nothing changed or no scheduler
    shares threads here. Called from the main thread (OpenMP's thread count is per calling thread) by the loops
    that run for minutes: ``train.common.show_progress``'s step callback and ``eval.harness.run_episodes``."""
    if not os.environ.get(THREADS_FILE_ENV) or "torch" not in sys.modules:
        return None
    now = time.monotonic()
    if now - _last_follow[0] < min_interval_s:
        return None
    _last_follow[0] = now
    import torch

    shared = _shared_threads()
    if shared is None:
        return None
    want = threads_per_rank(shared)
    if want == torch.get_num_threads():
        return None
    torch.set_num_threads(want)
    return want


def set_torch_threads(torch_threads: int) -> None:
    """Torch's intra-op threads: this rank's part (``threads_per_rank``) of ``thread_share(torch_threads)``."""
    import torch

    torch.set_num_threads(threads_per_rank(thread_share(torch_threads)))


def seed_and_threads(seed: int, threads: int) -> None:
    """``seed_everything(seed)`` and torch's intra-op threads capped at ``threads_per_rank(threads)``: what every
    job that samples or initialises does first, so its numbers do not depend on what ran before in the same
    process."""
    seed_everything(seed)
    set_torch_threads(threads)
