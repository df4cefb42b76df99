"""Shared test helpers: a CPU-friendly environment for child processes and throwaway notebooks."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
# `python -m acl_lib.cli` with the interpreter running the tests (the venv's): the same code as the `acl` script.
ACL = [sys.executable, "-m", "acl_lib.cli"]


@pytest.fixture(autouse=True)
def _acl_log_handlers_per_test():
    """Each test starts with the ``acl`` logger's handlers as they were before it: the console handler that
    ``ensure_console_logging`` adds holds the ``sys.stderr`` of the test that added it, which pytest closes
    afterwards; left in place, every later message would fail on it with a "Logging error" (written into the
    run log a later test reads)."""
    acl = logging.getLogger("acl")
    before = list(acl.handlers)
    yield
    for h in acl.handlers[:]:
        if h not in before:
            acl.removeHandler(h)


def child_env() -> dict[str, str]:
    """Environment for subprocesses: one thread each (the test machines have 2 shared cores)."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    return env


def free_port() -> int:
    """A free TCP port on the loopback address (a server's or a process group's)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_notebook(path: Path, body: list[str], title: str = "Throwaway test notebook") -> Path:
    """Write a notebook that follows the suite's conventions, with ``body`` as its code cells after set-up."""
    name = path.name
    cmd = f"papermill notebooks/{name} papermill_runs/smoke/seed0/{name} -p profile smoke -p seed 0"

    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    params = 'profile = "mini"  # config profile\nseed = 0  # run seed\noverrides = []  # --set strings'
    cells = [
        new_markdown_cell(f"# {title}\n\n```\n{cmd}\n```"),
        new_code_cell(params, metadata={"tags": ["parameters"]}),
        new_code_cell("import acl_lib.config\n\ncfg = acl_lib.config.load_config(profile, overrides, seed=seed)"),
    ] + [new_code_cell(src) for src in body]
    kernel = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb = new_notebook(cells=cells, metadata={"kernelspec": kernel})
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


# --- shared fixtures: one definition each, here; the session-scoped ones are built once per test run (once per
# pytest-xdist worker). They are read only: a test that writes into one takes its ``*_copy`` fixture instead.


@pytest.fixture
def smoke_cfg(tmp_path):
    """The smoke config (seed 0, one torch thread) with its run store, empty, in a temporary directory."""
    from train_kit import tiny_cfg

    return tiny_cfg(tmp_path)


@pytest.fixture(scope="session")
def base_dir(tmp_path_factory) -> Path:
    """A tiny smoke-sized Qwen3 and its tokenizer (trained on desk transcripts), freshly initialised, untrained:
    ``train_kit.make_base``."""
    from train_kit import make_base, tiny_cfg

    return make_base(tmp_path_factory.mktemp("base") / "model", tiny_cfg(tmp_path_factory.mktemp("cfg")))


class SmokeBase(NamedTuple):
    store: Path  # the run store (``output_dir``)
    model: Path  # <store>/smoke/seed0/base/model


@pytest.fixture(scope="session")
def smoke_base(tmp_path_factory) -> SmokeBase:
    """A complete ``base`` run of the smoke profile in a run store of its own: the base-model step
    (``pipeline.build_base``: tokenizer and model on the smoke corpus, the smoke profile's pretraining steps)."""
    from acl_lib.pipeline import build_base
    from train_kit import tiny_cfg

    cfg = tiny_cfg(tmp_path_factory.mktemp("smoke_base"))
    return SmokeBase(Path(cfg.output_dir), Path(build_base(cfg, evaluate=False)))


@pytest.fixture
def smoke_base_copy(smoke_base, tmp_path) -> SmokeBase:
    """``smoke_base``'s run store copied to ``tmp_path / "outputs"``, for a test that writes into it."""
    store = Path(shutil.copytree(smoke_base.store, tmp_path / "outputs"))
    return SmokeBase(store, store / smoke_base.model.relative_to(smoke_base.store))


@pytest.fixture(scope="session")
def paper_layout(tmp_path_factory) -> tuple[Path, dict]:
    """The data layout ``acl data prepare`` writes, converted from the small source files of tests/data, and the
    conversions' notes: ``paper_layout.build_layout``."""
    from paper_layout import build_layout

    return build_layout(tmp_path_factory.mktemp("data"))


# --- helpers --------------------------------------------------------------------------------------------------


def drive_random_turns(env, task, turns: list[str], max_turns: int = 6) -> None:
    """Feed ``turns`` (untrusted model text) to an episode of ``task`` until it ends: every observation is text,
    the reward is 0 or 1 and 1 exactly when no failure is recorded, and the record is JSON."""
    import json

    ep = env.start(task, max_turns=max_turns)
    for text in turns:
        if ep.done:
            break
        obs = ep.step(text)
        assert all(isinstance(o["content"], str) for o in obs)
    r = ep.reward()
    assert r in (0.0, 1.0) and (r == 1.0) == (ep.failure is None)
    json.dumps(ep.record())


# --- the `rehearsal` marker: run by `make rehearsal` (CI runs it after `make test`), not by a plain `pytest` -------


def pytest_configure(config):
    config.addinivalue_line("markers", "rehearsal: the paper profile's hostfile launch on two local DeepSpeed "
                                       "processes (make rehearsal; .ci/run runs it after make test)")


def pytest_collection_modifyitems(config, items):
    """Leave out tests marked ``rehearsal`` unless a ``-m`` expression was given (``make rehearsal``:
    ``-m rehearsal``)."""
    if config.getoption("markexpr"):
        return
    kept = [i for i in items if i.get_closest_marker("rehearsal") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if i.get_closest_marker("rehearsal") is not None])
        items[:] = kept
