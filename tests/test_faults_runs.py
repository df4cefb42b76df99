"""Fault suite, runs (issue 11, defects 4 and 5): two runs at once, and interruptions of a real smoke run.

- Concurrency: the run store's running check was check-then-write, with no lock, so two processes both
  trained ``base``. Now the second start of a run fails at once, before any compute, naming the run and the
  process holding it; a second ``acl run`` on one output directory exits 2 before starting a notebook.
- Interruption: Ctrl-C printed a kernel ZMQError traceback and ``acl status`` then listed the interrupted
  notebook as done. SIGINT and SIGKILL at two points of a smoke run, then a resume: nothing is complete
  without its files, and ``acl status`` agrees with the run store at every step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from acl_lib.config import load_config
from acl_lib.runs import COMPLETE, CONFIG, RUNNING, SUPERSEDED, Run, disk_status
from conftest import ACL, ROOT, child_env, write_notebook


def test_two_starts_of_one_run_at_once_the_second_fails_before_any_compute(tmp_path, monkeypatch):
    cfg = load_config("smoke", [f"output_dir={tmp_path}"])
    slow_clear = Run._clear_partial

    def clear_slowly(self, config_hash):
        time.sleep(1.0)  # widens the gap between the running check and RUNNING.json, as a busy disk would
        slow_clear(self, config_hash)

    monkeypatch.setattr(Run, "_clear_partial", clear_slowly)
    barrier, results = threading.Barrier(2), []

    def start() -> None:
        run = Run(cfg, "train")
        barrier.wait()
        t0 = time.perf_counter()
        try:
            with run.start():
                results.append(("started", time.perf_counter() - t0))
                time.sleep(0.5)  # the training
        except RuntimeError as exc:
            results.append(("refused", time.perf_counter() - t0, str(exc)))

    threads = [threading.Thread(target=start) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(r[0] for r in results) == ["refused", "started"], results
    refused = next(r for r in results if r[0] == "refused")
    assert refused[1] < 1.0, "refused only after the other run's set-up: not at once"
    assert "run train is already running" in refused[2] and f"pid {os.getpid()}" in refused[2]
    assert Run(cfg, "train").is_complete()


SLOW_STEP = """
import time
from acl_lib.runs import Run, run_once

run_once(Run(cfg, "slow_step"), lambda run: time.sleep(4))
"""


@pytest.mark.slow
def test_a_second_acl_run_on_one_output_dir_fails_at_once(tmp_path):
    nb_dir, out = tmp_path / "nb", tmp_path / "out"
    write_notebook(nb_dir / "00_slow.ipynb", [SLOW_STEP])

    def args(pm: Path) -> list[str]:
        return [*ACL, "run", "--profile", "smoke", "--notebooks-dir", str(nb_dir), "--papermill-dir", str(pm),
                "--output-dir", str(out)]

    first = subprocess.Popen(args(tmp_path / "pm1"), cwd=ROOT, env=child_env(), start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        running = out / "smoke" / "seed0" / "slow_step" / RUNNING
        deadline = time.time() + 120
        while not running.exists():
            assert first.poll() is None and time.time() < deadline, "the first run never started its run"
            time.sleep(0.1)
        t0 = time.perf_counter()
        second = subprocess.run(args(tmp_path / "pm2"), cwd=ROOT, env=child_env(), capture_output=True, text=True,
                                timeout=120)
        took = time.perf_counter() - t0
        assert second.returncode == 2, second.stderr[-2000:]
        assert f"pid {first.pid}" in second.stderr and "in use by another acl run" in second.stderr
        assert "Traceback" not in second.stderr
        assert not list((tmp_path / "pm2").rglob("*.ipynb")), "the second run started a notebook"
        print(f"second acl run refused in {took:.1f} s")
        assert first.wait(timeout=180) == 0, first.stderr.read()[-2000:]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
    assert disk_status(out / "smoke" / "seed0" / "slow_step") == "complete"


# --- interruptions of a real smoke run ---------------------------------------------------------------------

# notebook 00 of the smoke profile, made smaller still: the base on a small corpus, one task per benchmark
# 300 pretraining steps (~10 s): long enough for a Ctrl-C to land inside the training loop on a busy machine
TINY = ["--set", "pretrain.corpus_chars=60000", "pretrain.max_steps=300", "worlds.n_test=1", "worlds.n_ood=1",
        "eval.max_new_tokens=4", "eval.max_turns=2"]
# what a complete run must hold
REQUIRED = {
    "base": ["base.json", "model/config.json", "model/model.safetensors", "model/tokenizer.json"],
    "base/eval": ["metrics.json", "records/aime26.jsonl", "records/retail.jsonl", "records/ifbench.jsonl"],
}


def _status(pm: Path, out: Path) -> tuple[dict[str, str], dict[str, str]]:
    """`acl status`: {run: status} and {notebook: state}."""
    res = subprocess.run([*ACL, "status", "--profile", "smoke", "--seeds", "0", "--papermill-dir", str(pm),
                          "--output-dir", str(out)], cwd=ROOT, env=child_env(), capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    runs, notebooks = {}, {}
    for line in res.stdout.splitlines():
        cells = line.split()
        if len(cells) >= 3 and cells[0] == "0":
            (notebooks if cells[1].endswith(".ipynb") else runs)[cells[1]] = cells[2]
    return runs, notebooks


def _check_store(pm: Path, out: Path) -> dict[str, str]:
    """`acl status` agrees with the run store, and every complete run holds its files. Returns the statuses."""
    seed_dir = out / "smoke" / "seed0"
    on_disk = {
        str(p.parent.relative_to(seed_dir)): disk_status(p.parent)
        for p in seed_dir.rglob(CONFIG)
        if SUPERSEDED not in p.parts and "checkpoints" not in p.parts
    }
    runs, _ = _status(pm, out)
    assert runs == on_disk, f"acl status says {runs}, the run store {on_disk}"
    for name, status in on_disk.items():
        if status == "complete":
            missing = [f for f in REQUIRED.get(name, []) if not (seed_dir / name / f).is_file()]
            assert not missing, f"{name} is complete without {missing}"
            header = (seed_dir / name / CONFIG).read_text().splitlines()[0]
            assert json.loads((seed_dir / name / COMPLETE).read_text())["config_hash"] in header
    return on_disk


def _wait_gone(run_dir: Path, timeout: float = 60) -> None:
    """Until the process that ran ``run_dir`` is gone (a kernel exits about a second after its parent)."""
    deadline = time.time() + timeout
    while disk_status(run_dir) == "running" and time.time() < deadline:
        time.sleep(0.2)


@pytest.mark.slow
def test_sigint_and_sigkill_in_a_smoke_run_then_resume(tmp_path):
    pm, out = tmp_path / "pm", tmp_path / "out"
    args = [*ACL, "run", "--profile", "smoke", "--only", "00", *TINY, "--papermill-dir", str(pm),
            "--output-dir", str(out)]
    seed_dir = out / "smoke" / "seed0"

    def start_and_signal(marker: Path, sig: int) -> subprocess.CompletedProcess:
        # A test run in the background (a CI job, `make test &`) inherits SIGINT ignored, and so would acl:
        # give it the default disposition, as in a terminal, so Python installs its Ctrl-C handler.
        proc = subprocess.Popen(args, cwd=ROOT, env=child_env(), start_new_session=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.time() + 240
        while not marker.exists():
            assert proc.poll() is None and time.time() < deadline, f"{marker} never appeared"
            time.sleep(0.1)
        if sig == signal.SIGKILL:  # the whole job dies at this point (OOM, power): the kernel runs the run
            os.kill(json.loads(marker.read_text())["pid"], sig)
        os.killpg(proc.pid, sig)  # Ctrl-C in a terminal signals the whole foreground process group
        stdout, stderr = proc.communicate(timeout=120)
        return subprocess.CompletedProcess(args, proc.returncode, stdout, stderr)

    # 1. Ctrl-C while the base trains (its first training log line says the loop is running)
    res = start_and_signal(seed_dir / "base" / "train_log.jsonl", signal.SIGINT)
    assert res.returncode == 130, res.stderr[-3000:]
    assert "interrupted in 00_base_model.ipynb" in res.stderr
    assert "Traceback" not in res.stderr and "ZMQError" not in res.stderr, res.stderr[-3000:]
    _wait_gone(seed_dir / "base")
    assert _check_store(pm, out) == {"base": "failed"}
    assert _status(pm, out)[1]["00_base_model.ipynb"] == "interrupted"

    # 2. SIGKILL of acl and its kernel while the base is scored: the base is complete, its evaluation is not
    res = start_and_signal(seed_dir / "base" / "eval" / RUNNING, signal.SIGKILL)
    assert res.returncode == -signal.SIGKILL
    _wait_gone(seed_dir / "base" / "eval")
    assert _check_store(pm, out) == {"base": "complete", "base/eval": "failed"}
    assert _status(pm, out)[1]["00_base_model.ipynb"] != "done"

    # 3. the same command again: the base is skipped, its evaluation redone, everything complete
    finished = json.loads((seed_dir / "base" / COMPLETE).read_text())["finished_at"]
    res = subprocess.run(args, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _check_store(pm, out) == {"base": "complete", "base/eval": "complete"}
    assert json.loads((seed_dir / "base" / COMPLETE).read_text())["finished_at"] == finished
    assert _status(pm, out)[1]["00_base_model.ipynb"] == "done"
