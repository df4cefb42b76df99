"""``acl run --jobs N`` on one seed: its notebooks side by side, each in a child ``acl run --only NN``, started
once the notebooks it reads (``metadata.acl.after``, or every earlier one) are done; a failure stops what needs it
and nothing else; Ctrl-C stops them all.

The notebooks are throwaway ones (``conftest.write_notebook``) that record when they ran and with how many
threads, so the tests see the schedule itself, not the suite's training."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from acl_lib import notebooks as nbs
from conftest import ACL, ROOT, child_env, write_notebook

pytestmark = pytest.mark.slow


def _record(name: str, sleep: float = 3.0, fail: bool = False) -> list[str]:
    return [
        "import json, time\n"
        "t0 = time.time()\n"
        f"time.sleep({sleep})\n"
        + ("raise RuntimeError('notebook breaks')\n" if fail else "")
        + "cfg.seed_dir().mkdir(parents=True, exist_ok=True)\n"
        f"(cfg.seed_dir() / '{name}.json').write_text(json.dumps({{'threads': cfg.torch_threads, 'start': t0, "
        "'end': time.time()}))",
    ]


def _write(d: Path, name: str, body: list[str], after: list[str] | None = None) -> Path:
    path = write_notebook(d / f"{name}.ipynb", body)
    if after is not None:
        nb = nbformat.read(str(path), as_version=4)
        nb.metadata["acl"] = {"after": after}
        nbformat.write(nb, str(path))
    return path


def _run(nb_dir: Path, out: Path, pm: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([*ACL, "run", "--profile", "smoke", "--seeds", "0", "--notebooks-dir", str(nb_dir),
                           "--output-dir", str(out), "--papermill-dir", str(pm), *extra],
                          cwd=ROOT, env=dict(child_env(), ACL_PNG="0"), capture_output=True, text=True, timeout=600)


def test_prerequisites_are_the_after_list_or_every_earlier_notebook(tmp_path):
    a = _write(tmp_path, "00_a", [])
    b = _write(tmp_path, "01_b", [])
    c = _write(tmp_path, "02_c", [], after=["00"])
    d = _write(tmp_path, "03_d", [])
    per_seed = [a, b, c, d]
    assert nbs.prerequisites(c, per_seed) == [a]
    assert nbs.prerequisites(d, per_seed) == [a, b, c]
    assert nbs.prerequisites(c, [b, c]) == []  # one --only left out is not waited for
    assert nbs.check_conventions(c) == []
    late = _write(tmp_path, "04_late", [], after=["05"])
    assert any("after must list earlier" in p for p in nbs.check_conventions(late))


def test_a_free_place_goes_to_the_notebook_most_others_wait_on(tmp_path):
    a = _write(tmp_path, "00_a", [])
    b = _write(tmp_path, "01_b", [])
    c = _write(tmp_path, "02_c", [], after=["00"])
    d = _write(tmp_path, "03_d", [], after=["01"])
    assert nbs.waiting_on([a, b, c, d]) == {a: 3, b: 1, c: 0, d: 0}  # d waits on a through b
    # the suite's own: a seed's stages and oracles before another seed's diagnostics and tables
    per_seed = [nb for nb in nbs.default_notebooks(nbs.list_notebooks(ROOT / "notebooks")) if not nbs.across_seeds(nb)]
    waiting = {nb.name[:2]: n for nb, n in nbs.waiting_on(per_seed).items()}
    assert waiting["03"] > waiting["06"] > waiting["08"] and waiting["05"] > waiting["10"] and waiting["11"] == 0


def test_a_notebook_starts_when_what_it_reads_is_done_with_its_share_of_the_threads(tmp_path):
    nb_dir, out, pm = tmp_path / "nb", tmp_path / "out", tmp_path / "pm"
    _write(nb_dir, "00_a", _record("a"))
    _write(nb_dir, "01_b", _record("b", sleep=6))
    _write(nb_dir, "02_c", _record("c"), after=["00"])  # reads only 00: beside 01
    _write(nb_dir, "03_d", _record("d"))  # reads everything before it
    res = _run(nb_dir, out, pm, "--jobs", "2", "--set", "torch_threads=4")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "[02] [1/1] 02_c.ipynb" in res.stdout
    rec = {n: json.loads((out / "smoke" / "seed0" / f"{n}.json").read_text()) for n in "abcd"}
    assert rec["a"]["end"] < min(rec["b"]["start"], rec["c"]["start"])
    assert rec["b"]["start"] < rec["c"]["end"] and rec["c"]["start"] < rec["b"]["end"], rec  # side by side
    assert rec["d"]["start"] > max(rec["b"]["end"], rec["c"]["end"])
    # alone, a notebook has all 4 threads; two started together have 2 each
    assert (rec["a"]["threads"], rec["b"]["threads"], rec["c"]["threads"], rec["d"]["threads"]) == (4, 2, 2, 4)
    # the same command again: every notebook is complete, nothing runs
    res = _run(nb_dir, out, pm, "--jobs", "2", "--set", "torch_threads=4")
    assert res.returncode == 0 and res.stdout.count("skipped, complete") == 4, res.stdout[-3000:]


def test_a_notebook_left_alone_takes_the_threads_of_the_one_that_ended(tmp_path):
    """Two notebooks side by side have half the threads each; when one ends, the other's share (the file its
    ACL_THREADS_FILE names, which trainers and evaluations follow) becomes the whole budget."""
    nb_dir, out, pm = tmp_path / "nb", tmp_path / "out", tmp_path / "pm"
    _write(nb_dir, "00_a", [])
    watch = ("import json, time\n"
             "from acl_lib.seeding import thread_share\n"
             "seen, t0 = [], time.time()\n"
             "while time.time() - t0 < 12 and (not seen or seen[-1] != 4 or len(seen) < 2):\n"
             "    n = thread_share(-1)\n"
             "    if not seen or seen[-1] != n:\n"
             "        seen.append(n)\n"
             "    time.sleep(0.1)\n"
             "cfg.seed_dir().mkdir(parents=True, exist_ok=True)\n"
             "(cfg.seed_dir() / 'b.json').write_text(json.dumps(seen))")
    _write(nb_dir, "01_b", [watch], after=["00"])
    _write(nb_dir, "02_c", _record("c", sleep=2), after=["00"])
    res = _run(nb_dir, out, pm, "--jobs", "2", "--set", "torch_threads=4")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert json.loads((out / "smoke" / "seed0" / "b.json").read_text()) == [2, 4]


def test_a_failing_notebook_stops_what_needs_it_and_nothing_else(tmp_path):
    nb_dir, out, pm = tmp_path / "nb", tmp_path / "out", tmp_path / "pm"
    _write(nb_dir, "00_a", _record("a", sleep=0))
    _write(nb_dir, "01_b", _record("b", sleep=0, fail=True))
    _write(nb_dir, "02_c", _record("c", sleep=4), after=["00"])
    _write(nb_dir, "03_d", _record("d", sleep=0))
    res = _run(nb_dir, out, pm, "--jobs", "2")
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert "notebook breaks" in res.stderr and "01_b.ipynb failed" in res.stderr and "not run: 03" in res.stderr
    seed_dir = out / "smoke" / "seed0"
    assert (seed_dir / "c.json").exists() and not (seed_dir / "d.json").exists()


def test_ctrl_c_stops_every_notebook_and_leaves_no_process(tmp_path):
    nb_dir, out, pm = tmp_path / "nb", tmp_path / "out", tmp_path / "pm"
    _write(nb_dir, "00_a", _record("a", sleep=0))
    for name in ("01_b", "02_c"):
        _write(nb_dir, name, [
            "import json, os, time\n"
            "cfg.seed_dir().mkdir(parents=True, exist_ok=True)\n"
            f"(cfg.seed_dir() / '{name}.pid').write_text(str(os.getpid()))\n"
            "time.sleep(600)",
        ], after=["00"])
    proc = subprocess.Popen([*ACL, "run", "--profile", "smoke", "--seeds", "0", "--jobs", "2", "--notebooks-dir",
                             str(nb_dir), "--output-dir", str(out), "--papermill-dir", str(pm)],
                            cwd=ROOT, env=dict(child_env(), ACL_PNG="0"), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    markers = [out / "smoke" / "seed0" / f"{n}.pid" for n in ("01_b", "02_c")]
    deadline = time.time() + 240
    while not all(m.exists() for m in markers):
        assert proc.poll() is None and time.time() < deadline, "the kernels never started"
        time.sleep(0.2)
    tree = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the foreground group, here acl alone
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stdout[-3000:] + stderr[-3000:]
    assert "interrupted in 01_b.ipynb" in stderr and "interrupted in 02_c.ipynb" in stderr, stderr[-3000:]
    assert "Traceback" not in stderr and "the same command resumes" in stderr, stderr[-3000:]
    time.sleep(2)  # a kernel exits about a second after its parent
    alive = [pid for pid in tree if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left running: {alive}"


def test_one_notebook_interrupted_on_its_own_stops_the_others(tmp_path):
    """SIGINT sent to one child (as `kill -INT` on its process group, or a parent run in the background, which keeps
    SIGINT ignored) stops the whole schedule as a Ctrl-C to the parent would: nothing more starts."""
    nb_dir, out, pm = tmp_path / "nb", tmp_path / "out", tmp_path / "pm"
    _write(nb_dir, "00_a", _record("a", sleep=0))
    for name in ("01_b", "02_c"):
        _write(nb_dir, name, [
            "import json, os, time\n"
            "cfg.seed_dir().mkdir(parents=True, exist_ok=True)\n"
            f"(cfg.seed_dir() / '{name}.pid').write_text(str(os.getpid()))\n"
            "time.sleep(600)",
        ], after=["00"])
    _write(nb_dir, "03_d", _record("d", sleep=0), after=["00"])
    proc = subprocess.Popen([*ACL, "run", "--profile", "smoke", "--seeds", "0", "--jobs", "2", "--notebooks-dir",
                             str(nb_dir), "--output-dir", str(out), "--papermill-dir", str(pm)],
                            cwd=ROOT, env=dict(child_env(), ACL_PNG="0"), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    markers = [out / "smoke" / "seed0" / f"{n}.pid" for n in ("01_b", "02_c")]
    deadline = time.time() + 240
    while not all(m.exists() for m in markers):
        assert proc.poll() is None and time.time() < deadline, "the kernels never started"
        time.sleep(0.2)
    tree = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    child = next(p for p in psutil.Process(proc.pid).children() if "01" in p.cmdline())  # acl run ... --only 01
    os.killpg(child.pid, signal.SIGINT)  # the child of notebook 01 only (each child is a session of its own)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stdout[-3000:] + stderr[-3000:]
    assert "interrupted in 01_b.ipynb" in stderr and "interrupted in 02_c.ipynb" in stderr, stderr[-3000:]
    assert not (out / "smoke" / "seed0" / "d.json").exists() and "[03]" not in stdout  # nothing more started
    time.sleep(2)  # a kernel exits about a second after its parent
    alive = [pid for pid in tree if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left running: {alive}"
