"""Progress lines (acl_lib.progress): what they say, where they go, and library output kept in the run's log."""

from __future__ import annotations

import logging
import re
import sys
import warnings

import pytest

from acl_lib import progress
from acl_lib.progress import Progress, current_run, library_output_to


@pytest.fixture
def lines():
    """Records of the ``acl.progress`` logger."""
    got: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            got.append(record)

    h = Keep(level=logging.INFO)
    lg = logging.getLogger("acl.progress")
    lg.addHandler(h)
    old = lg.level
    lg.setLevel(logging.INFO)
    yield got
    lg.removeHandler(h)
    lg.setLevel(old)


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def test_a_line_names_the_run_the_step_the_stats_and_the_time_left(lines, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress.time, "perf_counter", clock)
    with current_run("seq_math"):
        bar = Progress(10, "sft", display=False)
    clock.now = 6.0
    bar.update(1, loss=2.5)  # 10% of the work: a line
    clock.now = 20.0
    bar.update(3)  # 40%
    text = [r.getMessage() for r in lines]
    assert text[0] == "seq_math · sft: 0/10 steps (0%) · 0s elapsed"
    assert text[1] == "seq_math · sft: 1/10 steps (10%) · loss 2.5 · 6s elapsed, ~54s left"
    assert text[2] == "seq_math · sft: 4/10 steps (40%) · loss 2.5 · 20s elapsed, ~30s left"
    clock.now = 200.0
    bar.close()  # stopped early: its last state was logged already, so no repeat
    assert len(lines) == 3
    bar = Progress(10, "grpo", display=False)
    clock.now = 270.0
    bar.set(7, log=False)  # drawn, not logged
    bar.close()
    assert lines[-1].getMessage() == "grpo: 7/10 steps (70%) · 1m10s elapsed, ~30s left"


def test_one_duration_format_for_lines_and_one_for_prose():
    """Progress lines, ``acl run`` and ``acl status`` write 3m05s; the README's wall-time line 2 h 57 min; minutes
    round before hours split, so 119.7 min is 2 h 00 min, never 1 h 60 min."""
    fmt = progress.fmt_duration
    assert [fmt(s) for s in (None, 0.4, 59.6, 185, 3600, 10_620)] == ["", "0s", "1m00s", "3m05s", "1h00m", "2h57m"]
    assert [fmt(s, words=True) for s in (12.2, 59.7, 186, 3599, 7182, 10_620)] == [
        "12 s", "1.0 min", "3.1 min", "60.0 min", "2 h 00 min", "2 h 57 min"]


def test_lines_are_throttled_but_the_final_state_is_always_logged(lines):
    bar = Progress(1000, "eval", unit="episode", display=False)
    for _ in range(1000):
        bar.update(1)
    assert 10 <= len(lines) <= 13  # start, every 10%, end: not one line per episode
    bar = Progress(5, "grpo", display=False)
    bar.set(5, log=False)
    n = len(lines)
    bar.set(5, reward=0.5)  # the stats arrive after the step: still logged
    bar.close()
    assert "reward 0.5" in lines[-1].getMessage() and len(lines) == n + 1


def test_a_resumed_job_estimates_from_the_steps_it_ran(lines, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(progress.time, "perf_counter", clock)
    bar = Progress(100, "grpo", initial=90, display=False)  # 90 steps were done before the restart
    clock.now = 50.0
    bar.update(5)
    assert lines[-1].getMessage() == "grpo: 95/100 steps (95%) · 50s elapsed, ~50s left"


def test_the_progress_file_receives_acl_lines(tmp_path, monkeypatch, lines):
    path = tmp_path / "progress.log"
    monkeypatch.setenv(progress.PROGRESS_FILE_ENV, str(path))
    h = progress.progress_file_handler()
    lg = logging.getLogger("acl.progress")
    lg.addHandler(h)
    try:
        with current_run("seq_if/eval"):
            Progress(2, "eval", unit="episode", display=False).close()
    finally:
        lg.removeHandler(h)
        h.close()
    assert re.search(r"^\d\d:\d\d:\d\d seq_if/eval · eval: 0/2 episodes", path.read_text(), re.M)
    monkeypatch.delenv(progress.PROGRESS_FILE_ENV)
    assert progress.progress_file_handler() is None


def test_library_output_goes_to_the_log_and_consoles_come_back(tmp_path, capsys):
    log = tmp_path / "run.log"
    lib = logging.getLogger("some_library")
    handler = logging.StreamHandler(sys.stderr)
    lib.addHandler(handler)
    try:
        with library_output_to(log):
            print("trainer table row")
            warnings.warn("a deprecation nobody can act on", FutureWarning, stacklevel=1)
            lib.warning("library notice")
            late = logging.getLogger("late_library")  # a library that sets up its handler inside the block
            late.addHandler(logging.StreamHandler(sys.stderr))
        lib.warning("after the block")
        late.warning("late library, after the block")
    finally:
        lib.removeHandler(handler)
        for h in list(logging.getLogger("late_library").handlers):
            logging.getLogger("late_library").removeHandler(h)
    text = log.read_text()
    assert "trainer table row" in text and "a deprecation nobody can act on" in text and "library notice" in text
    captured = capsys.readouterr()
    assert "trainer table row" not in captured.out + captured.err
    assert "after the block" in captured.err and "late library, after the block" in captured.err


@pytest.mark.parametrize("kernel", [False, True])
def test_log_lines_go_to_stderr_in_a_terminal_and_stdout_in_a_notebook(monkeypatch, kernel):
    """A notebook draws stderr as an error box: the suite's log lines, information, go to stdout there."""
    from acl_lib import runs

    acl = logging.getLogger("acl")
    for attr in ("handlers", "level", "propagate"):  # put back as they were after the test
        monkeypatch.setattr(acl, attr, [] if attr == "handlers" else getattr(acl, attr))
    monkeypatch.setattr(runs, "in_notebook_kernel", lambda: kernel)
    runs.ensure_console_logging()
    streams = [h.stream for h in acl.handlers if type(h) is logging.StreamHandler]
    assert streams == [sys.stdout if kernel else sys.stderr]
