"""``acl run --jobs N`` with several seeds: the notebooks of every seed share the N places, each in a child ``acl
run --seeds k --only NN`` with its share of the threads; the final tables after the last seed; Ctrl-C stops every
notebook as it stops a lone ``acl run``.

The notebooks here are throwaway ones (``conftest.write_notebook``) that record when and with what config they
ran, so the tests see the schedule itself, not the suite's training."""

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

from conftest import ACL, ROOT, child_env, write_notebook

pytestmark = pytest.mark.slow


def _notebooks(d: Path, per_seed_body: list[str]) -> Path:
    """A per-seed notebook 00 with ``per_seed_body`` and an across-seeds notebook 12 that lists the seeds'
    records."""
    write_notebook(d / "00_record.ipynb", per_seed_body)
    final = write_notebook(d / "12_final.ipynb", [
        "import json, pathlib\n"
        "seen = {s: json.loads((cfg.seed_dir().parent / f'seed{s}' / 'record.json').read_text()) for s in seeds}\n"
        "(cfg.seed_dir().parent / 'final.json').write_text(json.dumps(seen))",
    ])
    nb = nbformat.read(str(final), as_version=4)
    nb.metadata["acl"] = {"runs": "once_over_seeds"}
    nbformat.write(nb, str(final))
    return d


RECORD = [
    "import json, os, time\n"
    "t0 = time.time()\n"
    "time.sleep(4)\n"
    "cfg.seed_dir().mkdir(parents=True, exist_ok=True)\n"
    "(cfg.seed_dir() / 'record.json').write_text(json.dumps({'seed': cfg.seed, 'threads': cfg.torch_threads, "
    "'start': t0, 'end': time.time()}))",
]


def test_two_seeds_side_by_side_then_the_final_tables_then_nothing_to_redo(tmp_path):
    nb_dir = _notebooks(tmp_path / "nb", RECORD)
    out, pm = tmp_path / "out", tmp_path / "pm"
    args = [*ACL, "run", "--profile", "smoke", "--seeds", "0", "1", "--notebooks-dir", str(nb_dir),
            "--output-dir", str(out), "--papermill-dir", str(pm), "--set", "torch_threads=4"]
    res = subprocess.run([*args, "--jobs", "2"], cwd=ROOT, env=dict(child_env(), ACL_PNG="0"), capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "up to 2 at a time, 4 torch thread(s) shared" in res.stdout
    assert res.stdout.count("no PNG copies") == 1, res.stdout  # said once by the parent, not again by each seed
    assert "[seed 0 · 00] [1/1] 00_record.ipynb" in res.stdout and "[seed 1 · 00] [1/1] 00_record.ipynb" in res.stdout
    # where the whole run stands, each time a notebook ends
    first, second = [line for line in res.stdout.splitlines() if " notebooks done · " in line]
    assert " done · 1 of 2 notebooks done · " in first, first
    assert first.split("still running: ")[1] in ("seed 0 · 00", "seed 1 · 00"), first
    assert " done · 2 of 2 notebooks done · " in second and second.endswith("still running: nothing"), second

    rec = {s: json.loads((out / "smoke" / f"seed{s}" / "record.json").read_text()) for s in (0, 1)}
    assert rec[0]["threads"] == rec[1]["threads"] == 2  # the budget of 4 divided between two seeds
    # side by side: each seed's notebook started before the other's ended
    assert rec[0]["start"] < rec[1]["end"] and rec[1]["start"] < rec[0]["end"], rec
    # the final tables ran once, after both seeds, and saw both
    final = json.loads((out / "smoke" / "final.json").read_text())
    assert sorted(final) == ["0", "1"]
    assert (pm / "smoke" / "12_final.ipynb").exists()

    # one seed after another now: both seeds' notebook 00 is complete (the thread count changes no result)
    res = subprocess.run(args, cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert res.stdout.count("skipped, complete") == 2, res.stdout


def test_a_failing_seed_lets_the_other_finish_and_skips_the_final_tables(tmp_path):
    nb_dir = _notebooks(tmp_path / "nb", [
        "if cfg.seed == 1:\n    raise RuntimeError('seed one breaks')",
        *RECORD,
    ])
    out, pm = tmp_path / "out", tmp_path / "pm"
    res = subprocess.run([*ACL, "run", "--profile", "smoke", "--seeds", "0", "1", "--jobs", "2", "--notebooks-dir",
                          str(nb_dir), "--output-dir", str(out), "--papermill-dir", str(pm)],
                         cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=600)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert "seed one breaks" in res.stderr and "[seed 1 · 00] FAILED: 00_record.ipynb" in res.stderr
    assert "seed 0: 1 ok" in res.stdout and "seed 1: 0 ok, 00 failed (exit 1)" in res.stdout
    assert "00_record.ipynb of seed 1 failed" in res.stderr
    assert (out / "smoke" / "seed0" / "record.json").exists()
    assert not (out / "smoke" / "final.json").exists() and "final tables were not run" in res.stderr


def test_ctrl_c_stops_every_seed_and_leaves_no_process(tmp_path):
    nb_dir = _notebooks(tmp_path / "nb", [
        "import json, os, time\n"
        "from ipykernel.connect import get_connection_info\n"
        "cfg.seed_dir().mkdir(parents=True, exist_ok=True)\n"
        "conn = get_connection_info(unpack=True)\n"
        "(cfg.seed_dir() / 'kernel.json').write_text(json.dumps({'pid': os.getpid(), "
        "'connection': {'transport': conn['transport'], 'ip': conn['ip']}}))\n"
        "time.sleep(600)",
    ])
    out, pm = tmp_path / "out", tmp_path / "pm"
    # SIGINT at its default disposition, as in a terminal (a test run in the background inherits it ignored)
    proc = subprocess.Popen([*ACL, "run", "--profile", "smoke", "--seeds", "0", "1", "--jobs", "2",
                             "--notebooks-dir", str(nb_dir), "--output-dir", str(out), "--papermill-dir", str(pm)],
                            cwd=ROOT, env=child_env(), start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    markers = [out / "smoke" / f"seed{s}" / "kernel.json" for s in (0, 1)]
    deadline = time.time() + 240
    while not all(m.exists() for m in markers):
        assert proc.poll() is None and time.time() < deadline, "the kernels never started"
        time.sleep(0.2)
    tree = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    # the two kernels started at once: each talks over socket files in a directory of its own, not over TCP
    # ports, which two processes starting kernels at the same moment can both be handed (a kernel then got the
    # other's messages: "DELIM not in msg_list", "Address already in use")
    conns = [json.loads(m.read_text())["connection"] for m in markers]
    sockets = [Path(c["ip"]).parent for c in conns]
    assert [c["transport"] for c in conns] == ["ipc", "ipc"] and sockets[0] != sockets[1], conns
    assert all(d.is_dir() for d in sockets)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in a terminal: the foreground group, here acl alone
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stdout[-3000:] + stderr[-3000:]
    for s in (0, 1):
        assert f"[seed {s} · 00] " in stderr and "interrupted in 00_record.ipynb" in stderr, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert "the same command resumes" in stderr
    assert not (out / "smoke" / "final.json").exists()
    time.sleep(2)  # a kernel exits about a second after its parent
    alive = [pid for pid in tree if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left running: {alive}"
    assert not any(d.exists() for d in sockets), "a kernel's socket directory was left behind"


def _timed(name: str, sleep: float) -> list[str]:
    return [
        "import json, time\n"
        "t0 = time.time()\n"
        f"time.sleep({sleep})\n"
        "cfg.seed_dir().mkdir(parents=True, exist_ok=True)\n"
        f"(cfg.seed_dir() / '{name}.json').write_text(json.dumps({{'start': t0, 'end': time.time()}}))",
    ]


def test_the_seeds_share_the_places_and_a_notebook_waits_only_for_its_own_seed(tmp_path):
    nb_dir, out, pm = tmp_path / "nb", tmp_path / "out", tmp_path / "pm"
    write_notebook(nb_dir / "00_a.ipynb", _timed("a", 1))
    write_notebook(nb_dir / "01_b.ipynb", _timed("b", 10))
    c = write_notebook(nb_dir / "02_c.ipynb", _timed("c", 1))
    nb = nbformat.read(str(c), as_version=4)
    nb.metadata["acl"] = {"after": ["00"]}  # reads only 00: beside 01
    nbformat.write(nb, str(c))
    res = subprocess.run([*ACL, "run", "--profile", "smoke", "--seeds", "0", "1", "--jobs", "3", "--notebooks-dir",
                          str(nb_dir), "--output-dir", str(out), "--papermill-dir", str(pm)],
                         cwd=ROOT, env=dict(child_env(), ACL_PNG="0"), capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rec = {(s, n): json.loads((out / "smoke" / f"seed{s}" / f"{n}.json").read_text()) for s in (0, 1) for n in "abc"}
    for s in (0, 1):  # each seed's 01 and 02 wait for its own 00
        assert rec[s, "a"]["end"] < min(rec[s, "b"]["start"], rec[s, "c"]["start"])
    # seed 1's 01 ran while seed 0's 01 did: the seeds share the places
    assert rec[1, "b"]["start"] < rec[0, "b"]["end"], rec
    # never more than three at once: at every start, count the notebooks running
    for key, r in rec.items():
        running = [k for k, o in rec.items() if o["start"] <= r["start"] < o["end"]]
        assert len(running) <= 3, (key, running)
    assert "seed 0: 3 ok" in res.stdout and "seed 1: 3 ok" in res.stdout
