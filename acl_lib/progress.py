"""Progress a person can see on long work, and library noise kept out of sight.

    with Progress(total=800, desc="sft", unit="step") as bar:      # one per long step
        for step in ...:
            bar.update(1, loss=0.91)

One ``Progress`` shows the same line in three places:

* in a notebook cell: one live line (an HTML progress bar and its text), updated in place, so an executed
  notebook keeps one compact line per long step instead of hundreds of redraws;
* in a terminal: one ``\\r``-redrawn line on stderr;
* as log lines (``acl.progress``, every 10% of the work or every 30 s, and at the end): they go to the
  ``run.log`` of the run in progress and, under ``acl run``, to its terminal (the kernel appends them to the
  file named by ``ACL_PROGRESS_FILE``, which ``acl run`` follows), so a long run says which run, which step,
  its loss or reward and the time left, line by line.

A line reads ``seq_math · sft: 400/800 steps (50%) · loss 0.912 · 1m02s elapsed, ~1m02s left``. The run
name comes from the run being executed (``Run.start`` names it with ``current_run``).

``library_output_to(path)`` sends what libraries print during a run (trainer tables, warnings, progress
redraws of ``datasets`` and ``transformers``) to the run's log file rather than to the notebook cell.
"""

from __future__ import annotations

import contextlib
import html
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator

PROGRESS_FILE_ENV = "ACL_PROGRESS_FILE"
log = logging.getLogger("acl.progress")

_run_names: list[str] = []


@contextlib.contextmanager
def current_run(name: str) -> Iterator[None]:
    """Name the run whose work the progress lines inside this block belong to."""
    _run_names.append(name)
    try:
        yield
    finally:
        _run_names.pop()


def fmt_duration(seconds: float | None, *, words: bool = False) -> str:
    """A duration for people: ``45s``, ``3m05s``, ``2h57m`` (progress lines, ``acl run``, ``acl status``), or with
    ``words`` ``45 s``, ``3.1 min``, ``2 h 57 min`` (prose: the README's wall-time line). ``None`` gives ``""``."""
    if seconds is None:
        return ""
    if words:
        if round(seconds) < 60:
            return f"{round(seconds)} s"
        if seconds < 3600:
            return f"{seconds / 60:.1f} min"
        minutes = round(seconds / 60)
        return f"{minutes // 60} h {minutes % 60:02d} min"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _fmt_value(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


def in_notebook_kernel() -> bool:
    """True inside a Jupyter kernel (JupyterLab, papermill), where a live display can be updated in place."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    ip = get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


class _Line:
    """What the notebook displays: an HTML bar with the line beside it, and the line as plain text."""

    def __init__(self, text: str, fraction: float):
        self.text, self.fraction = text, fraction

    def __repr__(self) -> str:
        return self.text

    def _repr_html_(self) -> str:
        pct = max(0.0, min(1.0, self.fraction))
        return (f'<div style="font-family:monospace;font-size:12px"><progress value="{pct:.3f}" max="1" '
                f'style="width:160px;vertical-align:middle"></progress> {html.escape(self.text)}</div>')


class Progress:
    """A progress line for ``total`` units of work (steps, episodes). See the module docstring.

    ``initial``: units already done (a resumed trainer); the time left is estimated from the units done here.
    ``stats`` given to ``update`` (loss, reward, a score) are shown as their last values.
    """

    def __init__(self, total: int, desc: str, unit: str = "step", initial: int = 0, log_every_s: float = 30.0,
                 log_every_fraction: float = 0.1, display: bool = True):
        self.total = max(int(total), 0)
        self.desc = desc
        self.unit = unit
        self.done = int(initial)
        self.initial = int(initial)
        self.stats: dict = {}
        self.run = _run_names[-1] if _run_names else None
        self.t0 = time.perf_counter()
        self.log_every_s = log_every_s
        self.log_every = max(1, int(self.total * log_every_fraction)) if self.total else 1
        self._last_log_t = self.t0
        self._last_log_done = self.done
        self._logged: tuple = ()
        self._last_draw = 0.0
        self._handle = None
        self._tty = False
        self._closed = False
        if display and in_notebook_kernel():
            from IPython.display import display as ipy_display

            self._handle = ipy_display(_Line(self.line(), self._fraction()), display_id=True)
        elif display:
            self._tty = bool(getattr(sys.stderr, "isatty", lambda: False)())
        self._log(force=True)

    # --- text -------------------------------------------------------------------------------------------
    def _fraction(self) -> float:
        return self.done / self.total if self.total else 1.0

    def line(self) -> str:
        who = f"{self.run} · {self.desc}" if self.run else self.desc
        units = self.unit if self.unit.endswith("s") else self.unit + "s"
        parts = [f"{who}: {self.done}/{self.total} {units} ({100 * self._fraction():.0f}%)"]
        parts += [f"{k} {_fmt_value(v)}" for k, v in self.stats.items() if v is not None]
        elapsed = time.perf_counter() - self.t0
        timing = f"{fmt_duration(elapsed)} elapsed"
        here = self.done - self.initial
        if 0 < here and self.done < self.total:
            timing += f", ~{fmt_duration(elapsed / here * (self.total - self.done))} left"
        parts.append(timing)
        return " · ".join(parts)

    # --- updates ----------------------------------------------------------------------------------------
    def update(self, n: int = 1, **stats) -> None:
        self.set(self.done + n, **stats)

    def set(self, done: int, log: bool = True, **stats) -> None:
        """Units done so far, and the latest ``stats``; ``log=False`` redraws without a log line (a trainer
        draws at each step's end and logs when the step's loss arrives)."""
        self.done = min(int(done), self.total) if self.total else int(done)
        self.stats.update(stats)
        self._draw()
        if log:
            self._log()

    def _draw(self, force: bool = False) -> None:
        now = time.perf_counter()
        if not force and now - self._last_draw < 0.5:
            return
        self._last_draw = now
        if self._handle is not None:
            self._handle.update(_Line(self.line(), self._fraction()))
        elif self._tty:
            sys.stderr.write("\r" + self.line()[:200].ljust(100))
            sys.stderr.flush()

    def _log(self, force: bool = False) -> None:
        now = time.perf_counter()
        due = (self.done - self._last_log_done >= self.log_every) or (now - self._last_log_t >= self.log_every_s)
        if force or (due and self.done != self._last_log_done):
            self._last_log_t, self._last_log_done = now, self.done
            self._logged = (self.done, tuple(self.stats.items()))
            live = self._handle is not None or self._tty
            log.info("%s", self.line(), extra={"progress": True, "live": live})

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._draw(force=True)
        if self._tty:
            sys.stderr.write("\n")
        if (self.done, tuple(self.stats.items())) != self._logged:  # the last line logged is the final state
            self._log(force=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class NotProgress(logging.Filter):
    """Keeps progress lines off the console while a live line (notebook display, terminal) shows them; in a
    log file or a pipe the periodic lines are the progress."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "live", False)


def progress_file_handler() -> logging.Handler | None:
    """A handler appending ``acl.*`` INFO lines to ``$ACL_PROGRESS_FILE`` (set by ``acl run``), or None."""
    path = os.environ.get(PROGRESS_FILE_ENV)
    if not path:
        return None
    h = logging.FileHandler(path, mode="a")
    h.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    h.setLevel(logging.INFO)
    return h


def hf_progress_bars(enabled: bool):
    """Turn the progress bars of ``transformers``, ``datasets`` and ``huggingface_hub`` on or off; returns a
    function restoring what they were."""
    restores = []
    for module, is_on, on, off in (
        ("transformers.utils.logging", "is_progress_bar_enabled", "enable_progress_bar", "disable_progress_bar"),
        ("datasets.utils.logging", "is_progress_bar_enabled", "enable_progress_bar", "disable_progress_bar"),
        ("huggingface_hub.utils", "are_progress_bars_disabled", "enable_progress_bars", "disable_progress_bars"),
    ):
        try:
            mod = __import__(module, fromlist=[is_on])
            was_on = getattr(mod, is_on)()
            if is_on.startswith("are_"):  # huggingface_hub asks the opposite question
                was_on = not was_on
        except (ImportError, AttributeError):
            continue
        getattr(mod, on if enabled else off)()
        restores.append(lambda mod=mod, was_on=was_on, on=on, off=off: getattr(mod, on if was_on else off)())
    return lambda: [r() for r in restores]


@contextlib.contextmanager
def library_output_to(path: str | os.PathLike) -> Iterator[None]:
    """Inside this block, what libraries print (stdout, stderr, warnings) is appended to ``path``, and the
    progress bars of the Hugging Face libraries are off; ``Progress`` lines and ``acl`` log messages still
    show. Used by ``Run.start`` so that a notebook cell that trains shows progress, not logs."""
    restore = hf_progress_bars(False)
    consoles = (sys.stdout, sys.stderr)
    with open(path, "a", buffering=1) as f, warnings.catch_warnings():
        warnings.simplefilter("default")  # each warning once per place, into the log
        warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: f.write(
            warnings.formatwarning(message, category, filename, lineno, line))
        moved = _point_library_handlers(consoles, f)
        try:
            with contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
                yield
        finally:
            restore()
            for handler, stream in moved:
                handler.setStream(stream)
            # handlers a library created inside the block hold the file: back to the console
            for handler, _ in _point_library_handlers((f,), None):
                handler.setStream(consoles[1])


def _point_library_handlers(streams, target):
    """Console handlers of the libraries' loggers (``transformers``, ``deepspeed`` ...; not ``acl``) that write
    to one of ``streams``: point them at ``target`` (when given). Returns ``[(handler, old stream)]``."""
    found = []
    loggers = [logging.getLogger()] + [lg for name, lg in logging.root.manager.loggerDict.items()
                                        if isinstance(lg, logging.Logger) and not name.startswith("acl")]
    for lg in loggers:
        for h in lg.handlers:
            if type(h) is logging.StreamHandler and any(h.stream is s for s in streams):
                found.append((h, h.stream))
                if target is not None:
                    h.setStream(target)
    return found


class _Silent:
    def update(self, *args, **kwargs) -> None:
        pass


@contextlib.contextmanager
def maybe_progress(show: bool, total: int, desc: str, unit: str) -> Iterator[Progress | _Silent]:
    """A ``Progress`` line when ``show``, else a silent stand-in with the same ``update`` (tests, library callers
    that print nothing)."""
    if not show:
        yield _Silent()
        return
    with Progress(total, desc, unit=unit) as bar:
        yield bar
