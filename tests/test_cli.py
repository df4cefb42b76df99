"""`acl`: fast help without torch, early config validation, and `acl run` end to end on throwaway notebooks
(failure report, SIGKILL mid-notebook then resume, idempotent re-run)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from acl_lib.cli import build_parser, main
from acl_lib.runs import COMPLETE, RUNNING, disk_status
from conftest import ACL, ROOT, child_env, write_notebook

SUBCOMMANDS = [[], ["run"], ["status"], ["config"], ["eval"], ["env"], ["env", "retail"], ["env", "retail", "replay"],
               ["nbstrip"]]


def acl(*args: str, cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*ACL, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=child_env())


@pytest.mark.slow
def test_help_is_instant_and_imports_no_torch():
    probe = (
        "import sys, time\n"
        "t = time.perf_counter()\n"
        "from acl_lib.cli import main\n"
        f"for argv in {SUBCOMMANDS!r}:\n"
        "    try:\n"
        "        main(argv + ['--help'])\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, (argv, e.code)\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'papermill', 'pydantic', 'numpy') if m in sys.modules)\n"
        "print('HEAVY', heavy, 'SECONDS', round(time.perf_counter() - t, 3), file=sys.stderr)\n"
    )
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=child_env())
    assert res.returncode == 0, res.stderr
    assert "HEAVY [] " in res.stderr, res.stderr
    for sub in ("run", "status", "config", "eval", "env", "nbstrip"):
        assert sub in res.stdout
    t = time.perf_counter()
    assert acl("--help").returncode == 0
    print(f"`python -m acl_lib.cli --help` took {time.perf_counter() - t:.2f} s (wall, incl. interpreter start)")


@pytest.mark.slow
def test_unknown_override_fails_before_any_notebook(tmp_path):
    nb_dir = tmp_path / "nb"
    write_notebook(nb_dir / "00_never.ipynb", ["raise SystemExit('must not run')"])
    res = acl("run", "--profile", "smoke", "--set", "no_such_key=1", "--notebooks-dir", str(nb_dir),
              "--papermill-dir", str(tmp_path / "pm"), "--output-dir", str(tmp_path / "out"))
    assert res.returncode == 2
    assert "no_such_key" in res.stderr and "Valid keys" in res.stderr
    assert not (tmp_path / "pm").exists()

    res = acl("run", "--profile", "smoke", "--only", "07", "--notebooks-dir", str(nb_dir))
    assert res.returncode == 2 and "07" in res.stderr


@pytest.mark.slow
def test_config_prints_resolved_yaml():
    res = acl("config", "--profile", "smoke", "--set", "eval.k=3", "pipeline.curriculum=[if,math,search,ecom]",
              "--seed", "2")
    assert res.returncode == 0, res.stderr
    cfg = yaml.safe_load(res.stdout)
    assert cfg["profile"] == "smoke" and cfg["seed"] == 2 and cfg["eval"]["k"] == 3
    assert cfg["pipeline"]["curriculum"] == ["if", "math", "search", "ecom"]
    bad = acl("config", "--profile", "smoke", "--set", "eval.k=many")
    assert bad.returncode == 2 and "eval.k" in bad.stderr


def test_eval_and_replay_parsers():
    a = build_parser().parse_args(["eval", "--model", "m", "--suites", "ood", "--k", "4", "--out", "o",
                                   "--set", "eval.max_turns=2", "--seed", "1"])
    assert (a.model, a.profile, a.suites, a.k, a.out, a.overrides, a.seed) == (
        "m", "mini", "ood", 4, "o", ["eval.max_turns=2"], 1)
    r = build_parser().parse_args(["env", "retail", "replay", "--db", "d.json", "--tasks", "t.json",
                                   "--out", "o.jsonl"])
    assert (r.db, r.tasks, r.out) == ("d.json", "t.json", "o.jsonl")


@pytest.mark.slow
def test_failing_notebook_reports_copy_and_cell(tmp_path):
    nb_dir = tmp_path / "nb"
    write_notebook(nb_dir / "00_broken.ipynb", ["value = 1", "ratio = value / 0  # the failing line"])
    write_notebook(nb_dir / "01_after.ipynb", ["x = 2"])
    res = acl("run", "--profile", "smoke", "--seeds", "0", "--notebooks-dir", str(nb_dir),
              "--papermill-dir", str(tmp_path / "pm"), "--output-dir", str(tmp_path / "out"), timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    copy = (tmp_path / "pm" / "smoke" / "seed0" / "00_broken.ipynb").resolve()
    assert str(copy) in res.stderr and copy.exists()
    assert "ratio = value / 0  # the failing line" in res.stderr and "ZeroDivisionError" in res.stderr
    assert not (tmp_path / "pm" / "smoke" / "seed0" / "01_after.ipynb").exists(), "stops at the failing notebook"


SLOW_STEP = """
import sys, time
from acl_lib.runs import Run, run_once

def slow_step(run):
    time.sleep(3)  # stands in for training
    run.write_json("result.json", {"executable": sys.executable, "seed": cfg.seed})

run_once(Run(cfg, "slow_step"), slow_step)
"""


@pytest.mark.slow
def test_kill_mid_notebook_then_rerun_completes_and_third_run_skips(tmp_path):
    nb_dir, pm, out = tmp_path / "nb", tmp_path / "pm", tmp_path / "out"
    write_notebook(nb_dir / "00_slow.ipynb", [SLOW_STEP])
    args = [*ACL, "run", "--profile", "smoke", "--seeds", "0", "--notebooks-dir", str(nb_dir),
            "--papermill-dir", str(pm), "--output-dir", str(out)]
    run_dir = out / "smoke" / "seed0" / "slow_step"

    # 1. kill the whole `acl run` process group while the notebook is inside the run
    proc = subprocess.Popen(args, cwd=ROOT, env=child_env(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while not (run_dir / RUNNING).exists():
        assert proc.poll() is None and time.time() < deadline, "the notebook never started its run"
        time.sleep(0.1)
    sockets = list(Path(tempfile.gettempdir()).glob(f"acl-kernel-{proc.pid}-*"))  # the kernel's socket files
    assert len(sockets) == 1, sockets
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    # the kernel (its own session) notices its parent is gone and exits within about a second
    deadline = time.time() + 30
    while disk_status(run_dir) == "running" and time.time() < deadline:
        time.sleep(0.2)
    assert disk_status(run_dir) == "failed" and not (run_dir / COMPLETE).exists()
    assert sockets[0].exists()  # nothing cleans up after SIGKILL ...

    # 2. run again: completes, with the venv's python
    t = time.perf_counter()
    res = subprocess.run(args, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    t_second = time.perf_counter() - t
    assert res.returncode == 0, res.stderr[-3000:]
    assert disk_status(run_dir) == "complete"
    assert not sockets[0].exists()  # ... the next notebook's start removes the dead process's socket directory
    result = json.loads((run_dir / "result.json").read_text())
    # the kernel runs this venv's interpreter (python and python3 are the same file in a venv)
    assert result["seed"] == 0
    assert os.path.realpath(result["executable"]) == os.path.realpath(sys.executable)
    assert Path(result["executable"]).parent == Path(sys.executable).parent
    assert str((out / "smoke" / "seed0").resolve()) in res.stdout, "prints where the results are"
    finished = json.loads((run_dir / COMPLETE).read_text())["finished_at"]

    # 3. a third run skips the notebook itself: same notebook and parameters, its run still complete
    res = subprocess.run(args, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "skipped, complete" in res.stdout and "0 notebook(s) executed" in res.stdout and "1 skipped" in res.stdout
    # --re-execute runs the notebook again, which skips the complete run inside it
    t = time.perf_counter()
    res = subprocess.run([*args, "--re-execute"], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                         timeout=300)
    t_third = time.perf_counter() - t
    assert res.returncode == 0, res.stderr[-3000:]
    executed = (pm / "smoke" / "seed0" / "00_slow.ipynb").read_text()
    assert "run slow_step is complete" in executed and "skipping" in executed
    assert json.loads((run_dir / COMPLETE).read_text())["finished_at"] == finished
    print(f"acl run: second (does the work) {t_second:.1f} s, --re-execute (skips the run) {t_third:.1f} s")
    assert t_third < t_second  # the work (a 3 s sleep) is skipped
    # a run removed from the store: the notebook that made it is executed again and redoes it
    shutil.rmtree(run_dir)
    res = subprocess.run(args, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "1 notebook(s) executed" in res.stdout, res.stdout + res.stderr[-3000:]
    assert disk_status(run_dir) == "complete"

    # 4. status shows the run and the executed notebook
    res = subprocess.run([*ACL, "status", "--profile", "smoke", "--notebooks-dir", str(nb_dir),
                          "--papermill-dir", str(pm), "--output-dir", str(out)],
                         cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    row = next(line for line in res.stdout.splitlines() if "slow_step" in line)
    assert "complete" in row
    row = next(line for line in res.stdout.splitlines() if "00_slow.ipynb" in line and "done" in line)
    assert row


def test_main_returns_exit_code_for_config(capsys):
    assert main(["config", "--profile", "smoke"]) == 0
    assert "profile: smoke" in capsys.readouterr().out


def test_run_executes_12_once_after_every_seed_and_13_only_with_only(tmp_path, monkeypatch, capsys):
    """acl run's order without executing anything: nbs.execute records what it was asked to run."""
    from acl_lib import notebooks as nbs

    nb_dir, pm, out = tmp_path / "nb", tmp_path / "pm", tmp_path / "out"
    for name in ("00_first", "01_second", "12_final_tables", "13_curriculum_orders"):
        write_notebook(nb_dir / f"{name}.ipynb", ["x = 1"])
    # the schedule is the notebooks' own metadata (metadata.acl), as in notebooks/12_* and 13_*
    schedules = {"12_final_tables": {"runs": "once_over_seeds"}, "13_curriculum_orders": {"opt_in": True}}
    for name, schedule in schedules.items():
        path = nb_dir / f"{name}.ipynb"
        nb = json.loads(path.read_text())
        nb["metadata"]["acl"] = schedule
        path.write_text(json.dumps(nb))
    calls = []
    monkeypatch.setattr(nbs, "execute",
                        lambda nb, output, params, **kw: calls.append((Path(nb).name[:2], Path(output), params)))
    base = ["run", "--profile", "smoke", "--notebooks-dir", str(nb_dir), "--papermill-dir", str(pm),
            "--output-dir", str(out)]
    for k in [k for k in os.environ if k.startswith("ACL_PNG")]:
        monkeypatch.delenv(k)
    assert main([*base, "--seeds", "0", "1"]) == 0
    # the PNG decision handed to the kernels lasted the run only: it leaves nothing in this process's environment
    # for a later child to inherit (a later test's child run once stayed quiet about the browser it did not seek)
    assert not [k for k in os.environ if k.startswith("ACL_PNG")]
    assert [(c[0], c[2]["seed"], c[2].get("seeds")) for c in calls] == [
        ("00", 0, None), ("01", 0, None), ("00", 1, None), ("01", 1, None), ("12", 0, [0, 1])]
    assert calls[-1][1] == pm.resolve() / "smoke" / "12_final_tables.ipynb"
    assert calls[2][1] == pm.resolve() / "smoke" / "seed1" / "00_first.ipynb"
    assert "(profile smoke, seeds 0 1)" in capsys.readouterr().out
    calls.clear()
    assert main([*base, "--seeds", "0", "--only", "13"]) == 0
    assert [(c[0], c[2]["seed"]) for c in calls] == [("13", 0)]


def test_report_subcommand_writes_html(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["report", "--help"])
    assert exc.value.code == 0 and "report.html" in capsys.readouterr().out
    out = tmp_path / "out"
    p = out / "smoke" / "seed3" / "base" / "eval" / "metrics.json"
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps({"scores": {"aime26": 10.0, "nq": 5.0}}))
    args = ["report", "--profile", "smoke", "--output-dir", str(out), "--papermill-dir", str(tmp_path / "pm")]
    assert main(args) == 0
    report = out / "smoke" / "report.html"
    assert report.is_file() and "seeds 3" in capsys.readouterr().out  # the seeds found on disk
    text = report.read_text()
    assert "<title>ACLArena suite: final report (profile smoke, seeds 3)</title>" in text and "seq_math" in text


def test_a_notebook_is_skipped_only_while_its_record_holds(tmp_path):
    """``notebooks.is_done``: same notebook file, same parameters, a finished executed copy and every run recorded
    still complete from the same finish; any of them changed and the notebook must run again."""
    from acl_lib import notebooks as nbs

    nb, seed_dir, executed = tmp_path / "00_a.ipynb", tmp_path / "seed0", tmp_path / "pm" / "00_a.ipynb"
    write_notebook(nb, ["x = 1"])
    run = seed_dir / "r"
    run.mkdir(parents=True)
    (run / COMPLETE).write_text(json.dumps({"finished_at": "t1"}))
    executed.parent.mkdir()
    executed.write_text(json.dumps({"metadata": {"papermill": {"end_time": "t", "exception": None}}, "cells": []}))
    params = {"profile": "smoke", "seed": 0, "overrides": []}
    assert nbs.is_done(seed_dir, nb, params, executed) is None  # no record yet
    nbs.write_done(seed_dir, nb, params, executed)
    assert "1 runs still complete" in nbs.is_done(seed_dir, nb, params, executed)
    assert nbs.is_done(seed_dir, nb, {**params, "seed": 1}, executed) is None  # other parameters
    (run / COMPLETE).write_text(json.dumps({"finished_at": "t2"}))  # the run was redone since
    assert nbs.is_done(seed_dir, nb, params, executed) is None
    nbs.write_done(seed_dir, nb, params, executed)
    write_notebook(nb, ["x = 2"])  # the notebook was edited
    assert nbs.is_done(seed_dir, nb, params, executed) is None
    nbs.write_done(seed_dir, nb, params, executed)
    executed.write_text(json.dumps({"metadata": {"papermill": {"end_time": None}}, "cells": []}))  # killed copy
    assert nbs.is_done(seed_dir, nb, params, executed) is None
