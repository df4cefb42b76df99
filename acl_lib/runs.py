"""The run store: every unit of work (a stage, an oracle, a merge, an evaluation) is a *run*.

A run lives in ``outputs/<profile>/seed<k>/<name>/`` and holds::

    config.yaml      the resolved config it ran with (plus the hash it was keyed by)
    run.log          its log (appended across attempts, so an earlier failure stays readable)
    RUNNING.json     while it runs: {pid, host, started_at, config_hash}
    COMPLETE.json    once it finished: {config_hash, started_at, finished_at, duration_s}
    FAILED.json      if it raised: {config_hash, failed_at, error, traceback}
    checkpoints/     resumable trainer checkpoints (checkpoint-N dirs), kept across restarts
    ...              its outputs (model weights, metrics.json, rollouts ...)

Usage from a notebook or library function::

    run = Run(cfg.for_stage("math"), "seq_math", sections=("model", "worlds", "sft", "grpo"),
              inputs=[base_run], extra={"domain": "math", "cold_start": True})
    run_once(run, lambda r: train_stage(r, ...))   # skipped if already complete with this config

Semantics:

* **Complete** means ``COMPLETE.json`` exists and records the run's current ``config_hash``. The hash covers
  the named config sections (all result-relevant keys when ``sections`` is None) plus the completion record
  of every input run, so re-running an upstream run invalidates everything downstream of it.
* **Stale** (complete under another hash): starting it again first moves the whole old directory to
  ``<seed_dir>/.superseded/<name>-<oldhash>-<timestamp>/``. We move rather than delete because a finished
  run may have cost GPU-days and may be wanted for comparison; and we never overwrite in place, so no
  directory ever mixes files of two configs. Delete ``.superseded/`` to reclaim the disk.
* **Interrupted** (SIGKILL, OOM, power loss): ``RUNNING.json`` stays behind with a pid that no longer exists;
  ``status()`` reports ``"failed"``. Starting again clears partial outputs but keeps ``checkpoints/`` (if it
  was written under the same config hash) so trainers resume.
* **One process per run**: ``start()`` holds the run's lock (``<seed_dir>/.locks/<name>.lock``, an ``flock``
  the operating system releases when the process ends, however it ends) from its status check to the end, so
  a second process starting the same run fails at once, before any compute, naming the holder's pid.
* Outputs that must never look complete while half-written go through ``atomic_dir`` / ``write_json``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import shutil
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from acl_lib.atomic import atomic_dir, atomic_write_text, write_json
from acl_lib.config import Config
from acl_lib.progress import NotProgress, current_run, in_notebook_kernel, library_output_to, progress_file_handler

COMPLETE = "COMPLETE.json"
RUNNING = "RUNNING.json"
FAILED = "FAILED.json"
CONFIG = "config.yaml"
LOG = "run.log"
CHECKPOINTS = "checkpoints"
SUPERSEDED = ".superseded"
LOCKS = ".locks"  # <seed_dir>/.locks/<run>.lock: held (flock) by the process running <run>
_CKPT_HASH = ".config_hash"  # inside checkpoints/: which config the checkpoints were written under
_KEEP_ON_RESTART = {LOG, CHECKPOINTS}

# Top-level keys that say *where* or *how fast* a run executes, not *what* it computes: a run keyed on
# "all sections" ignores them, so moving the output folder or changing the thread count re-runs nothing.
NON_RESULT_KEYS = ("output_dir", "papermill_dir", "torch_threads")

STATUSES = ("complete", "missing", "running", "failed", "stale")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _pid_alive(pid: int) -> bool:
    """True if a process with this pid exists on this host and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    try:  # a killed but not yet reaped child still answers kill(0); /proc tells us it is a zombie
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def disk_status(path: Path) -> str:
    """Status of a run directory from its markers alone (no config needed; used by ``acl status``).

    Returns ``"complete"`` (COMPLETE.json present, whatever its hash), ``"running"`` (RUNNING.json with a live
    pid, or a pid on another host that we cannot check), ``"failed"`` (FAILED.json, or RUNNING.json whose
    process is gone: an interrupted run) or ``"missing"``.
    """
    path = Path(path)
    if (path / COMPLETE).exists():
        return "complete"
    running = _read_json(path / RUNNING)
    if running is not None:
        if running.get("host") != socket.gethostname():
            return "running"
        return "running" if _pid_alive(int(running.get("pid", -1))) else "failed"
    if (path / FAILED).exists() or (path / RUNNING).exists():
        return "failed"
    return "missing"


class Busy(RuntimeError):
    """Another live process holds a lock (``hold_lock``); ``holder`` is what it wrote there (pid, host, ...)."""

    def __init__(self, lock: Path, holder: dict):
        self.lock, self.holder = lock, holder
        who = f"pid {holder.get('pid')} on {holder.get('host')}" if holder.get("pid") else "another process"
        super().__init__(f"{lock} is held by {who} since {holder.get('started_at', '?')}")


@contextmanager
def hold_lock(path: str | os.PathLike, info: dict | None = None) -> Iterator[dict]:
    """Hold an exclusive lock on ``path`` (created if missing) for the body, or raise ``Busy`` at once.

    The lock is an ``flock`` on the open file: the operating system drops it when its process ends in any way
    (exception, Ctrl-C, SIGKILL, OOM), so a lock is never left behind, unlike a marker file. The holder writes
    ``info`` plus its pid, host and start time into the file for the message of the process that is refused.
    Locks are per open file, so a second ``hold_lock`` on the same path in the same process is refused too.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # the holder writes its pid right after taking the lock: give it a moment to appear
            holder: dict = {}
            for _ in range(20):
                holder = _read_json(path) or {}
                if holder.get("pid"):
                    break
                time.sleep(0.025)
            raise Busy(path, holder) from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": _now(), **(info or {})}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)
        yield holder
    finally:
        os.close(fd)  # releases the lock; the file stays (removing it would race with the next holder)


class Run:
    """One unit of work with a directory, a config hash, markers and a logger. See the module docstring."""

    def __init__(
        self,
        cfg: Config,
        name: str,
        sections: tuple[str, ...] | None = None,
        inputs: list[Run] | tuple[Run, ...] = (),
        extra: dict | None = None,
    ):
        """``name`` may contain ``/`` (e.g. ``"seq_math/eval"``) to nest runs. ``sections``: the top-level
        config keys this run's result depends on (None: all but ``NON_RESULT_KEYS``). ``inputs``: runs whose
        outputs this one reads; their completion records enter ``config_hash``. ``extra``: further
        JSON-able values the result depends on (e.g. the one entry of a per-domain mapping that concerns
        this run, where the whole config section would key it on every domain's entry)."""
        self.cfg = cfg
        self.name = name
        self.path: Path = cfg.seed_dir() / name
        all_keys = cfg.to_dict().keys()
        if sections is not None:
            unknown = [s for s in sections if s not in all_keys]
            if unknown:
                raise ValueError(f"run {name}: unknown config section(s) {unknown}; sections are {list(all_keys)}")
        self.sections = tuple(sections) if sections is not None else None
        self.inputs = list(inputs)
        self.extra = dict(extra or {})
        self.logger = logging.getLogger("acl.run." + name.replace("/", "."))
        self.logger.setLevel(logging.INFO)
        ensure_console_logging()

    # --- identity --------------------------------------------------------------------------------------
    @property
    def config_hash(self) -> str:
        """16 hex chars over the selected config sections and the inputs' completion records.

        Computed on access, so an input that completes (or is re-run) after this object was made is seen.
        """
        d = self.cfg.to_dict()
        keys = self.sections if self.sections is not None else [k for k in d if k not in NON_RESULT_KEYS]
        payload = {
            "config": {k: d[k] for k in keys},
            "inputs": {r.name: r.completion_hash() for r in self.inputs},
        }
        if self.extra:
            payload["extra"] = self.extra
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]

    def completion_hash(self) -> str:
        """What downstream runs key on: this run's COMPLETE record (hash + finish time), or "incomplete"."""
        done = _read_json(self.path / COMPLETE)
        if done is None:
            return "incomplete"
        return f"{done.get('config_hash')}@{done.get('finished_at')}"

    # --- state -----------------------------------------------------------------------------------------
    def is_complete(self) -> bool:
        done = _read_json(self.path / COMPLETE)
        return done is not None and done.get("config_hash") == self.config_hash

    def status(self) -> str:
        """One of ``STATUSES``: complete | missing | running | failed | stale (complete under another hash)."""
        s = disk_status(self.path)
        if s == "complete" and not self.is_complete():
            return "stale"
        return s

    def checkpoint_dir(self) -> Path:
        """``<run>/checkpoints``: where trainers write resumable ``checkpoint-N`` dirs; survives a restart of
        an incomplete run with the same config hash (cleared if the hash changed)."""
        d = self.path / CHECKPOINTS
        d.mkdir(parents=True, exist_ok=True)
        (d / _CKPT_HASH).write_text(self.config_hash)
        return d

    # --- lifecycle -------------------------------------------------------------------------------------
    @contextmanager
    def start(self) -> Iterator[Run]:
        """Run the body as this run: markers, config.yaml, run.log; COMPLETE.json on success, FAILED.json on
        an exception (re-raised). Starting a complete or stale run moves the old one to ``.superseded/``.

        The run's lock (``<seed_dir>/.locks/<name>.lock``, see ``hold_lock``) is held from before the status
        check to the end, so of two processes starting one run at once the second fails at once, before any
        compute, with a ``RuntimeError`` naming the run and the process that holds it."""
        with ExitStack() as stack:
            try:
                stack.enter_context(hold_lock(self.lock_path(), {"run": self.name}))
            except Busy as exc:
                h = exc.holder
                raise RuntimeError(
                    f"run {self.name} is already running (pid {h.get('pid')} on {h.get('host')}, since "
                    f"{h.get('started_at')}): one run cannot be started twice at once; wait for that process or stop it"
                ) from None
            with self._start() as run:
                yield run

    def lock_path(self) -> Path:
        """``<seed_dir>/.locks/<name>.lock``: outside the run directory, which a restart may move or clear."""
        return self.cfg.seed_dir() / LOCKS / (self.name.replace("/", "__") + ".lock")

    @contextmanager
    def _start(self) -> Iterator[Run]:
        status = self.status()
        if status == "running":
            info = _read_json(self.path / RUNNING) or {}
            raise RuntimeError(
                f"run {self.name} is already running (pid {info.get('pid')} on {info.get('host')}, "
                f"since {info.get('started_at')}); if that is wrong, delete {self.path / RUNNING}"
            )
        config_hash = self.config_hash
        if status in ("complete", "stale"):
            self._supersede()
        self._clear_partial(config_hash)
        self.path.mkdir(parents=True, exist_ok=True)

        header = f"# run {self.name}: config_hash {config_hash}; sections {list(self.sections or ['all'])}\n"
        header += "".join(f"# input {r.name}: {r.completion_hash()}\n" for r in self.inputs)
        if self.extra:  # keyed on too: what the run is beyond the config (an MLE expert's own recipe)
            header += f"# extra: {json.dumps(self.extra, sort_keys=True, default=str)}\n"
        atomic_write_text(self.path / CONFIG, header + yaml.safe_dump(self.cfg.to_dict(), sort_keys=False))
        started = time.time()
        self.write_json(
            RUNNING,
            {"pid": os.getpid(), "host": socket.gethostname(), "started_at": _now(), "config_hash": config_hash},
        )
        # Every acl.* message during the run (stage notes, progress lines) goes to its run.log, and so does
        # what the libraries print (trainer tables, warnings): the notebook cell keeps progress lines only.
        handler = logging.FileHandler(self.path / LOG)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        acl_logger = logging.getLogger("acl")
        acl_logger.addHandler(handler)
        self.logger.info("run %s started (config %s) in %s", self.name, config_hash, self.path)
        try:
            with current_run(self.name), library_output_to(self.path / LOG):
                yield self
        except BaseException as exc:  # KeyboardInterrupt too: the run did not finish
            self.write_json(
                FAILED,
                {
                    "config_hash": config_hash,
                    "failed_at": _now(),
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc(),
                },
            )
            (self.path / RUNNING).unlink(missing_ok=True)
            self.logger.error("run %s failed: %s: %s", self.name, type(exc).__name__, exc)
            raise
        else:
            duration = time.time() - started
            self.write_json(
                COMPLETE,
                {
                    "config_hash": config_hash,
                    "started_at": datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds"),
                    "finished_at": _now(),
                    "duration_s": round(duration, 3),
                    "code": code_version(),
                },
            )
            (self.path / RUNNING).unlink(missing_ok=True)
            self.logger.info("run %s complete in %.1f s", self.name, duration)
        finally:
            acl_logger.removeHandler(handler)
            handler.close()

    def _supersede(self) -> None:
        old = (_read_json(self.path / COMPLETE) or {}).get("config_hash", "unknown")
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
        dest = self.cfg.seed_dir() / SUPERSEDED / f"{self.name.replace('/', '__')}-{old}-{stamp}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.rename(self.path, dest)
        self.logger.info("run %s: moved the previous run (config %s) to %s", self.name, old, dest)

    def _clear_partial(self, config_hash: str) -> None:
        """Remove what an interrupted or failed attempt left, except the log and same-config checkpoints."""
        if not self.path.exists():
            return
        ckpt = self.path / CHECKPOINTS
        if ckpt.exists():
            written_under = (ckpt / _CKPT_HASH).read_text() if (ckpt / _CKPT_HASH).exists() else None
            if written_under != config_hash:
                self.logger.info("run %s: discarding checkpoints written under config %s", self.name, written_under)
                shutil.rmtree(ckpt)
            else:  # half-written atomic_dir leftovers inside checkpoints/
                for p in ckpt.glob(".tmp-*"):
                    _remove(p)
        for p in self.path.iterdir():
            if p.name not in _KEEP_ON_RESTART:
                _remove(p)

    # --- atomic outputs --------------------------------------------------------------------------------
    def atomic_dir(self, rel: str):
        """``atomic.atomic_dir(<run>/<rel>)``: ``<rel>`` is never half-written (see ``acl_lib.atomic``)."""
        return atomic_dir(self.path / rel)

    def write_json(self, rel: str, obj: Any) -> Path:
        """Write ``obj`` as JSON to ``<run>/<rel>`` atomically (temp file + ``os.replace``)."""
        return write_json(self.path / rel, obj)

    def read_json(self, rel: str) -> Any:
        return json.loads((self.path / rel).read_text())

    def __repr__(self) -> str:
        return f"Run({self.name!r}, path={str(self.path)!r}, status={self.status()!r})"


_CODE_VERSION: list[str | None] = []


def code_version() -> str | None:
    """The commit of the suite's checkout this process runs (``+dirty`` with uncommitted changes), or None
    outside a git checkout; recorded in ``COMPLETE.json`` so that a results table can say which code made it."""
    if not _CODE_VERSION:
        import subprocess

        root = Path(__file__).resolve().parents[1]
        try:
            rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                 text=True, timeout=10)
            dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10)
            version = rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "") if rev.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            version = None
        _CODE_VERSION.append(version)
    return _CODE_VERSION[0]


def run_once(run: Run, fn: Callable[[Run], Any], force: bool = False) -> Run:
    """Run ``fn(run)`` inside ``run.start()`` unless the run is already complete with this config.

    ``force=True`` re-runs a complete run (the old one goes to ``.superseded/``). Returns ``run``.
    """
    if run.is_complete() and not force:
        run.logger.info("run %s is complete (config %s), skipping", run.name, run.config_hash)
        return run
    with run.start():
        fn(run)
    return run


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    else:
        p.unlink(missing_ok=True)


def ensure_console_logging() -> None:
    """Make INFO messages of ``acl.*`` loggers visible (in a terminal and in notebook outputs) exactly once: on
    stderr in a terminal (stdout stays for what a command prints), on stdout in a notebook, where stderr renders
    as an error box and these lines are information."""
    root = logging.getLogger("acl")
    if not root.handlers:
        h = logging.StreamHandler(sys.stdout if in_notebook_kernel() else sys.stderr)
        h.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
        h.addFilter(NotProgress())  # the live progress line shows those
        root.addHandler(h)
        following = progress_file_handler()  # `acl run` follows this file
        if following is not None:
            root.addHandler(following)
        root.setLevel(logging.INFO)
        root.propagate = False
