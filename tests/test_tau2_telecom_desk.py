"""tau2-bench's real telecom domain as the paper profile's telecom desk (acl_lib/envs/tau2_telecom.py, tau2_phone.py,
and the customer's tool loop in llm_user.LLMUser), on the vendored 20-task ``small`` set (tests/data/tau2/telecom).

The gold replays are real episodes: a scripted agent makes the task's agent-side gold calls as tool calls, and a
scripted stand-in for the simulating LLM makes the user-side ones through the customer's tool loop when the agent
asks for them; the reward is the desk's own check. The same episodes without any action score 0, and the tests
assert that this is so for every task (a task whose assertions already hold on the broken phone is scored 0 by
its gold transfer, ACTION). The last test plays one episode with the shipped mini base as the simulating LLM.
"""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path

import pytest

from acl_lib.chat import format_tool_call
from acl_lib.config import ConfigError, WorldsConfig, load_config
from acl_lib.envs import llm_user
from acl_lib.envs.llm_user import LLMUser, LLMUserEpisode, OpenAIChat, openai_messages
from acl_lib.envs.tau2_phone import PHONE_TOOLS, PhoneTools, phone_db
from acl_lib.envs.tau2_telecom import AGENT_TOOLS, TelecomWorld, initial_world
from acl_lib.envs.telecom import TelecomEnv, scripted_expert
from conftest import ROOT

TELECOM = ROOT / "tests" / "data" / "tau2" / "telecom"
MINI_BASE = ROOT / "acl_lib" / "data" / "mini_base"
RAW = json.loads((TELECOM / "tasks_small.json").read_text())
DB = tomllib.loads((TELECOM / "db.toml").read_text())
USER_DB = tomllib.loads((TELECOM / "user_db.toml").read_text())


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """``<data_dir>/telecom`` as ``acl data prepare`` lays it out, the small set standing in for tasks.json and
    for the ``test`` split."""
    d = tmp_path_factory.mktemp("data")
    (d / "telecom").mkdir()
    for f in ("db.toml", "user_db.toml", "main_policy.md", "tech_support_manual.md"):
        (d / "telecom" / f).write_bytes((TELECOM / f).read_bytes())
    (d / "telecom" / "tasks.json").write_bytes((TELECOM / "tasks_small.json").read_bytes())
    ids = [t["id"] for t in RAW]
    (d / "telecom" / "split_tasks.json").write_text(json.dumps({"small": ids, "test": ids}))
    return d


@pytest.fixture(scope="module")
def env(data_dir) -> TelecomEnv:
    """The paper-scale telecom environment; its episodes here get a scripted chat (``play``), no simulator."""
    return TelecomEnv(WorldsConfig(data_dir=str(data_dir)), seed=0)


class GoldCustomer:
    """A scripted stand-in for the simulating LLM: it opens with a complaint, makes the user-side gold call the
    agent asks for by name (the expert's "Please run NAME on your phone..."), reports the result, and ends with
    ###STOP### when the agent asks whether anything else is needed."""

    def __init__(self, task):
        self.gold = [a for a in task.answer["actions"] if a["requestor"] == "user"]
        self.seen: list[list[dict]] = []
        self.offered: list[list[dict] | None] = []

    def __call__(self, messages, tools=None):
        self.seen.append(copy.deepcopy(messages))
        self.offered.append(tools)
        last = messages[-1]
        if last["role"] == "tool":
            return f"I did it. My phone says: {last['content']}"
        text = last["content"]
        if "anything else" in text:
            return "No, that is all. ###STOP###"
        if text.startswith("Please run "):
            name = text.split()[2]
            action = next(a for a in self.gold if a["name"] == name)
            self.gold.remove(action)
            return format_tool_call(action["name"], action["arguments"])  # hf-style markup
        return "My phone does not work as it should."


def play(env, task, agent, chat) -> LLMUserEpisode:
    """An episode of ``task`` whose customer is ``chat``; ``agent`` is a list of turns or ``(task, messages) ->
    turn`` (played until the episode ends)."""
    ep = llm_user.LLMUserEpisode(task, env.real.desk, LLMUser(task.meta["user_scenario"], chat), max_turns=30)
    turns = iter(agent) if isinstance(agent, list) else None
    while not ep.done:
        text = next(turns, None) if turns is not None else agent(task, ep.messages)
        if text is None:
            break
        ep.step(text)
    return ep


def test_the_vendored_small_set_is_loaded_whole(env):
    tasks = env.tasks("test", 1_000_000)
    assert len(tasks) == 20 and not env.real.skipped
    assert [t.meta["tau2_id"] for t in tasks] == [t["id"] for t in RAW]
    t = tasks[0]
    assert t.tools == AGENT_TOOLS and len(AGENT_TOOLS) == 13 and len(PHONE_TOOLS) == 30
    assert t.system_prompt.startswith("<main_policy>") and "<tech_support_policy>" in t.system_prompt
    assert (TELECOM / "tech_support_manual.md").read_text().strip()[:200] in t.system_prompt
    assert len(env.tasks("test", 5, seed=1)) == 5 and env.tasks("test", 5, seed=1) == env.tasks("test", 5, seed=1)


def test_every_task_replays_to_1_and_scores_0_without_any_action(env):
    tasks = env.tasks("test", 100)
    replayed, nothing = {}, {}
    for task in tasks:
        chat = GoldCustomer(task)
        ep = play(env, task, scripted_expert, chat)
        replayed[task.id] = (ep.reward(), ep.failure)
        assert not chat.gold, f"{task.id}: user-side gold actions not made: {chat.gold}"
        ep = play(env, task, ["Is there anything else I can help you with?"], GoldCustomer(task))
        nothing[task.id] = (ep.reward(), ep.failure)
    assert all(r == 1.0 for r, _ in replayed.values()), {k: v for k, v in replayed.items() if v[0] != 1.0}
    assert all(r == 0.0 for r, _ in nothing.values()), {k: v for k, v in nothing.items() if v[0] != 0.0}
    # Two tasks' assertions already hold on the broken phone (no service: a locked SIM, an ended contract): their
    # 0 comes from the gold transfer the agent did not make.
    held = {k for k, (_, why) in nothing.items() if "env assertion" not in why}
    assert held == {"telecom-[service_issue]lock_sim_card_pin[PERSONA:Hard]",
                    "telecom-[service_issue]contract_end_suspension[PERSONA:Hard]"}
    assert all("expected action transfer_to_human_agents" in nothing[k][1] for k in held)


def test_the_db_basis_compares_both_databases_with_the_gold_replay(env):
    """No vendored task scores DB (tau2's telecom tasks are scored by assertions), so each is rescored by it here:
    the gold episode leaves both databases as the gold replay does; doing nothing leaves the broken ones, except
    where the only gold action is a transfer (it changes nothing)."""
    for task in env.tasks("test", 100):
        task.answer["reward_basis"] = ["DB"]
        ep = play(env, task, scripted_expert, GoldCustomer(task))
        assert ep.reward() == 1.0, (task.id, ep.failure)
        ep = play(env, task, ["Is there anything else I can help you with?"], GoldCustomer(task))
        transfer_only = [a["name"] for a in task.answer["actions"]] == ["transfer_to_human_agents"]
        assert ep.reward() == (1.0 if transfer_only else 0.0), (task.id, ep.failure)
        if not transfer_only:
            assert "database differs from the gold outcome at " in ep.failure


def test_user_tool_traffic_never_reaches_the_agent(env):
    task = next(t for t in env.tasks("test", 100) if t.meta["tau2_id"].startswith("[service_issue]overdue_bill"))
    chat = GoldCustomer(task)
    ep = play(env, task, scripted_expert, chat)
    assert ep.reward() == 1.0, ep.failure
    # the simulator was offered the phone's tools, saw its own calls and their results ...
    assert chat.offered[0] == PHONE_TOOLS
    tool_results = [m for msgs in chat.seen for m in msgs if m["role"] == "tool"]
    assert {m["name"] for m in tool_results} == {"make_payment", "reboot_device"}
    assert any(m["role"] == "assistant" and m.get("tool_calls") for msgs in chat.seen for m in msgs)
    assert "Paid 65.0 USD for bill B1234321" in tool_results[0]["content"]
    # ... and the agent saw only the customer's words: its tool messages are its own calls' results
    agent_tools = {s["function"]["name"] for s in AGENT_TOOLS}
    assert all(m["name"] in agent_tools for m in ep.messages if m["role"] == "tool")
    user_text = " ".join(m["content"] for m in ep.messages if m["role"] == "user")
    assert "<tool_call>" not in user_text and "make_payment" not in user_text
    assert all("tool_calls" not in m for m in ep.messages if m["role"] == "user")
    rec = ep.record()
    assert [c["name"] for c in rec["user_sim"]["tool_calls"]] == ["make_payment", "reboot_device"]
    assert "Paid 65.0 USD" not in json.dumps([m for m in rec["messages"] if m["role"] == "tool"])
    # the customer's own words (which quote the phone) are what the agent gets
    assert any("I did it. My phone says: Paid 65.0 USD" in m["content"] for m in ep.messages if m["role"] == "user")


def combined(env, category: str, issues: list[str]):
    """A task combining several small-set problems, as tau2's ``test`` and ``full`` sets do (their ids list up to 9
    problems of the 19 the small set has): every problem's set-up and gold actions in turn, the assertions of
    ``category``'s small task."""
    by = {t.meta["tau2_id"]: t for t in env.tasks("test", 100)}
    parts = [next(t for k, t in by.items() if f"]{issue}[" in k) for issue in issues]
    base = next(t for k, t in by.items() if k.startswith(f"[{category}]"))
    task = copy.deepcopy(base)
    task.answer["initialization_actions"] = [parts[0].answer["initialization_actions"][0]] + [
        a for p in parts for a in p.answer["initialization_actions"][1:]]
    task.answer["actions"] = [a for p in parts for a in p.answer["actions"]]
    task.answer["env_assertions"] = list({json.dumps(a, sort_keys=True): a for p in [base] + parts
                                          for a in p.answer["env_assertions"]
                                          if p is base or a["env_type"] == "assistant"}.values())
    return task


@pytest.mark.parametrize("category, issues", [
    ("mobile_data_issue", ["data_mode_off", "data_saver_mode_on", "bad_vpn"]),
    ("mms_issue", ["data_usage_exceeded", "break_app_sms_permission", "bad_wifi_calling"]),
    ("mms_issue", ["user_abroad_roaming_disabled_off", "bad_network_preference", "break_apn_mms_setting"]),
])
def test_combined_problems_need_every_fix(env, category, issues):
    task = combined(env, category, issues)
    ep = play(env, task, scripted_expert, GoldCustomer(task))
    assert ep.reward() == 1.0, ep.failure
    ep = play(env, task, ["Is there anything else I can help you with?"], GoldCustomer(task))
    assert ep.reward() == 0.0
    # every fix but the last one is not enough
    partial = copy.deepcopy(task)
    partial.answer["actions"] = partial.answer["actions"][:-1]
    ep = play(env, task, lambda t, msgs: scripted_expert(partial, msgs), GoldCustomer(task))
    assert ep.reward() == 0.0 and "env assertion" in ep.failure


# --- the phone's rules and tools on hand-made states ---------------------------------------------------------------


def phone(**device) -> PhoneTools:
    return PhoneTools(phone_db({"device": device}))


def test_airplane_mode_cuts_signal_speed_and_mms():
    p = phone()
    assert "Speed test: 220.00 Mbps download (Excellent)" in p.run_speed_test()  # 5G at a good signal
    out = p.toggle_airplane_mode()
    assert "Airplane mode is now ON" in out and "airplane mode" in p.check_status_bar()
    assert p.run_speed_test() == "Speed test failed: no connection."
    assert p.device["network_connection_status"] == "no_service" and not p.mms_works()
    assert p.assert_service_status("no_service") and p.assert_mobile_data_status(False)
    p.toggle_airplane_mode()  # off: a network search at the local signals (5G excellent)
    assert "4 bars (excellent)" in p.check_status_bar() and p.assert_internet_speed(200, "excellent")


@pytest.mark.parametrize("device, speed, grade", [
    ({"data_saver_mode": True}, 44.0, "Good"),
    ({"network_mode_preference": "2g_only", "network_technology_connected": "2G", "network_signal_strength": "poor"},
     0.05, "Very Poor"),
    ({"vpn_connected": True, "vpn_details": {"server_performance": "poor"}}, 22.0, "Fair"),
    ({"data_enabled": False}, None, "No Connection"),
])
def test_speed_test_rules(device, speed, grade):
    assert phone(**device).speed() == (speed, grade)


def test_mms_needs_3g_the_mmsc_and_both_permissions():
    assert phone().mms_works()
    p = phone()
    p.set_network_mode_preference("2g_only")
    assert not p.mms_works() and "2G" in p.check_status_bar()
    assert "not a network mode" in p.set_network_mode_preference("6g")  # an answer, not an exception
    p.set_network_mode_preference("3g_only")
    assert p.mms_works()
    p = phone()
    p.remove_app_permission("messaging", "storage")
    assert not p.mms_works() and "Success" not in p.grant_app_permission("messaging", "camera")
    p.grant_app_permission("messaging", "STORAGE")
    assert p.mms_works()
    p.break_apn_mms_setting()
    assert not p.mms_works()
    p.reset_apn_settings()
    assert not p.mms_works()  # applied at the next reboot
    assert "APN settings reset" in p.reboot_device() and p.mms_works()
    assert "no app 'camera'" in p.check_app_permissions("camera")


def test_sync_carries_the_account_to_the_phone_and_refuel_fixes_data():
    task = next(t for t in RAW if t["id"].startswith("[mobile_data_issue]data_usage_exceeded"))
    world = initial_world(DB, USER_DB, {"initialization_actions": task["initial_state"]["initialization_actions"]})
    s = world.phone.surroundings
    assert s["mobile_data_usage_exceeded"] and not world.phone.mobile_data_working()
    assert not world.agent.assert_data_refueling_amount("C1001", "L1002", 2.0)
    fns = world.functions()
    usage = fns["get_data_usage"](customer_id="C1001", line_id="L1002")
    assert usage["data_used_gb"] == 15.1 and usage["data_limit_gb"] == 15.0 and usage["cycle_end_date"] == "2025-02-28"
    out = fns["refuel_data"](customer_id="C1001", line_id="L1002", gb_amount=2.0)
    assert out["charge"] == 4.0 and not s["mobile_data_usage_exceeded"]  # synced after the call
    assert world.agent.assert_data_refueling_amount("C1001", "L1002", 2.0) and world.phone.mobile_data_working()
    draft = world.agent.get_bills_for_customer("C1001")[0]
    assert draft["status"] == "Draft" and draft["total_due"] == 4.0 and draft["issue_date"] == "2025-03-01"
    # roaming: the carrier's switch is the phone's permission to roam abroad
    fns["disable_roaming"](customer_id="C1001", line_id="L1002")
    assert s["roaming_allowed"] is False
    assert fns["enable_roaming"](customer_id="C1001", line_id="L1002") == "Roaming enabled successfully"
    assert s["roaming_allowed"] is True


def test_a_payment_request_reaches_the_phone_and_the_payment_the_bill():
    world = TelecomWorld(copy.deepcopy(DB), copy.deepcopy(USER_DB))
    world.call("user", "set_user_info", {"name": "John Smith", "phone_number": "555-123-2002"})
    assert world.run_user_tool("check_payment_request", {}) == "There is no payment request."
    bill = next(b for b in world.db["bills"] if b["customer_id"] == "C1001" and b["status"] != "Paid")
    world.functions()["send_payment_request"](customer_id="C1001", bill_id=bill["bill_id"])
    assert bill["bill_id"] in world.run_user_tool("check_payment_request", {})
    world.run_user_tool("make_payment", {})
    assert bill["status"] == "Paid" and world.phone.surroundings["payment_request"] is None


# --- malformed calls -------------------------------------------------------------------------------------------------


def test_malformed_agent_and_customer_calls_are_error_observations(env):
    task = env.tasks("test", 100)[7]  # data usage exceeded
    ep = play(env, task, [], GoldCustomer(task))
    turns = ['<tool_call>\n{"name": "refuel_data", "arguments": {"customer_id": "C1001"\n</tool_call>',
             format_tool_call("refuel_data", {"customer_id": "C1001", "line_id": "L1002", "gb_amount": "two"}),
             format_tool_call("refuel_data", {"customer_id": "C1001", "line_id": "L9999", "gb_amount": 1.0}),
             format_tool_call("refuel_data", {"customer_id": "C1001", "line_id": "L1002", "gb_amount": -1.0}),
             format_tool_call("get_details_by_id", {"id": "X1"}),
             format_tool_call("toggle_airplane_mode", {}),  # the customer's tool: not the agent's
             format_tool_call("get_bills_for_customer", {"customer_id": "nobody"})]
    for text in turns:
        (obs,) = ep.step(text)
        assert obs["role"] == "tool" and obs["content"].startswith("Error: "), obs
    assert not ep.done and len(ep.protocol_errors) == 3
    world = ep.toolkit
    for name, args in [("no_such_tool", {}), ("grant_app_permission", {"app_name": "messaging"}),
                       ("set_network_mode_preference", {"mode": 3}), ("break_vpn", {}),
                       ("set_apn_settings", {"apn_settings": {"apn_name": "nope"}}), ("make_payment", [])]:
        assert world.run_user_tool(name, args).startswith("Error: "), name
    assert world.run_user_tool("make_payment", {}) == "There is no payment request to pay."
    assert not world.phone.device["vpn_connected"]  # the set-up functions are not the customer's tools


def test_the_customer_loop_reads_malformed_calls_and_is_capped():
    results = []

    def run_tool(name, args):
        results.append(name)
        return f"ran {name}"

    replies = iter(['<tool_call>\n{"name": "check_status_bar"\n</tool_call>',
                    {"content": "", "tool_calls": [{"name": "check_status_bar", "arguments": {}}]},
                    "It shows four bars."])
    seen = []

    def chat(messages, tools=None):
        seen.append(messages)
        return next(replies)

    user = LLMUser({"instructions": "x"}, chat)
    user.attach_tools(PHONE_TOOLS, run_tool)
    assert user.first_message() == "It shows four bars." and results == ["check_status_bar"]
    assert seen[1][-1] == {"role": "tool", "name": "invalid", "content": seen[1][-1]["content"]}
    assert seen[1][-1]["content"].startswith("Error: malformed JSON")
    assert user.said == ["It shows four bars."] and "your own phone" in user.system_prompt
    user = LLMUser({"instructions": "x"}, lambda m, tools=None: format_tool_call("check_status_bar", {}),
                   max_tool_calls=3)
    user.attach_tools(PHONE_TOOLS, run_tool)
    assert user.first_message() == "" and "more than 3 tool calls" in user.error


def test_the_local_backends_render_the_tools_through_the_chat_template():
    """hf / vllm: ``PolicyChat`` hands the policy a task carrying the phone's schemas (the chat template renders
    them); the calls come back as <tool_call> markup, and the next prompt, with the call and its result, renders."""
    from acl_lib.model.chat_template import render_chat

    seen = []

    class Policy:  # the interface of eval.policies.HFPolicy / VLLMPolicy: [(task, messages)] -> [text]
        max_new_tokens = 8

        def __call__(self, batch):
            ((task, msgs),) = batch
            seen.append((task, copy.deepcopy(msgs)))
            return [format_tool_call("check_status_bar", {}) if len(seen) == 1 else "It shows airplane mode."]

    user = LLMUser({"instructions": "x"}, llm_user.PolicyChat(Policy()))
    user.attach_tools(PHONE_TOOLS, lambda name, args: "Status bar: airplane mode | battery 80%")
    assert user.first_message() == "It shows airplane mode."
    assert seen[0][0].tools == PHONE_TOOLS and seen[1][0].tools == PHONE_TOOLS
    text = render_chat(seen[1][1], tools=seen[1][0].tools, add_generation_prompt=True)
    assert '"name": "toggle_airplane_mode"' in text and "<tool_response>\nStatus bar: airplane mode" in text
    assert '<tool_call>\n{"name": "check_status_bar"' in text
    plain = []
    text_only = llm_user.PolicyChat(type("P", (), {"__call__": lambda self, b: plain.append(b) or ["Hi."]})())
    assert LLMUser({"instructions": "x"}, text_only).first_message() == "Hi." and plain[0][0][0].tools == []


def test_the_openai_backend_sends_the_tools_and_reads_tool_calls(monkeypatch):
    sent = []
    answers = iter([{"choices": [{"message": {"content": None, "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "run_speed_test", "arguments": "{}"}}]}}]},
        {"choices": [{"message": {"content": "It says 220 Mbps."}}]}])

    def post(self, body):
        sent.append(json.loads(body))
        return next(answers)

    monkeypatch.setattr(OpenAIChat, "_post", post)
    chat = OpenAIChat("http://127.0.0.1:1/v1", "m")
    user = LLMUser({"instructions": "x"}, chat)
    user.attach_tools(PHONE_TOOLS, lambda name, args: "Speed test: 220.00 Mbps download (Excellent).")
    assert user.first_message() == "It says 220 Mbps."
    assert sent[0]["tools"] == PHONE_TOOLS
    follow = sent[1]["messages"]
    assert follow[-2]["tool_calls"][0]["id"] == "call_0" and follow[-1] == {
        "role": "tool", "tool_call_id": "call_0", "content": "Speed test: 220.00 Mbps download (Excellent)."}
    assert openai_messages([{"role": "user", "content": "hi"}]) == [{"role": "user", "content": "hi"}]


# --- wiring ----------------------------------------------------------------------------------------------------------


def test_paper_profile_scores_the_real_set_whole_and_needs_a_simulator(data_dir):
    from acl_lib.envs import BENCHMARKS
    from acl_lib.eval import harness

    paper = load_config("paper")
    assert "telecom" not in paper.eval.limits
    assert harness.benchmark_size(paper, BENCHMARKS["telecom"]) == paper.worlds.n_ood  # "all"
    no_sim = TelecomEnv(WorldsConfig(data_dir=str(data_dir)))
    task = no_sim.tasks("test", 1)[0]
    with pytest.raises(ConfigError, match="worlds.user_sim.backend"):
        no_sim.start(task)
    with pytest.raises(ConfigError, match="lacks db.toml"):
        TelecomEnv(WorldsConfig(data_dir=str(data_dir / "nowhere"))).tasks("test", 1)
    assert TelecomEnv(seed=0).tasks("test", 2)[0].meta["source"] == "generated"  # mini: the generated desk


@pytest.mark.slow
def test_a_short_evaluation_with_the_mini_base_as_the_customer(data_dir, tmp_path):
    """The evaluator on the real telecom set, the shipped mini base (hf backend, in process) playing the customer
    with the phone's tools: it writes no useful text and no calls, so the episode ends at its turn limit, scored 0.
    Without a simulator the same evaluation is refused before any scoring."""
    from acl_lib.eval.harness import evaluate

    cfg = load_config("smoke", [f"worlds.data_dir={data_dir}", "worlds.user_sim.backend=hf",
                                f"worlds.user_sim.model={MINI_BASE}", "worlds.user_sim.max_new_tokens=16",
                                "worlds.n_ood=1", "eval.max_turns=2"])
    metrics = evaluate(cfg, "null", tmp_path, benchmarks=["telecom"])
    assert metrics["n_tasks"] == {"telecom": 1} and metrics["scores"] == {"telecom": 0.0}
    (rec,) = [json.loads(line) for line in (tmp_path / "records" / "telecom.jsonl").read_text().splitlines()]
    assert rec["id"].startswith("telecom-[") and rec["user_sim"]["model"].startswith("policy:")
    assert "tool_calls" in rec["user_sim"] and rec["user_sim"]["error"] is None and rec["failure"]
    assert rec["messages"][1]["role"] == "user" and all(m["role"] != "tool" for m in rec["messages"])
    with pytest.raises(ConfigError, match="worlds.user_sim.backend"):
        evaluate(load_config("smoke", [f"worlds.data_dir={data_dir}"]), "null", tmp_path / "x", benchmarks=["telecom"])
