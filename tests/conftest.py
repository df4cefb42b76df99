"""Shared test helpers: a CPU-friendly environment for child processes and throwaway notebooks."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# `python -m acl_lib.cli` with the interpreter running the tests (the venv's): the same code as the `acl` script.
ACL = [sys.executable, "-m", "acl_lib.cli"]


def child_env() -> dict[str, str]:
    """Environment for subprocesses: one thread each (the test machines have 2 shared cores)."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    return env


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
    nb = new_notebook(cells=cells, metadata={"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}})
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


@pytest.fixture
def smoke_cfg(tmp_path):
    """The smoke config with its run store in a temporary directory."""
    from acl_lib.config import load_config

    return load_config("smoke", [f"output_dir={tmp_path / 'outputs'}"], seed=0)


# --- the `rehearsal` marker: run by `make rehearsal` (CI runs it after `make test`), not by a plain `pytest` -------


def pytest_configure(config):
    config.addinivalue_line("markers", "rehearsal: the paper profile's hostfile launch on two local DeepSpeed "
                                       "processes (make rehearsal; .ci/run runs it after make test)")


def pytest_collection_modifyitems(config, items):
    """Leave out tests marked ``rehearsal`` unless a ``-m`` expression was given (``make rehearsal``: ``-m rehearsal``)."""
    if config.getoption("markexpr"):
        return
    kept = [i for i in items if i.get_closest_marker("rehearsal") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if i.get_closest_marker("rehearsal") is not None])
        items[:] = kept
