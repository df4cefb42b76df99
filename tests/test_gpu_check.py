"""benchmarks/gpu_check.py at smoke size on CPU (issue 32): the script a GPU machine runs, kept working here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT, child_env


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_gpu_check_runs_at_smoke_size_and_writes_its_report(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {**child_env(), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--size", "smoke", "--json", str(out),
                           "--workdir", str(tmp_path / "work")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=540)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["size"] == "smoke" and report["device"] == "cpu" and report["parameters"] > 0
    for phase in ("grpo", "mmopd"):
        ph = report["phases"][phase]
        assert ph["seconds"] > 0 and ph["peak_gib"] > 0 and ph["predicted_gib"] > 0, phase
        assert ph["gen_tokens_per_s"] and ph["gen_tokens_per_s"] > 0, phase
    assert report["phases"]["mmopd"]["predicted"]["divergence_gib_per_gpu"] > 0
    assert (tmp_path / "work" / "grpo" / "model" / "model.safetensors").exists()
    assert (tmp_path / "work" / "mmopd" / "model" / "model.safetensors").exists()
    assert "gpu_check: written" in proc.stdout
