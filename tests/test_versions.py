"""The training stack's releases (acl_lib/versions.py): the ranges agree with pyproject.toml, what is installed here
passes, and a release outside its range, or a missing package, is named with what to install, before any job."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from acl_lib import versions

ROOT = Path(__file__).resolve().parent.parent


def test_ranges_are_pyprojects():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = {Requirement(r).name: str(Requirement(r).specifier)
            for r in project["dependencies"] + project["optional-dependencies"]["gpu"]}
    for pkg, (spec, _) in {**versions.SUPPORTED, **versions.OPTIONAL}.items():
        assert str(Requirement(f"{pkg}{spec}").specifier) == reqs[pkg], pkg


def test_the_installed_stack_passes():
    assert versions.check() == []
    versions.require()


def test_a_release_outside_its_range_is_named_with_the_fix(monkeypatch):
    here = {pkg: versions.installed(pkg) for pkg in versions.SUPPORTED}
    bad = dict(here, trl="1.17.0", transformers="5.20.1", peft=None, vllm="0.31.0")
    problems = versions.check(bad)
    assert len(problems) == 4
    assert any("trl 1.17.0 is installed; the suite needs trl>=1.16,<1.17" in p and "rollout_func" in p
               and "pip install 'trl>=1.16,<1.17'" in p for p in problems)
    assert any(p.startswith("transformers 5.20.1 is installed") and "activation_checkpointing" in p for p in problems)
    assert any(p.startswith("peft is not installed") for p in problems)
    assert any(p.startswith("vllm 0.31.0 is installed; the suite needs vllm==0.30.0") for p in problems)
    assert versions.check(dict(here, vllm=None)) == []  # vLLM only where it is installed
    assert versions.check(dict(here, torch="2.13.0+cpu", trl="1.16.0+local")) == []  # local labels
    monkeypatch.delenv(versions.SKIP_ENV, raising=False)
    with pytest.raises(RuntimeError, match="trl 1.17.0 is installed") as err:
        versions.require(bad)
    assert versions.SKIP_ENV in str(err.value)
    monkeypatch.setenv(versions.SKIP_ENV, "1")
    versions.require(bad)  # a warning, not an error


def test_the_launcher_refuses_a_wrong_stack_before_any_job(monkeypatch, tmp_path):
    from acl_lib.config import load_config
    from acl_lib.train import launcher

    monkeypatch.delenv(versions.SKIP_ENV, raising=False)
    here = {pkg: versions.installed(pkg) for pkg in versions.SUPPORTED}
    monkeypatch.setattr(versions, "installed", lambda pkg: {**here, "trl": "9.9.9"}.get(pkg))
    cfg = load_config("smoke", [f"output_dir={tmp_path}"])
    with pytest.raises(RuntimeError, match="trl 9.9.9 is installed"):
        launcher.launch(cfg, "sft", tmp_path / "job")
    assert not (tmp_path / "job").exists()


def test_acl_run_refuses_a_wrong_stack_before_any_notebook(monkeypatch, tmp_path, capsys):
    from acl_lib import cli

    monkeypatch.delenv(versions.SKIP_ENV, raising=False)
    here = {pkg: versions.installed(pkg) for pkg in versions.SUPPORTED}
    monkeypatch.setattr(versions, "installed", lambda pkg: {**here, "deepspeed": "0.20.1"}.get(pkg))
    rc = cli.main(["run", "--profile", "smoke", "--seeds", "0", "--output-dir", str(tmp_path / "o"),
                   "--papermill-dir", str(tmp_path / "p")])
    assert rc == cli.EXIT_USAGE
    assert "deepspeed 0.20.1 is installed; the suite needs deepspeed>=0.19,<0.20" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not (tmp_path / "p").exists()
