"""The table of the study's steps (acl_lib/steps.py): every run and file the pipeline writes has the notebook
that makes it, and the messages and missing lists read it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from acl_lib import steps
from conftest import ROOT


@pytest.mark.parametrize("what,notebook", [
    ("base", "00"), ("seq_math", "01-04"), ("seq_if", "01-04"), ("seq2_if-math", "01-04"), ("oracle_ecom", "05"),
    ("diagnostics/weights.json", "06"), ("diagnostics/cl_metrics.json", "06"), ("diagnostics/tokens.json", "07"),
    ("mmopd", "08"), ("mmopd_single", "08"), ("sdft_base", "09"), ("sdft_directions/directions.json", "09"),
    ("merge_uniform", "10"), ("mle_expert_math", "11"), ("mle", "11"), ("something_else", ""),
])
def test_each_run_and_file_has_the_notebook_that_makes_it(what, notebook):
    assert steps.notebook_of(what) == notebook


def test_the_table_is_the_committed_notebooks():
    """Each step's prefix (or range) is a notebook of notebooks/, and every notebook is a step."""
    prefixes = sorted(p.name[:2] for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    listed = []
    for s in steps.TABLE:
        a, _, b = s.notebook.partition("-")
        listed += [f"{i:02d}" for i in range(int(a), int(b or a) + 1)]
    assert listed == prefixes


def test_require_complete_names_each_missing_run_and_its_notebook(tmp_path):
    run = lambda name, done: SimpleNamespace(name=name, is_complete=lambda: done,  # noqa: E731
                                             status=lambda: "complete" if done else "missing", path=tmp_path / name)
    steps.require_complete([run("base", True)], "nothing")  # all complete: no error
    with pytest.raises(RuntimeError) as err:
        steps.require_complete([run("base", True), run("oracle_if", False), run("seq_math", False)], "SDFT's data")
    text = str(err.value)
    assert text.startswith("SDFT's data needs complete runs: missing oracle_if (missing, ")
    assert "notebook 05 (the oracles)" in text and "notebooks 01-04 (the sequential stages)" in text
    assert "base (" not in text


def test_seq_final_maps_both_ways():
    assert steps.as_seq_final("seq_if", "seq_if") == "seq_final" and steps.as_seq_final("mmopd", "seq_if") == "mmopd"
    assert steps.from_seq_final("seq_final", "seq_math") == "seq_math"
    assert json.dumps(steps.made_by("sdft_base")) == '"notebook 09 (SDFT)"'
