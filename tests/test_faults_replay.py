"""Fault suite, `acl env retail replay` (issue 11, defect 6): malformed tasks and actions.

Before: an action without a ``name`` (or a null / non-list action list) crashed the whole replay with a
traceback after a partial output file (0 bytes when the first task failed), and errors keyed by
``action_id`` overwrote each other when an id was missing or repeated. Now every task gets its line and
every bad action its own error. (Missing files and invalid JSON: the CLI table in test_faults_cli.py.)
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from acl_lib.cli import main
from acl_lib.envs.retail_db import replay

FIXTURE = Path(__file__).parent / "data" / "tau2" / "retail"


@pytest.fixture(scope="module")
def db():
    return json.loads((FIXTURE / "db.json").read_text())


@pytest.fixture(scope="module")
def bad_tasks():
    real = json.loads((FIXTURE / "tasks.json").read_text())
    tasks = [copy.deepcopy(t) for t in real[:5]]
    first, dup, non_list, null_list, normal = tasks
    # the first task's first action has no name (the old replay wrote 0 bytes and crashed)
    del first["evaluation_criteria"]["actions"][0]["name"]
    # failing actions: two sharing one id, one without an id, one that is not an object
    dup["evaluation_criteria"]["actions"] = [
        {"action_id": "x", "name": "no_such_tool", "arguments": {}},
        {"action_id": "x", "name": "another_missing_tool", "arguments": {}},
        {"name": "third_missing_tool", "arguments": {}},
        None,
        *dup["evaluation_criteria"]["actions"],
    ]
    non_list["evaluation_criteria"]["actions"] = {"name": "not a list"}
    null_list["evaluation_criteria"]["actions"] = None
    return tasks, real[:5]


def test_replay_reports_every_bad_action_separately(db, bad_tasks):
    tasks, real = bad_tasks
    rec = replay(db, tasks[0])
    assert rec["failing_actions"] == ["0_0"] and "no 'name'" in rec["errors"]["0_0"]
    # the rest of the task was still replayed: the same changes as the real task
    assert rec["orders"] == replay(db, real[0])["orders"]

    rec = replay(db, tasks[1])
    assert rec["failing_actions"] == ["#0", "#1", "#2", "#3"], rec["failing_actions"]
    errors = rec["errors"]
    assert "no_such_tool" in errors["#0"] and "another_missing_tool" in errors["#1"]
    assert "third_missing_tool" in errors["#2"] and "must be an object" in errors["#3"]

    rec = replay(db, tasks[2])
    assert "must be a list" in rec["error"] and rec["orders"] == {} and rec["failing_actions"] == []
    rec = replay(db, tasks[3])
    assert "error" not in rec and rec["orders"] == {} and rec["failing_actions"] == []
    assert replay(db, tasks[4]) == replay(db, real[4])
    assert "must be an object" in replay(db, ["not", "a", "task"])["error"]


@pytest.mark.slow
def test_replay_cli_writes_every_tasks_line_and_exits_1(db, bad_tasks, tmp_path, capsys):
    tasks, _ = bad_tasks
    tasks_file = tmp_path / "tasks.json"
    tasks_file.write_text(json.dumps([*tasks, 42]))
    out = tmp_path / "replay.jsonl"
    code = main(["env", "retail", "replay", "--db", str(FIXTURE / "db.json"), "--tasks", str(tasks_file),
                 "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "2 of 6 task(s) could not be replayed" in err and "Traceback" not in err
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in lines] == [t["id"] for t in tasks] + [None]
    assert [("error" in r) for r in lines] == [False, False, True, False, False, True]
    assert lines[1]["errors"] == replay(db, tasks[1])["errors"]
    # a clean file: exit 0, and the output is replaced whole
    tasks_file.write_text(json.dumps(tasks[3:5]))
    assert main(["env", "retail", "replay", "--db", str(FIXTURE / "db.json"), "--tasks", str(tasks_file),
                 "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 2
