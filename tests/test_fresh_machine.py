"""What a new user's machine does: no browser for PNG export, and Ctrl-C that always stops ``acl run``.

A fresh machine has no Chrome. kaleido then cannot export PNGs, and its sync server used to make the first
figure wait forever (``make run`` hung in notebook 00's first cell). These tests hide any installed Chrome by
pointing the browser lookup at an empty directory (``BROWSER_PATH``, which the suite's lookup and kaleido's
honour), so CI machines with Chromium installed also see the no-browser path.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from acl_lib import png_export
from conftest import ACL, ROOT, child_env

TINY = ["--set", "pretrain.corpus_chars=60000", "pretrain.max_steps=60", "worlds.n_test=1", "worlds.n_ood=1",
        "eval.max_new_tokens=4", "eval.max_turns=2"]


def no_chrome_env(tmp_path: Path) -> dict[str, str]:
    """A child environment in which the browser lookup finds nothing (an empty directory), whatever is installed."""
    empty = tmp_path / "no-browser-here"
    empty.mkdir(exist_ok=True)
    env = child_env()
    env["BROWSER_PATH"] = str(empty)
    env.pop(png_export.PNG_ENV, None)
    env.pop(png_export.WHY_ENV, None)
    return env


def _decide_in_child(env: dict[str, str]) -> tuple[bool, str, float]:
    code = ("import json, time; from acl_lib import png_export as p; t = time.perf_counter(); ok, why = p.decide(); "
            "print(json.dumps([ok, why, time.perf_counter() - t]))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    return tuple(json.loads(res.stdout.strip().splitlines()[-1]))


def test_without_a_browser_png_export_is_off_at_once(tmp_path):
    ok, why, seconds = _decide_in_child(no_chrome_env(tmp_path))
    assert not ok and why == "no Chrome or Chromium found"
    assert seconds < 5, f"deciding took {seconds:.1f} s"
    hint = png_export.hint(why)
    assert "plotly_get_chrome" in hint and "chromium" in hint.lower()


def test_acl_png_0_turns_png_export_off(tmp_path):
    env = child_env()
    env[png_export.PNG_ENV] = "0"
    env.pop(png_export.WHY_ENV, None)
    ok, why, _ = _decide_in_child(env)
    assert not ok and why == "ACL_PNG=0"
    assert png_export.hint(why) == "Figures: interactive only, no PNG copies (ACL_PNG=0)."


@pytest.mark.slow
def test_a_browser_that_hangs_is_given_up_in_bounded_time(tmp_path):
    """A "Chrome" that never answers (a script that sleeps): the probe is killed at its time limit, with the
    browser it started, and the answer is no PNG."""
    fake = tmp_path / "chrome"
    fake.write_text("#!/bin/sh\nsleep 3600\n")
    fake.chmod(0o755)
    env = child_env()
    env["BROWSER_PATH"] = str(fake)
    env.pop(png_export.PNG_ENV, None)
    code = ("import json; from acl_lib import png_export as p; print(json.dumps(p.decide(timeout_s=15)))")
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    elapsed = time.perf_counter() - t0
    assert res.returncode == 0, res.stderr
    ok, why = json.loads(res.stdout.strip().splitlines()[-1])
    assert not ok and ("did not finish" in why or "failed" in why), why
    assert elapsed < 60
    left = subprocess.run(["pgrep", "-f", str(fake)], capture_output=True, text=True)
    assert not left.stdout.strip(), "the hung browser was left running"


@pytest.mark.slow
@pytest.mark.skipif(png_export.find_chrome() is None, reason="no Chrome or Chromium installed here")
def test_with_a_browser_png_export_works():
    ok, why = png_export.probe()
    assert ok, why


@pytest.mark.slow
def test_notebook_00_completes_without_a_browser_with_its_figures_in_html(tmp_path):
    from nbconvert import HTMLExporter

    pm, out = tmp_path / "pm", tmp_path / "out"
    t0 = time.perf_counter()
    res = subprocess.run([*ACL, "run", "--profile", "smoke", "--only", "00", *TINY, "--papermill-dir", str(pm),
                          "--output-dir", str(out)], cwd=ROOT, env=no_chrome_env(tmp_path), capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "no PNG copies (no Chrome or Chromium found)" in res.stdout
    executed = pm / "smoke" / "seed0" / "00_base_model.ipynb"
    cells = json.loads(executed.read_text())["cells"]
    outputs = [o for c in cells for o in c.get("outputs", [])]
    figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert figures, "notebook 00 drew no figure"
    assert not any("image/png" in o["data"] for o in figures), "a PNG copy without a browser?"
    text = "".join("".join(o.get("text", "")) for o in outputs if o.get("output_type") == "stream")
    assert "plotly_get_chrome" in text, "the notebook does not say how to get PNG copies"
    html, _ = HTMLExporter().from_filename(str(executed))
    assert html.count("Plotly.newPlot(") >= len(figures), "figures missing from the nbconvert HTML"
    assert "plotly.js v" in html and 'src="https://cdn.plot.ly' not in html, "plotly.js not embedded"
    assert not list(out.rglob("*.png")), "PNG files written without a browser"
    print(f"notebook 00 at smoke without a browser: {time.perf_counter() - t0:.1f} s")


# --- Ctrl-C ------------------------------------------------------------------------------------------------


def _sigint_default():
    # A test run in the background (a CI job, `make test &`) inherits SIGINT ignored, and so would acl: give it
    # the default disposition, as in a terminal.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.time() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def _stuck_notebook(directory: Path, marker: Path) -> Path:
    """Notebook 00 with a cell, right after its config cell, that ignores SIGINT and sleeps for an hour."""
    nb = json.loads((ROOT / "notebooks" / "00_base_model.ipynb").read_text())
    config_cell = next(i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
                       and "load_config(" in "".join(c["source"]))
    stuck = textwrap.dedent(f"""\
        import os, pathlib, signal, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        pathlib.Path({str(marker)!r}).write_text(str(os.getpid()))
        time.sleep(3600)
        """)
    nb["cells"].insert(config_cell + 1, {"cell_type": "code", "execution_count": None, "id": "stuck-cell",
                                         "metadata": {}, "outputs": [], "source": stuck})
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "00_base_model.ipynb"
    path.write_text(json.dumps(nb, indent=1))
    return path


@pytest.mark.slow
def test_ctrl_c_stops_acl_run_while_a_cell_ignores_sigint(tmp_path):
    nb_dir, pm, out, marker = tmp_path / "notebooks", tmp_path / "pm", tmp_path / "out", tmp_path / "kernel.pid"
    _stuck_notebook(nb_dir, marker)
    dirs = ["--notebooks-dir", str(nb_dir), "--papermill-dir", str(pm), "--output-dir", str(out)]
    proc = subprocess.Popen([*ACL, "run", "--profile", "smoke", "--only", "00", *dirs], cwd=ROOT, env=child_env(),
                            start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_sigint_default)
    _wait_for(marker, proc, timeout=300)
    kernel = int(marker.read_text())
    t0 = time.perf_counter()
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal signals the foreground process group
    try:
        _, stderr = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("acl run still running 15 s after Ctrl-C")
    stopped_in = time.perf_counter() - t0
    assert proc.returncode == 130, stderr[-3000:]
    assert "interrupted in 00_base_model.ipynb" in stderr
    deadline = time.time() + 10
    while _alive(kernel) and time.time() < deadline:
        time.sleep(0.2)
    assert not _alive(kernel), "the kernel outlived acl run"
    res = subprocess.run([*ACL, "status", "--profile", "smoke", "--seeds", "0", *dirs], cwd=ROOT, env=child_env(),
                         capture_output=True, text=True, timeout=120)
    states = {c[1]: c[2] for c in (line.split() for line in res.stdout.splitlines()) if len(c) >= 3 and c[0] == "0"}
    assert states.get("00_base_model.ipynb") == "interrupted", res.stdout
    print(f"acl run stopped {stopped_in:.1f} s after Ctrl-C")


# A caller that never gives up waiting (as a papermill blocked on a kernel that does not answer), with a child
# process in its own session (as a kernel): only the watchdog can end it.
_NEVER_RETURNS = """
import subprocess, sys, time
from pathlib import Path
from acl_lib import notebooks as nbs
out = Path(sys.argv[1])
out.write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
child = subprocess.Popen(["sleep", "3600"], start_new_session=True)
Path(sys.argv[2]).write_text(str(child.pid))
nbs._Stopper("00_stuck.ipynb", out).install()
while True:
    try:
        time.sleep(3600)
    except KeyboardInterrupt:
        pass
"""


def _start_never_returning(tmp_path: Path) -> tuple[subprocess.Popen, Path, int]:
    executed, marker = tmp_path / "00_stuck.ipynb", tmp_path / "child.pid"
    proc = subprocess.Popen([sys.executable, "-c", _NEVER_RETURNS, str(executed), str(marker)], cwd=ROOT,
                            env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_sigint_default)
    _wait_for(marker, proc, timeout=60)
    time.sleep(0.5)  # the handler is installed right after the marker is written
    return proc, executed, int(marker.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_ends_a_run_whose_cell_never_stops(tmp_path, presses):
    """One Ctrl-C: the kernel is killed after the grace period and the process exits 130 within 15 s; a second
    Ctrl-C does it at once. The executed copy says interrupted."""
    from acl_lib.notebooks import notebook_state

    proc, executed, child = _start_never_returning(tmp_path)
    t0 = time.perf_counter()
    for _ in range(presses):
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
    try:
        _, stderr = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        os.kill(child, signal.SIGKILL)
        pytest.fail("still running 15 s after Ctrl-C")
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 130, stderr
    assert "interrupted in 00_stuck.ipynb" in stderr
    if presses == 2:
        assert elapsed < 5, f"a second Ctrl-C took {elapsed:.1f} s"
    assert not _alive(child), "the kernel's process was left running"
    assert notebook_state(executed)[0] == "interrupted"
