"""tau2-bench's telecom data (issue 15, item 4): the vendored subset in tests/data/tau2/telecom (its 20-task
``small`` set, the agent and user databases, the policies) passes the checks of ``acl data check`` through
``acl data prepare``'s conversion, and its customers' scenarios render into the LLM user simulator's instructions.
These tests pin the facts of the data the paper-scale telecom desk plays (the desk itself, the customer's phone and
its tools: tests/test_tau2_telecom_desk.py; what is still missing: docs/paper-checklist.md, item 4).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from acl_lib import paper_data as pd
from acl_lib.envs import llm_user
from conftest import ROOT

TELECOM = ROOT / "tests" / "data" / "tau2" / "telecom"


def _tasks() -> list[dict]:
    return json.loads((TELECOM / "tasks_small.json").read_text())


def _source(tmp: Path) -> Path:
    """tau2's telecom files as ``acl data prepare`` downloads them, with the small set standing in for tasks.json."""
    src = tmp / "telecom_src"
    src.mkdir()
    for f in ("db.toml", "user_db.toml", "main_policy.md", "tech_support_manual.md"):
        (src / f).write_bytes((TELECOM / f).read_bytes())
    (src / "tasks.json").write_bytes((TELECOM / "tasks_small.json").read_bytes())
    (src / "split_tasks.json").write_text(json.dumps({"small": [t["id"] for t in _tasks()]}))
    return src


def test_the_real_telecom_files_pass_data_check(tmp_path):
    d = tmp_path / "paper"
    pd.convert_tau2("telecom", _source(tmp_path), d)
    report = {f.path: f for f in pd.check(d, checksums=False).files}
    telecom = {p: f for p, f in report.items() if p.startswith("telecom/")}
    assert set(telecom) == {f"telecom/{f}" for f in pd.TAU2_FILES["telecom"]}
    assert all(f.status == "ok" for f in telecom.values()), {p: (f.status, f.detail) for p, f in telecom.items()}
    # A task without its scenario is named as malformed.
    broken = _tasks()
    del broken[3]["user_scenario"]
    (d / "telecom" / "tasks.json").write_text(json.dumps(broken))
    bad = {f.path: f for f in pd.check(d, checksums=False).files}["telecom/tasks.json"]
    assert bad.status != "ok" and "user_scenario" in str(bad.detail)


def test_telecom_scenarios_render_into_the_simulator_instructions():
    for task in _tasks():
        prompt = llm_user.system_prompt(task["user_scenario"])
        ins = task["user_scenario"]["instructions"]
        assert "Domain: telecom" in prompt and ins["reason_for_call"] in prompt and ins["known_info"] in prompt
        assert all(sig in prompt for sig in (llm_user.STOP, llm_user.TRANSFER))


def test_what_the_telecom_tasks_ask_of_the_simulated_customer():
    """The facts behind the checklist's list of what is missing: most of a telecom task is done by the customer on
    their own phone (user-side gold actions, device state set up by user-side initialization actions), and it is
    scored by assertions on that phone's state, which the rule-based and LLM customers of the suite do not have."""
    tasks = _tasks()
    user_actions = {a["name"] for t in tasks for a in t["evaluation_criteria"]["actions"] or []
                    if a["requestor"] == "user"}
    agent_actions = {a["name"] for t in tasks for a in t["evaluation_criteria"]["actions"] or []
                     if a["requestor"] == "assistant"}
    assertions = {(a["env_type"], a["func_name"]) for t in tasks for a in t["evaluation_criteria"]["env_assertions"]}
    expected = {"toggle_airplane_mode", "toggle_roaming", "reseat_sim_card", "reboot_device", "make_payment"}
    assert expected <= user_actions
    assert agent_actions <= {"enable_roaming", "refuel_data", "transfer_to_human_agents", "send_payment_request",
                             "resume_line"}
    assert ("user", "assert_internet_speed") in assertions and ("user", "assert_can_send_mms") in assertions
    assert all(set(t["evaluation_criteria"]["reward_basis"]) <= {"ENV_ASSERTION", "ACTION"} for t in tasks)
    user_db = tomllib.loads((TELECOM / "user_db.toml").read_text())
    assert {"airplane_mode", "roaming_enabled", "sim_card_status", "active_apn_settings"} <= set(user_db["device"])
    db = tomllib.loads((TELECOM / "db.toml").read_text())
    assert {"plans", "customers", "lines", "bills", "devices"} <= set(db)
