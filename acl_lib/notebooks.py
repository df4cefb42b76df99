"""Notebook plumbing: list the ordered notebooks, execute them with papermill, read back their state,
strip outputs before commit, and check the suite's notebook conventions.

Conventions (checked by ``check_conventions``, enforced by tests/test_notebooks_conventions.py):

* name ``NN_lower_snake.ipynb``; notebooks run in the order of their two-digit prefix, once per seed, unless
  their own metadata says otherwise (``metadata.acl``, see ``schedule``);
* the first cell is markdown with the exact ``papermill notebooks/NAME.ipynb papermill_runs/...`` command;
* exactly one code cell tagged ``parameters`` with flat literal ``profile`` (default ``"mini"``), ``seed``,
  ``overrides``;
  the next code cell resolves ``load_config(profile, overrides, seed=seed)``;
* committed without outputs or execution counts (``acl nbstrip`` cleans them).

Papermill and nbformat are imported inside the functions that need them, so importing this module is cheap.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any

from acl_lib import processes
from acl_lib.atomic import atomic_write_text, write_json
from acl_lib.progress import PROGRESS_FILE_ENV

NAME_RE = re.compile(r"^\d\d_[a-z0-9_]+\.ipynb$")
# The kernel notebooks run under: "python3" as found first in this interpreter's own prefix (see
# _prefer_own_kernels), i.e. the venv's python when `acl run` is the venv's.
KERNEL_NAME = "python3"
# The kernelspec committed notebooks carry: the one `make install` registers in the venv (JupyterLab writes its
# display name into a notebook it saves).
KERNELSPEC = {"display_name": "Python 3 (acl-suite)", "language": "python", "name": KERNEL_NAME}
REQUIRED_PARAMETERS = ("profile", "seed", "overrides")
DEFAULT_PROFILE = "mini"  # what a notebook opened in JupyterLab runs, as `make run` does
KERNEL_LOG_LEVEL = "CRITICAL"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def list_notebooks(directory: str | Path = "notebooks", only: list[str] | None = None) -> list[Path]:
    """The suite's notebooks in ``directory``, sorted by their two-digit prefix.

    ``only``: keep notebooks whose prefix is in this list (``"3"`` and ``"03"`` both mean 03). Raises
    ``ValueError`` for a prefix that matches no notebook, so a typo does not silently run nothing.
    """
    directory = Path(directory)
    notebooks = sorted(p for p in directory.glob("*.ipynb") if NAME_RE.match(p.name))
    if only is None:
        return notebooks
    wanted = {str(o).zfill(2) for o in only}
    have = {p.name[:2] for p in notebooks}
    unknown = sorted(wanted - have)
    if unknown:
        raise ValueError(f"--only {unknown}: no notebook with that prefix in {directory} (have {sorted(have)})")
    return [p for p in notebooks if p.name[:2] in wanted]


# How ``acl run`` schedules a notebook is written in the notebook itself, in its metadata (JupyterLab: Property
# Inspector, "Notebook metadata"), never in the library; ``acl nbstrip`` keeps it:
#
#     "acl": {"runs": "once_over_seeds"}   the notebook reads every seed (the final tables): it runs once, after the
#                                          per-seed notebooks of all seeds, with ``seeds`` (a list) among its
#                                          parameters; its executed copy goes to <papermill_dir>/<profile>/
#     "acl": {"opt_in": true}              left out of ``acl run`` unless named with --only (the curriculum orders:
#                                          four more sequences of training; ``make curriculum``)
#     "acl": {"after": ["01"]}             the per-seed notebooks (by prefix, all earlier than this one) whose runs
#                                          this one reads: ``acl run --jobs 2`` on one seed may start it as soon as
#                                          those are done (the oracles of 05 need the base and seq_math, not the
#                                          stages of 02-04). Without it: every earlier per-seed notebook.
#
# Without it a notebook runs once per seed.
SCHEDULE_KEY = "acl"
RUNS = ("per_seed", "once_over_seeds")
SCHEDULE_DEFAULTS = {"runs": "per_seed", "opt_in": False, "after": None}


def schedule(notebook: str | Path) -> dict[str, Any]:
    """How ``acl run`` schedules ``notebook``: ``{"runs": "per_seed" | "once_over_seeds", "opt_in": bool}``, read
    from its ``metadata.acl`` (defaults for what it leaves out)."""
    meta = json.loads(Path(notebook).read_text()).get("metadata", {}).get(SCHEDULE_KEY) or {}
    return {k: meta.get(k, default) for k, default in SCHEDULE_DEFAULTS.items()}


def default_notebooks(notebooks: list[Path], only: list[str] | None = None) -> list[Path]:
    """``notebooks`` without the opt-in ones, unless ``only`` was given (then ``only`` already chose)."""
    if only is not None:
        return list(notebooks)
    return [p for p in notebooks if not schedule(p)["opt_in"]]


def across_seeds(notebook: str | Path) -> bool:
    """Whether ``notebook`` runs once over all the seeds (``metadata.acl.runs``), not once per seed."""
    return schedule(notebook)["runs"] == "once_over_seeds"


def prerequisites(notebook: Path, per_seed: list[Path]) -> list[Path]:
    """The notebooks of ``per_seed`` that must finish before ``notebook`` starts (``metadata.acl.after``, or every
    earlier one); those ``--only`` left out are not waited for. The order of prefixes stays the order of a
    one-at-a-time run, so ``after`` may name only earlier notebooks (``check_conventions``)."""
    after = schedule(notebook)["after"]
    own = notebook.name[:2]
    if after is None:
        return [p for p in per_seed if p.name[:2] < own]
    wanted = {str(a).zfill(2) for a in after}
    return [p for p in per_seed if p.name[:2] in wanted]


def waiting_on(per_seed: list[Path]) -> dict[Path, int]:
    """For each notebook of ``per_seed``, how many of the others wait on it, directly or through another: the
    order in which ``acl run --jobs`` fills a free place (most first), so that a seed's long chain of stages
    starts before another seed's last tables while both are ready."""
    needs = {nb: set(prerequisites(nb, per_seed)) for nb in per_seed}
    for nb in per_seed:  # prefix order: every prerequisite is earlier, so its own needs are already closed
        for d in list(needs[nb]):
            needs[nb] |= needs[d]
    return {nb: sum(nb in needs[other] for other in per_seed) for nb in per_seed}


@dataclass(frozen=True)
class Job:
    """One notebook execution of ``acl run``: ``seed`` is the seed of a per-seed notebook, or the first seed of
    an across-seeds one (its ``seed`` parameter); ``seeds`` is set for the latter only."""

    notebook: Path
    seed: int
    seeds: tuple[int, ...] | None = None

    def parameters(self, profile: str, overrides: list[str]) -> dict[str, Any]:
        params = {"profile": profile, "seed": self.seed, "overrides": list(overrides)}
        if self.seeds is not None:
            params["seeds"] = list(self.seeds)
        return params

    def output(self, papermill_dir: str | Path, profile: str) -> Path:
        if self.seeds is not None:
            return across_seeds_path(papermill_dir, profile, self.notebook)
        return executed_path(papermill_dir, profile, self.seed, self.notebook)

    def label(self) -> str:
        return f"seeds {' '.join(map(str, self.seeds))}" if self.seeds is not None else f"seed {self.seed}"


def plan_jobs(notebooks: list[Path], seeds: list[int]) -> list[Job]:
    """What ``acl run`` executes, in order: every per-seed notebook for the first seed, then for the next ...,
    then each across-seeds notebook (the final tables) once over all the seeds."""
    seeds = list(seeds)
    per_seed = [nb for nb in notebooks if not across_seeds(nb)]
    jobs = [Job(nb, seed) for seed in seeds for nb in per_seed]
    jobs += [Job(nb, seeds[0], tuple(seeds)) for nb in notebooks if across_seeds(nb)]
    return jobs


def executed_path(papermill_dir: str | Path, profile: str, seed: int, notebook: str | Path) -> Path:
    """``<papermill_dir>/<profile>/seed<k>/<notebook name>``: where the executed copy of a notebook goes."""
    return Path(papermill_dir) / profile / f"seed{seed}" / Path(notebook).name


def across_seeds_path(papermill_dir: str | Path, profile: str, notebook: str | Path) -> Path:
    """``<papermill_dir>/<profile>/<notebook name>``: the executed copy of a notebook that reads every seed."""
    return Path(papermill_dir) / profile / Path(notebook).name


@dataclass
class NotebookFailed(Exception):
    """A notebook raised. ``output`` is the executed copy; the rest describes the failing cell."""

    output: Path
    cell_index: int | None
    source: str
    error: str

    def __str__(self) -> str:
        where = f"cell {self.cell_index}" if self.cell_index is not None else "a cell"
        src = "\n".join("    " + line for line in self.source.rstrip().splitlines())
        return (f"notebook failed at {where}; executed copy: {self.output}\n--- cell source ---\n{src}\n"
                f"--- error ---\n{self.error}")


def execute(
    notebook: str | Path,
    output: str | Path,
    parameters: dict[str, Any],
    *,
    cwd: str | Path | None = None,
    progress_bar: bool = True,
    kernel_name: str = KERNEL_NAME,
) -> Path:
    """Execute ``notebook`` with papermill into ``output`` (parent dirs created), injecting ``parameters``.

    Raises ``NotebookFailed`` (with the failing cell's source and error) if a cell raises or the kernel dies.
    """
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    _prefer_own_kernels()
    socket_dir = _kernel_socket_dir()
    stop = _Stopper(notebook, output, socket_dir)
    try:
        stop.install()
        pm.execute_notebook(
            str(notebook),
            str(output),
            parameters=parameters,
            kernel_name=kernel_name,
            progress_bar=progress_bar,
            cwd=str(cwd) if cwd is not None else None,
            kernel_manager_class=_socket_file_kernel_manager(socket_dir),
            # The kernel's own log goes to our stderr. On Ctrl-C papermill shuts the kernel down while a cell
            # runs, and the kernel then logs a ZMQError traceback that says nothing about the notebook; cell
            # errors reach us as messages, not through this log.
            extra_arguments=[f"--IPKernelApp.log_level={KERNEL_LOG_LEVEL}"],
        )
    except KeyboardInterrupt:
        # papermill records an end time on its way out, so the copy would read as done: mark it interrupted
        _mark_interrupted(output)
        # nbclient's cell task may end with "Kernel died" after the interrupt; asyncio would log that as a
        # "Task exception was never retrieved" traceback when the task is collected
        import logging

        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
        raise
    except PapermillExecutionError as exc:
        if stop.requested:  # the kernel stopped because we asked it to: an interruption, not a failure
            _mark_interrupted(output)
            raise KeyboardInterrupt from None
        error = _ANSI.sub("", "\n".join(exc.traceback)) or f"{exc.ename}: {exc.evalue}"
        raise NotebookFailed(output, exc.cell_index, exc.source, error) from None
    except Exception as exc:  # a dead kernel, a timeout: no cell-level error object from papermill
        if stop.requested:
            _mark_interrupted(output)
            raise KeyboardInterrupt from None
        index, source = _last_started_cell(output)
        raise NotebookFailed(output, index, source, f"{type(exc).__name__}: {exc}") from None
    finally:
        stop.uninstall()
        shutil.rmtree(socket_dir, ignore_errors=True)
    if stop.requested:  # the cell ended within the grace period, but the user asked to stop
        _mark_interrupted(output)
        raise KeyboardInterrupt
    return output


def _kernel_socket_dir() -> str:
    """A fresh private directory (0700) for one kernel's socket files: a short path, as a Unix socket's is
    limited to about 100 bytes. Its name carries this process's id: the directories of processes that died
    without cleaning up (SIGKILL) are removed here, those of live ones never."""
    import psutil

    base = tempfile.gettempdir()
    if len(base) > 60 and os.path.isdir("/tmp"):
        base = "/tmp"
    for old in Path(base).glob("acl-kernel-*-*"):
        pid = old.name.split("-")[2]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"acl-kernel-{os.getpid()}-", dir=base)


def _socket_file_kernel_manager(socket_dir: str):
    """The kernel manager papermill starts the kernel with: kernel and client talk over Unix socket files in
    ``socket_dir`` (ZeroMQ's ``ipc`` transport) instead of TCP ports on localhost.

    jupyter_client picks a kernel's five TCP ports by binding port 0 and letting it go; the kernel binds them a
    moment later. Two kernels started at once by separate processes (``acl run --jobs 2``: seeds side by side)
    can be handed the same port, and one kernel then fails to bind or receives the other's messages
    (jupyter_client#487, papermill#511). Files in a directory of their own cannot collide."""
    from jupyter_client import AsyncKernelManager

    class SocketFileKernelManager(AsyncKernelManager):
        # traitlets' dynamic defaults, named as jupyter_client's own (ConnectionFileMixin._ip_default)
        def _transport_default(self) -> str:
            return "ipc"

        def _ip_default(self) -> str:
            return os.path.join(socket_dir, "kernel")

    return SocketFileKernelManager


def interrupted_message(notebook: str | Path, output: str | Path) -> str:
    return (f"interrupted in {Path(notebook).name} (partial copy: {output}); the same command resumes: complete runs "
            "are skipped")


class _Stopper:
    """Ctrl-C always stops ``acl run``, whatever the running cell does.

    The kernel runs in its own process group, so a terminal's Ctrl-C reaches only us. On the first SIGINT the
    usual ``KeyboardInterrupt`` is raised (papermill interrupts the kernel and the cell normally stops); a
    watchdog then gives the cell ``GRACE_S`` seconds, after which it kills the kernel and everything it started
    (a cell blocked in native code, or one that ignores SIGINT, never stops by itself), and if this process is
    still not out ``EXIT_AFTER_S`` later, marks the executed copy interrupted and exits with 130. A second
    SIGINT does all of that at once. SIGINT ignored on entry (a background job) stays ignored."""

    GRACE_S = 5.0
    EXIT_AFTER_S = 5.0

    def __init__(self, notebook: str | Path, output: Path, socket_dir: str | None = None) -> None:
        self.notebook, self.output, self.socket_dir = Path(notebook), output, socket_dir
        self.requested = False
        self._previous = None
        self._done = threading.Event()  # set when execute() returns: the watchdog has nothing left to do

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        previous = signal.getsignal(signal.SIGINT)
        if previous is signal.SIG_IGN:
            return
        self._previous = previous
        signal.signal(signal.SIGINT, self._on_sigint)

    def uninstall(self) -> None:
        self._done.set()
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _on_sigint(self, signum, frame) -> None:
        if self.requested:  # a second Ctrl-C: stop now
            self._abort()
        self.requested = True
        threading.Thread(target=self._watch, daemon=True, name="acl-stop-watchdog").start()
        raise KeyboardInterrupt

    def _watch(self) -> None:
        if self._done.wait(self.GRACE_S):  # the cell stopped by itself
            return
        processes.kill_children()
        if not self._done.wait(self.EXIT_AFTER_S):
            self._abort()

    def _abort(self) -> None:
        processes.kill_children()
        _mark_interrupted(self.output)
        if self.socket_dir:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
        try:
            print("\n" + interrupted_message(self.notebook, self.output), file=sys.stderr, flush=True)
            sys.stdout.flush()
        finally:
            os._exit(130)


@contextmanager
def following_progress(path: str | Path, prefix: str = "", out=None) -> Iterator[None]:
    """While the block runs, print each line appended to ``path`` (the kernel's progress file, see
    ``acl_lib.progress``) to ``out`` (stdout), prefixed; the kernel finds the file through ``ACL_PROGRESS_FILE``.
    The file is emptied first and removed afterwards."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("")
    previous = os.environ.get(PROGRESS_FILE_ENV)
    os.environ[PROGRESS_FILE_ENV] = str(path)
    stop = threading.Event()

    def follow() -> None:
        with path.open() as f:
            pending = ""
            while True:
                chunk = f.read()
                if chunk:
                    pending += chunk
                    *lines, pending = pending.split("\n")
                    for line in lines:
                        print(prefix + line, file=out or sys.stdout, flush=True)
                elif stop.is_set():
                    break
                else:
                    stop.wait(0.5)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
        if previous is None:
            os.environ.pop(PROGRESS_FILE_ENV, None)
        else:
            os.environ[PROGRESS_FILE_ENV] = previous
        path.unlink(missing_ok=True)


def _prefer_own_kernels() -> None:
    """Put ``<sys.prefix>/share/jupyter`` first on JUPYTER_PATH for this process and its kernels.

    Jupyter searches the user's data dir (~/.local/share/jupyter) before the environment's, so a personal
    "python3" kernel pointing at another interpreter would otherwise run our notebooks with the wrong python.
    The venv's own kernelspec starts ``sys.executable`` (make installs it with an absolute path; the default
    spec's bare "python" is mapped to ``sys.executable`` by jupyter_client).
    """
    own = os.path.join(sys.prefix, "share", "jupyter")
    paths = [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]
    if not paths or paths[0] != own:
        os.environ["JUPYTER_PATH"] = os.pathsep.join([own] + [p for p in paths if p != own])


def _mark_interrupted(executed: Path) -> None:
    """Record in an executed copy's metadata that its execution was interrupted (``acl status``: interrupted)."""
    from datetime import datetime

    try:
        nb = json.loads(Path(executed).read_text())
        meta = nb.setdefault("metadata", {})
        meta.setdefault("papermill", {})["exception"] = True
        meta[SCHEDULE_KEY] = {**(meta.get(SCHEDULE_KEY) or {}), "interrupted": True,
                              "at": datetime.now(UTC).isoformat(timespec="seconds")}
        atomic_write_text(executed, json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    except (OSError, ValueError, AttributeError):
        pass  # no readable copy yet: notebook_state reports "not run" or "incomplete", never "done"


def _last_started_cell(executed: Path) -> tuple[int | None, str]:
    try:
        nb = json.loads(Path(executed).read_text())
    except (OSError, ValueError):
        return None, ""
    last = (None, "")
    for i, cell in enumerate(nb.get("cells", [])):
        if cell.get("metadata", {}).get("papermill", {}).get("start_time"):
            last = (i, _source(cell))
    return last


def notebook_state(executed: str | Path) -> tuple[str, float | None]:
    """State of an executed copy: ``("done" | "failed" | "interrupted" | "incomplete" | "not run", duration in s
    or None)``.

    Read from papermill's metadata: it writes ``exception`` and ``end_time`` when execution ends, so a copy
    without ``end_time`` is one whose execution was killed (or is still going). ``acl run`` marks a copy it
    stopped on Ctrl-C as interrupted (``metadata.acl.interrupted``): papermill gives it an end time too.
    """
    try:
        top = json.loads(Path(executed).read_text()).get("metadata", {})
        meta = top.get("papermill", {})
    except FileNotFoundError:
        return "not run", None
    except (OSError, ValueError, AttributeError):
        return "incomplete", None
    if (top.get("acl") or {}).get("interrupted"):
        return "interrupted", meta.get("duration")
    if meta.get("exception"):
        return "failed", meta.get("duration")
    if not meta.get("end_time"):
        return "incomplete", None
    return "done", meta.get("duration")


# --- a notebook whose work is all on disk: skipped by `acl run` ---------------------------------------------
#
# After a per-seed notebook executes without error, ``acl run`` writes ``<seed_dir>/.notebooks/<stem>.json``: the
# notebook file's SHA-256, the parameters it ran with, and every complete run of the seed's store at that moment
# (its ``COMPLETE.json`` path and finish time). A later ``acl run`` skips the notebook when that record still holds:
# same notebook, same parameters, its executed copy done, and every one of those runs still complete from the same
# finish (a run redone or deleted since, by this notebook or an earlier one, means the notebook runs again).
# This is what makes a complete seed cost nothing in a three-seed ``acl run``; ``--re-execute`` ignores it.

DONE_DIR = ".notebooks"


def _file_sha256(path: str | Path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _complete_runs(seed_dir: str | Path) -> dict[str, str | None]:
    """``{relative COMPLETE.json path: finished_at}`` for every complete run (nested ones too) under ``seed_dir``."""
    seed_dir = Path(seed_dir)
    out = {}
    for marker in sorted(seed_dir.rglob("COMPLETE.json")):
        try:
            out[str(marker.relative_to(seed_dir))] = json.loads(marker.read_text()).get("finished_at")
        except (OSError, ValueError, AttributeError):
            continue
    return out


def done_record_path(seed_dir: str | Path, notebook: str | Path) -> Path:
    return Path(seed_dir) / DONE_DIR / f"{Path(notebook).stem}.json"


def write_done(seed_dir: str | Path, notebook: str | Path, parameters: dict[str, Any], executed: str | Path) -> Path:
    """Record that ``notebook`` ran to the end with ``parameters`` (see the comment above ``DONE_DIR``)."""
    record = {"notebook": Path(notebook).name, "notebook_sha256": _file_sha256(notebook), "parameters": parameters,
              "executed": str(executed), "runs": _complete_runs(seed_dir)}
    path = done_record_path(seed_dir, notebook)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, record)
    return path


def _same_results(parameters: dict[str, Any]) -> dict[str, Any]:
    """``parameters`` without the overrides that change no result: the thread count (``acl run --jobs`` sets one
    per seed; the run store's config hash leaves it out too)."""
    return {**parameters, "overrides": [o for o in parameters.get("overrides") or []
                                        if not str(o).replace(" ", "").startswith("torch_threads=")]}


def is_done(seed_dir: str | Path, notebook: str | Path, parameters: dict[str, Any], executed: str | Path) -> str | None:
    """Why ``notebook`` need not run again (a sentence), or None when it must."""
    try:
        record = json.loads(done_record_path(seed_dir, notebook).read_text())
    except (OSError, ValueError):
        return None
    if (record.get("notebook_sha256") != _file_sha256(notebook)
            or _same_results(record.get("parameters") or {}) != _same_results(parameters)):
        return None
    if notebook_state(executed)[0] != "done":
        return None
    now = _complete_runs(seed_dir)
    runs = record.get("runs") or {}
    if any(now.get(k) != v for k, v in runs.items()):
        return None
    return (f"complete: unchanged notebook and parameters, its {len(runs)} runs still complete "
            f"(executed copy {executed})")


def strip_outputs(path: str | Path) -> bool:
    """Bring a notebook back to its committed form, in place: no outputs, execution counts or run metadata
    (papermill's, Lab's ``language_info``, widget state, ``acl run``'s interruption mark), the suite's kernelspec,
    its schedule (``metadata.acl``'s ``runs`` / ``opt_in``) kept, and nbformat's own layout.

    Opening and saving a committed notebook in JupyterLab changes only what this removes, so
    ``git diff`` is empty again after it. Returns True if the file changed.
    """
    import nbformat

    path = Path(path)
    before = path.read_text()
    nb = nbformat.reads(before, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        for key in ("papermill", "execution", "collapsed", "scrolled", "trusted"):
            cell.metadata.pop(key, None)
    own = {k: v for k, v in (nb.metadata.get(SCHEDULE_KEY) or {}).items() if k in SCHEDULE_DEFAULTS}
    nb.metadata = {k: v for k, v in nb.metadata.items()
                   if k not in ("papermill", "widgets", SCHEDULE_KEY, "language_info")}
    if own:
        nb.metadata[SCHEDULE_KEY] = own
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    after = nbformat.writes(nb) + "\n"
    if after != before:
        path.write_text(after)
        return True
    return False


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def check_conventions(path: str | Path) -> list[str]:
    """Problems with one notebook against the suite's conventions (empty list: conforms)."""
    path = Path(path)
    name = path.name
    problems = []
    if not NAME_RE.match(name):
        problems.append(f"name {name!r} does not match {NAME_RE.pattern}")
    try:
        nb = json.loads(path.read_text())
    except ValueError as exc:
        return problems + [f"not valid JSON: {exc}"]
    own = (nb.get("metadata") or {}).get(SCHEDULE_KEY)
    over_seeds = False
    if own is not None:
        if not isinstance(own, dict) or set(own) - set(SCHEDULE_DEFAULTS):
            problems.append(f"metadata.{SCHEDULE_KEY} holds how acl run schedules the notebook, only the keys "
                            f"{sorted(SCHEDULE_DEFAULTS)}; got {own!r}")
        elif own.get("runs", "per_seed") not in RUNS:
            problems.append(f"metadata.{SCHEDULE_KEY}.runs must be one of {list(RUNS)}, got {own['runs']!r}")
        elif not isinstance(own.get("opt_in", False), bool):
            problems.append(f"metadata.{SCHEDULE_KEY}.opt_in must be true or false, got {own['opt_in']!r}")
        elif own.get("after") is not None and (
                not isinstance(own["after"], list)
                or not all(isinstance(a, str) and a.isdigit() and len(a) == 2 and a < name[:2] for a in own["after"])):
            problems.append(f"metadata.{SCHEDULE_KEY}.after must list earlier notebooks' two-digit prefixes, got "
                            f"{own['after']!r}")
        else:
            over_seeds = own.get("runs") == "once_over_seeds"
    cells = nb.get("cells", [])
    if not cells:
        return problems + ["has no cells"]

    first = cells[0]
    cmd = f"papermill notebooks/{name} papermill_runs/"
    if first.get("cell_type") != "markdown":
        problems.append("first cell is not markdown")
    elif cmd not in _source(first) or "-p profile" not in _source(first):
        problems.append(f"first markdown cell must give the run command: "
                        f"'{cmd}<profile>/seed<k>/{name} -p profile ...'")

    for i, cell in enumerate(cells):
        if cell.get("cell_type") == "code" and (cell.get("outputs") or cell.get("execution_count") is not None):
            problems.append(f"cell {i} is committed with outputs or an execution count (run `acl nbstrip`)")

    tagged = [i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    if len(tagged) != 1:
        return problems + [f"needs exactly one cell tagged 'parameters', found {len(tagged)}"]
    pi = tagged[0]
    params = cells[pi]
    if params.get("cell_type") != "code":
        return problems + ["the 'parameters' cell is not a code cell"]
    try:
        tree = ast.parse(_source(params))
    except SyntaxError as exc:
        return problems + [f"parameters cell does not parse: {exc}"]
    assigned = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            problems.append(f"parameters cell line {node.lineno}: only flat `name = literal` assignments belong here")
            continue
        try:
            assigned[node.targets[0].id] = ast.literal_eval(node.value)
        except ValueError:
            problems.append(f"parameters cell: {node.targets[0].id} is not a literal (derive it in the next cell)")
    for p in REQUIRED_PARAMETERS:
        if p not in assigned:
            problems.append(f"parameters cell does not define {p}")
    if over_seeds and "seeds" not in assigned:
        problems.append("runs once over the seeds (metadata.acl.runs) but its parameters cell does not define seeds")
    if "profile" in assigned and assigned["profile"] != DEFAULT_PROFILE:
        problems.append(f"parameters cell: profile defaults to {assigned['profile']!r}; the suite's default is "
                        f"{DEFAULT_PROFILE!r} (tests and acl run pass the profile they want)")
    # papermill's own parser documents parameters (`papermill --help-notebook`); it gives up on a line
    # whose comment contains '=' and then warns "Passed unknown parameter" on every run.
    from nbformat.v4 import new_code_cell
    from papermill.translators import PythonTranslator

    documented = {p.name for p in PythonTranslator.inspect(new_code_cell(_source(params)))}
    for name in assigned:
        if name not in documented:
            problems.append(f"papermill cannot parse the parameter line of {name!r} (no '=' in its comment)")
    nxt = next((c for c in cells[pi + 1 :] if c.get("cell_type") == "code"), None)
    if nxt is None or "load_config(profile, overrides, seed=seed)" not in re.sub(r"\s+", " ", _source(nxt)):
        problems.append("the code cell after 'parameters' must call load_config(profile, overrides, seed=seed)")
    return problems
