"""The run store: completion, skipping, invalidation, failure, SIGKILL recovery, atomic outputs."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import yaml

from acl_lib.config import load_config
from acl_lib.runs import CHECKPOINTS, COMPLETE, FAILED, RUNNING, SUPERSEDED, Run, run_once
from conftest import child_env


def _cfg(tmp_path, *overrides):
    return load_config("smoke", [f"output_dir={tmp_path / 'outputs'}", *overrides], seed=0)


def test_run_completes_then_second_run_once_skips(tmp_path, caplog):
    cfg = _cfg(tmp_path)
    calls = []

    def work(run: Run) -> None:
        calls.append(1)
        run.logger.info("working hard")
        run.write_json("metrics.json", {"score": 42.0})

    run = Run(cfg, "stage_a")
    assert run.path == cfg.seed_dir() / "stage_a" and run.status() == "missing"
    run_once(run, work)
    assert calls == [1] and run.is_complete() and run.status() == "complete"
    done = json.loads((run.path / COMPLETE).read_text())
    assert done["config_hash"] == run.config_hash and done["duration_s"] >= 0 and done["finished_at"]
    assert not (run.path / RUNNING).exists()
    # config.yaml is the resolved config, loadable as YAML
    assert yaml.safe_load((run.path / "config.yaml").read_text()) == cfg.to_dict()
    assert "working hard" in (run.path / "run.log").read_text()
    assert run.read_json("metrics.json") == {"score": 42.0}

    with caplog.at_level(logging.INFO, logger="acl"):
        logging.getLogger("acl").propagate = True  # let caplog see the message
        try:
            run_once(Run(cfg, "stage_a"), work)
        finally:
            logging.getLogger("acl").propagate = False
    assert calls == [1], "a complete run must be skipped"
    assert f"run stage_a is complete (config {run.config_hash}), skipping" in caplog.text


def test_changed_config_reruns_and_moves_the_old_run_aside(tmp_path):
    calls = []

    def work(run: Run) -> None:
        calls.append(run.cfg.eval.k)
        run.write_json("metrics.json", {"k": run.cfg.eval.k})

    first = run_once(Run(_cfg(tmp_path, "eval.k=1"), "ev"), work)
    old_hash = first.config_hash
    changed = Run(_cfg(tmp_path, "eval.k=2"), "ev")
    assert changed.config_hash != old_hash and changed.status() == "stale" and not changed.is_complete()
    run_once(changed, work)
    assert calls == [1, 2] and changed.read_json("metrics.json") == {"k": 2}
    moved = list((changed.cfg.seed_dir() / SUPERSEDED).iterdir())
    assert len(moved) == 1 and moved[0].name.startswith(f"ev-{old_hash}-")
    assert json.loads((moved[0] / "metrics.json").read_text()) == {"k": 1}

    # force re-runs a complete run too
    run_once(Run(_cfg(tmp_path, "eval.k=2"), "ev"), work, force=True)
    assert calls == [1, 2, 2]


def test_sections_and_non_result_keys_decide_what_invalidates(tmp_path):
    work = lambda run: None  # noqa: E731
    run_once(Run(_cfg(tmp_path), "pre", sections=("model", "pretrain")), work)
    assert Run(_cfg(tmp_path, "eval.k=5"), "pre", sections=("model", "pretrain")).is_complete()
    assert not Run(_cfg(tmp_path, "pretrain.max_steps=7"), "pre", sections=("model", "pretrain")).is_complete()
    run_once(Run(_cfg(tmp_path), "all"), work)
    assert Run(_cfg(tmp_path, "torch_threads=1"), "all").is_complete()  # how fast, not what
    assert not Run(_cfg(tmp_path, "eval.k=5"), "all").is_complete()
    with pytest.raises(ValueError, match="unknown config section"):
        Run(_cfg(tmp_path), "x", sections=("nope",))


def test_rerunning_an_input_invalidates_downstream(tmp_path):
    cfg = _cfg(tmp_path)
    up = run_once(Run(cfg, "seq_math"), lambda r: None)
    down = run_once(Run(cfg, "eval/seq_math", inputs=[up]), lambda r: None)
    assert down.is_complete() and down.path == cfg.seed_dir() / "eval" / "seq_math"
    time.sleep(1.1)  # finished_at has second resolution
    run_once(Run(cfg, "seq_math"), lambda r: None, force=True)
    assert Run(cfg, "eval/seq_math", inputs=[up]).status() == "stale"


def test_exception_leaves_failed_and_a_rerun_completes(tmp_path):
    cfg = _cfg(tmp_path)

    def broken(run: Run) -> None:
        run.write_json("partial.json", {})
        raise ValueError("boom at step 3")

    run = Run(cfg, "fragile")
    with pytest.raises(ValueError, match="boom"):
        run_once(run, broken)
    assert run.status() == "failed" and not run.is_complete() and not (run.path / RUNNING).exists()
    failed = json.loads((run.path / FAILED).read_text())
    assert "ValueError: boom at step 3" in failed["error"] and "Traceback" in failed["traceback"]

    run_once(run, lambda r: None)
    assert run.is_complete() and not (run.path / FAILED).exists()
    assert not (run.path / "partial.json").exists(), "partial outputs of the failed attempt must be cleared"
    assert "boom at step 3" in (run.path / "run.log").read_text(), "the log keeps earlier attempts"


_KILLED_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from acl_lib.config import load_config
    from acl_lib.runs import Run, run_once

    cfg = load_config("smoke", [f"output_dir={sys.argv[1]}"], seed=0)

    def slow(run):
        ckpt = run.checkpoint_dir() / "checkpoint-1"
        ckpt.mkdir()
        (ckpt / "weights.bin").write_text("step 1")
        (run.path / "partial_output.txt").write_text("half")
        # the process's own stdout: inside a run, print() goes to the run's log (acl_lib.progress)
        print("READY", file=sys.__stdout__, flush=True)
        time.sleep(120)

    run_once(Run(cfg, "slow"), slow)
    """
)


@pytest.mark.slow
def test_sigkill_midway_leaves_incomplete_run_that_resumes(tmp_path):
    out = tmp_path / "outputs"
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_SCRIPT, str(out)], stdout=subprocess.PIPE, text=True, env=child_env()
    )
    try:
        assert proc.stdout.readline().strip() == "READY"
        run = Run(_cfg(tmp_path), "slow")
        assert run.status() == "running"
        with pytest.raises(RuntimeError, match="already running"):
            with run.start():
                pass
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert (run.path / RUNNING).exists(), "SIGKILL gives no chance to clean up"
    assert run.status() == "failed" and not run.is_complete()

    seen = {}

    def resume(r: Run) -> None:
        ckpts = sorted(p.name for p in r.checkpoint_dir().iterdir() if p.name.startswith("checkpoint-"))
        seen.update(ckpts=ckpts, partial=(r.path / "partial_output.txt").exists())
        r.write_json("metrics.json", {"ok": True})

    run_once(run, resume)
    assert run.is_complete() and run.status() == "complete"
    assert seen == {"ckpts": ["checkpoint-1"], "partial": False}, "checkpoints kept, partial outputs cleared"
    assert (run.path / CHECKPOINTS / "checkpoint-1" / "weights.bin").read_text() == "step 1"


def test_checkpoints_of_another_config_are_discarded(tmp_path):
    run = Run(_cfg(tmp_path, "grpo.max_steps=3"), "train")

    def crash(r: Run) -> None:
        (r.checkpoint_dir() / "checkpoint-2").mkdir()
        raise RuntimeError("oom")

    with pytest.raises(RuntimeError):
        run_once(run, crash)
    same = Run(_cfg(tmp_path, "grpo.max_steps=3"), "train")
    other = Run(_cfg(tmp_path, "grpo.max_steps=9"), "train")
    with other.start():
        assert not (other.path / CHECKPOINTS / "checkpoint-2").exists()
    assert same.status() == "stale"


def test_atomic_dir_never_leaves_a_half_written_dir(tmp_path):
    run = Run(_cfg(tmp_path), "ckpt")
    with pytest.raises(KeyError):
        with run.atomic_dir("model") as d:
            (d / "weights.bin").write_text("half")
            raise KeyError("crash while saving")
    assert not (run.path / "model").exists()
    assert [p.name for p in run.path.iterdir()] == [], "the temporary dir is removed on failure"

    for version in ("v1", "v2"):
        with run.atomic_dir("model") as d:
            (d / "weights.bin").write_text(version)
            assert not (run.path / "model" / "weights.bin").exists() or version == "v2"
    assert (run.path / "model" / "weights.bin").read_text() == "v2"
    assert sorted(p.name for p in run.path.iterdir()) == ["model"], "old version and temp dirs are gone"


def test_write_json_is_atomic_and_round_trips(tmp_path):
    run = Run(_cfg(tmp_path), "j")
    run.write_json("sub/metrics.json", {"aime26": 12.5, "nq": [1, 2]})
    run.write_json("sub/metrics.json", {"aime26": 13.0})
    assert run.read_json("sub/metrics.json") == {"aime26": 13.0}
    assert os.listdir(run.path / "sub") == ["metrics.json"]
