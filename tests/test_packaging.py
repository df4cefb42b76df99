"""Set-up: pyproject.toml and environment.yml agree; the Makefile installs CPU torch first and is idempotent;
CI runs `make test`, and every `make` target the README names exists."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import tomllib

import pytest
import yaml
from packaging.requirements import Requirement

from conftest import ROOT

# conda-level entries of environment.yml that are tooling, not Python packages of the suite
CONDA_TOOLING = {"python", "pip"}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _reqs(lines) -> dict[str, str]:
    out = {}
    for line in lines:
        r = Requirement(line)
        out[r.name.lower().replace("_", "-")] = str(r.specifier)
    return out


def test_environment_yml_names_the_same_packages_as_pyproject():
    project = _pyproject()["project"]
    expected = _reqs(project["dependencies"])
    for extra in ("gpu", "test"):
        expected.update(_reqs(project["optional-dependencies"][extra]))

    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda, pip = [], []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip.extend(d for d in dep["pip"] if not d.startswith("-"))  # skip "-e ." and pip options
        else:
            conda.append(dep.split("=")[0].split(">")[0].split("<")[0].strip())
    assert set(conda) <= CONDA_TOOLING, f"put Python packages in the pip section: {set(conda) - CONDA_TOOLING}"
    got = _reqs(pip)
    assert "vllm" in expected and "deepspeed" in expected and "torch" in expected
    from packaging.specifiers import SpecifierSet

    from acl_lib.versions import OPTIONAL, SUPPORTED

    # the training stack: environment.yml pins one release (==), inside pyproject.toml's range
    for pkg in SUPPORTED.keys() | OPTIONAL.keys():
        pin = got.pop(pkg)
        assert pin.startswith("==") and pin[2:] in SpecifierSet(expected.pop(pkg)), (pkg, pin)
    diff = {k: (got.get(k), expected.get(k)) for k in got.keys() | expected.keys() if got.get(k) != expected.get(k)}
    assert not diff, f"environment.yml vs pyproject.toml (dependencies + gpu + test extras), name: (yml, toml): {diff}"


def test_console_script_and_package_data():
    project = _pyproject()
    assert project["project"]["scripts"]["acl"] == "acl_lib.cli:main"
    assert "profiles/*.yaml" in project["tool"]["setuptools"]["package-data"]["acl_lib"]


def test_ci_runs_make_test():
    ci = ROOT / ".ci" / "run"
    text = ci.read_text()
    assert os.access(ci, os.X_OK) and text.startswith("#!/usr/bin/env bash")
    assert "set -euo pipefail" in text and re.search(r"^make test$", text, re.M)


def test_every_make_target_the_readme_names_is_in_the_makefile():
    targets = set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    named = set(re.findall(r"(?:^|`)make ([a-z][\w-]*)", (ROOT / "README.md").read_text(), re.M))
    assert {"run", "test"} <= named, "the README gives the two set-up commands"
    assert named <= targets, f"the README names targets the Makefile lacks: {sorted(named - targets)}"


def _dry_run(workdir, target="test"):
    res = subprocess.run(["make", "-n", target], cwd=workdir, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_makefile_installs_once_cpu_torch_first(tmp_path):
    """Dry-run the Makefile in a scratch copy: fresh -> venv + installs; stamped -> tests only; edited pyproject ->
    reinstall."""
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    fresh = _dry_run(tmp_path)
    lines = fresh.splitlines()
    venv = next(i for i, line in enumerate(lines) if "-m venv .venv" in line)
    torch = next(i for i, line in enumerate(lines) if 'pip install  "torch==' in line or 'pip install "torch==' in line)
    suite = next(i for i, line in enumerate(lines) if 'pip install -e ".[test]"' in line)
    kernel = next(i for i, line in enumerate(lines) if "ipykernel install --sys-prefix" in line)
    tests = next(i for i, line in enumerate(lines) if ".venv/bin/pytest" in line)
    assert venv < torch < suite < kernel < tests
    assert "acl run --profile mini --seeds 0" in _dry_run(tmp_path, "run")

    # pretend the venv exists and the install happened after the last pyproject edit
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").write_text("")
    (tmp_path / ".venv" / ".installed").write_text("")
    again = _dry_run(tmp_path)
    assert "pip install" not in again and "-m venv" not in again and ".venv/bin/pytest" in again

    later = time.time() + 5
    os.utime(tmp_path / "pyproject.toml", (later, later))
    edited = _dry_run(tmp_path)
    assert 'pip install -e ".[test]"' in edited and "-m venv" not in edited
