"""The diagnostics against a run store: what is missing is listed, prerequisites are named, JSON is valid."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from acl_lib.diagnostics import read_diagnostics, write_diagnostics
from acl_lib.diagnostics.checkpoints import stage_checkpoints


def test_an_empty_run_store_lists_every_checkpoint_as_missing(smoke_cfg):
    found = stage_checkpoints(smoke_cfg, extra=["mmopd"])
    names = [c.name for c in found.items]
    assert names == ["base", "seq_math", "seq_search", "seq_ecom", "seq_if",
                     "oracle_math", "oracle_search", "oracle_ecom", "oracle_if", "mmopd"]
    assert found.present() == [] and len(found.missing()) == 10
    frame = found.missing_frame()
    assert frame.loc["seq_search", "made by notebook"] == "01-04" and frame.loc["oracle_if", "status"] == "missing"
    assert [c.start for c in found.items[1:5]] == ["base", "seq_math", "seq_search", "seq_ecom"]


def test_prerequisites_are_named(smoke_cfg):
    from acl_lib.diagnostics.tokens import build_reference
    from acl_lib.diagnostics.weights import weight_diagnostics

    found = stage_checkpoints(smoke_cfg)
    with pytest.raises(FileNotFoundError, match="base checkpoint: run notebook 00"):
        weight_diagnostics(found, progress=False)
    with pytest.raises(FileNotFoundError, match="seq_math's: that run is not complete"):
        build_reference(smoke_cfg, 4)
    with pytest.raises(ValueError, match="unknown benchmark"):
        build_reference(smoke_cfg, 4, ["no_such_bench"])
    with pytest.raises(FileNotFoundError, match="run the notebook that writes it"):
        read_diagnostics(smoke_cfg, "weights")


def test_json_has_no_nan(smoke_cfg):
    values = {"a": float("nan"), "b": [np.float64(1.5), math.inf], "c": np.arange(2)}
    path = write_diagnostics(smoke_cfg, "probe", values)
    assert path == smoke_cfg.seed_dir() / "diagnostics" / "probe.json"
    assert json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}")) == \
        {"a": None, "b": [1.5, None], "c": [0, 1]}
    assert read_diagnostics(smoke_cfg, "probe")["b"] == [1.5, None]
