"""The LLM user simulator (acl_lib/envs/llm_user.py) on the real tau2 retail and mock tasks (tests/data/tau2).

The simulating model is the shipped 2M-parameter mini base (acl_lib/data/mini_base): in process (the ``hf``
backend, the evaluator's HFPolicy) and over HTTP (the ``openai`` backend against ``transformers serve`` started on
127.0.0.1 inside the test). The mini base is no good customer, which is what the failure paths need: mid-trained
as the retail desk's agent, it opens most of these conversations with tool-call markup (garbled: the episode ends
with that reason), and served with its own tokenizer that markup makes ``transformers serve`` answer HTTP 500 (a
failed turn). The tests that need a customer who speaks take the first tasks it speaks on (``spoken``: played, not
chosen by id, so a rebuilt base finds its own). The agent is a gold-replay agent: the
task's gold actions as tool calls, then the required information and a transfer to a human (which ends the
conversation properly), so a correct end state scores 1 and a wrong one 0 by database equality.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from acl_lib.chat import format_tool_call
from acl_lib.config import ConfigError, UserSimConfig, WorldsConfig, load_config
from acl_lib.envs import llm_user
from acl_lib.envs.llm_user import GREETING, LLMUser, OpenAIChat, UserSimError
from acl_lib.envs.mock import MockEnv
from acl_lib.envs.retail import RetailEnv
from acl_lib.eval import policies  # hands llm_user the evaluator's policies for the local backends (hf here)
from conftest import ROOT, child_env, free_port

TAU2 = ROOT / "tests" / "data" / "tau2"
MINI_BASE = ROOT / "acl_lib" / "data" / "mini_base"
ASK_EMAIL = "Could you please give me your email address?"


def hf_sim(**kw) -> UserSimConfig:
    return UserSimConfig(backend="hf", model=str(MINI_BASE), max_new_tokens=kw.pop("max_new_tokens", 32), **kw)


def gold_agent(task, messages) -> str:
    """The task's gold actions one per turn, then what must be communicated and a transfer to a human."""
    return gold_turn(task, sum(1 for m in messages if m["role"] == "assistant"))


def gold_turn(task, k: int) -> str:
    actions = task.answer["actions"]
    if k < len(actions):
        return format_tool_call(actions[k]["name"], actions[k]["arguments"])
    info = " ".join(str(i) for i in task.answer.get("communicate_info") or [])
    return f"{info} Done; I am transferring you to a human agent.\n" + format_tool_call(
        "transfer_to_human_agents", {"summary": "request handled"})


def play(env, task, agent, max_turns=30):
    ep = env.start(task, max_turns=max_turns)
    while not ep.done:
        ep.step(agent(task, ep.messages))
    return ep


def spoken(ep) -> bool:
    """Whether the simulator saw the (ended) episode through without a garbled or failed turn."""
    ep.reward()  # an episode's failure reason is set when it is scored
    return not (ep.failure or "").startswith("user simulator failed")


def first_spoken(env, tasks, agent, n: int = 1, max_turns: int = 30) -> list:
    """The first ``n`` (task, episode) of ``tasks`` that the simulator plays through with ``agent`` (see ``spoken``)."""
    found = []
    for task in tasks:
        ep = play(env, task, agent, max_turns)
        if spoken(ep):
            found.append((task, ep))
            if len(found) == n:
                break
    return found


def write_task(task) -> bool:
    """The task's gold actions change the database (some real gold writes fail and change nothing)."""
    from acl_lib.envs.retail import gold_state
    from acl_lib.envs.retail_db import WRITE_TOOLS

    if not any(a["name"] in WRITE_TOOLS for a in task.answer["actions"]):
        return False
    gold = gold_state(_WORLD(), task.answer["actions"])
    return bool(gold["orders"] or gold["users"])


def _WORLD():
    if not hasattr(_WORLD, "db"):
        _WORLD.db = json.loads((TAU2 / "retail" / "db.json").read_text())
    return _WORLD.db


def no_writes(agent):
    """``agent`` with every write replaced by a harmless look-up: the end state cannot be the gold one."""
    from acl_lib.envs.retail_db import WRITE_TOOLS

    def wrong(task, messages):
        text = agent(task, messages)
        if any(f'"name": "{w}"' in text for w in WRITE_TOOLS):
            return format_tool_call("get_user_details", {"user_id": "nobody"})
        return text

    return wrong


# --- the protocol -----------------------------------------------------------------------------------------


def test_system_prompt_is_built_from_the_user_scenario():
    raw = json.loads((TAU2 / "retail" / "tasks.json").read_text())[0]
    ins = raw["user_scenario"]["instructions"]
    prompt = llm_user.system_prompt(raw["user_scenario"])
    for key in ("reason_for_call", "known_info", "unknown_info", "task_instructions"):
        assert ins[key] in prompt, key
    assert prompt.index("Reason for call:") < prompt.index("Known info:") < prompt.index("Unknown info:") \
        < prompt.index("Task instructions:")
    assert "<scenario>" in prompt and "Domain: retail" in prompt
    assert all(sig in prompt for sig in ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"))
    mock = json.loads((TAU2 / "mock" / "tasks.json").read_text())[0]["user_scenario"]  # persona + free text
    text = llm_user.scenario_text(mock)
    assert text.startswith("Persona:\n\t" + mock["persona"]) and mock["instructions"] in text
    with pytest.raises(ValueError, match="instructions"):
        llm_user.scenario_text({"persona": "x"})


def test_the_simulator_sees_the_conversation_with_roles_flipped():
    # The model here is a plain function: what is tested is what LLMUser sends and how it reads the replies.
    seen = []

    def chat(messages):
        seen.append(messages)
        return ["<think>who am I?</think>  I want to return a lamp.", "Sure, it is a@b.com. ###STOP###"][len(seen) - 1]

    user = LLMUser({"instructions": "Return the lamp."}, chat, max_turns=5)
    assert user.first_message() == "I want to return a lamp." and user.first_message() == "I want to return a lamp."
    assert seen[0][1:] == [{"role": "user", "content": GREETING}] and seen[0][0]["role"] == "system"
    assert user.reply(ASK_EMAIL).endswith("###STOP###") and user.signal == "stop" and user.done
    assert seen[1][1:] == [{"role": "user", "content": GREETING},
                           {"role": "assistant", "content": "I want to return a lamp."},
                           {"role": "user", "content": ASK_EMAIL}]
    assert user.reply("anything else?") == "" and len(seen) == 2  # over: the model is not asked again


def test_thinking_is_not_part_of_the_message():
    assert llm_user.clean_reply("<think>\nplan\n</think>\n\nHi, I need help.") == "Hi, I need help."
    assert llm_user.clean_reply("plan the answer</think>Hi.") == "Hi."  # the template opened the block


@pytest.mark.parametrize("reply, error", [("   ", "empty reply"), ("<think>only thinking", "empty reply"),
                                          ('<tool_call>\n{"name": "x"}\n</tool_call>', "tool-call markup")])
def test_a_garbled_reply_is_a_failed_turn(reply, error):
    user = LLMUser({"instructions": "x"}, lambda m: reply)
    assert user.first_message() == "" and error in user.error and user.done


def test_turn_limit_and_transfer_signals():
    user = LLMUser({"instructions": "x"}, lambda m: "Hello?", max_turns=2)
    user.first_message()
    user.reply("Hi.")
    assert user.cut_off and user.done and user.reply("more") == ""
    user = LLMUser({"instructions": "x"}, lambda m: "OK ###TRANSFER###")
    assert user.first_message() and user.signal == "transfer"


def test_a_local_simulating_model_is_loaded_by_the_policy_handed_down(monkeypatch):
    """The simulator (envs layer) never imports the evaluator (the layer above): a local model is loaded by the
    factory the evaluator hands it (``use_local_policy``; ``acl_lib.eval.policies`` does on import)."""
    assert llm_user._LOCAL_POLICY is policies.user_simulator_policy
    monkeypatch.setattr(llm_user, "_SIMULATORS", {})
    monkeypatch.setattr(llm_user, "_LOCAL_POLICY", None)
    with pytest.raises(RuntimeError, match="use_local_policy"):
        llm_user.simulator_for(hf_sim())
    loaded = []

    def factory(cfg, model):
        loaded.append((cfg.backend, model))
        return lambda batch: ["Hi, I need help with an order."]

    chat = llm_user.simulator_for(hf_sim(), local_policy=factory)
    assert loaded == [("hf", str(MINI_BASE))]
    assert LLMUser({"instructions": "x"}, chat).first_message() == "Hi, I need help with an order."
    assert llm_user.simulator_for(hf_sim()) is chat and len(loaded) == 1  # one simulator per config and process


# --- in process: the mini base as the simulating LLM ----------------------------------------------------------


@pytest.fixture(scope="module")
def retail_env():
    return RetailEnv(WorldsConfig(data_dir=str(TAU2), user_sim=hf_sim()))


def test_without_a_simulator_real_tasks_are_refused_with_the_key_to_set():
    env = RetailEnv(WorldsConfig(data_dir=str(TAU2)))
    with pytest.raises(ConfigError, match="worlds.user_sim.backend"):
        env.start(env.tasks("test", 1)[0])
    with pytest.raises(ConfigError, match="needs user_sim.model"):
        load_config("smoke", ["worlds.user_sim.backend=hf"])
    with pytest.raises(ConfigError, match="url"):
        load_config("smoke", ["worlds.user_sim.backend=openai", "worlds.user_sim.model=m"])


@pytest.mark.slow
def test_real_retail_tasks_are_played_and_scored_by_database_equality(retail_env):
    found = first_spoken(retail_env, [t for t in retail_env.tasks("test", 40) if write_task(t)], gold_agent, n=2)
    assert len(found) == 2
    chat = llm_user.simulator_for(retail_env.worlds.user_sim)
    for i, (task, ep) in enumerate(found):
        # the first user message is the mini base's answer to the greeting, given the task's own scenario
        first = ep.messages[1]["content"]
        assert first and first != task.user_prompt
        if i == 0:
            assert first == llm_user.clean_reply(chat(LLMUser(task.meta["user_scenario"], chat).prompt()))
        assert ep.transferred and ep.reward() == 1.0, ep.failure
        rec = ep.record()
        assert rec["user_sim"]["model"].startswith("policy:") and rec["user_sim"]["error"] is None
        # the same task without its writes: the database differs from the gold replay's
        ep = play(retail_env, task, no_writes(gold_agent))
        assert ep.reward() == 0.0 and "database differs from gold" in ep.failure


def test_a_garbled_simulator_turn_ends_the_episode_with_its_reason(retail_env):
    # the 2M mini base, playing the customer, soon writes tool-call markup: the first task where it does
    garbled = None
    for task in retail_env.tasks("test", 40):
        ep = play(retail_env, task, lambda task, msgs: "Let me check.", max_turns=3)
        if ep.reward() == 0.0 and ep.failure.startswith("user simulator failed: the reply holds tool-call markup"):
            garbled = ep
            break
    assert garbled is not None and garbled.done
    # the garbled reply never reaches the agent: no user message carries the markup, and the episode ends there
    assert not [m for m in garbled.messages if m["role"] == "user" and "<tool_call>" in m["content"]]
    assert garbled.messages[-1]["role"] in ("assistant", "user") and garbled.record()["user_sim"]["error"]


def test_a_conversation_cut_off_scores_zero_even_with_the_right_database(retail_env):
    tasks = [t for t in retail_env.tasks("test", 40) if not t.answer["communicate_info"] and not write_task(t)]
    found = first_spoken(retail_env, tasks, lambda task, msgs: "Let me check.", max_turns=1)
    assert found
    _, ep = found[0]
    assert ep.done and ep.reward() == 0.0
    assert ep.failure == "ended before the customer finished: turn limit (1) reached"


def test_real_mock_tasks_are_played_by_their_own_scenario():
    env = MockEnv(WorldsConfig(data_dir=str(TAU2), user_sim=hf_sim()))
    tasks = env.tasks("test", 10)
    assert len(tasks) == 8  # the 2 that need an LLM judge or user-side tools stay out
    task = next(t for t in tasks if t.id == "tau2-mock-create_task_1")
    ep = play(env, task, gold_agent)
    assert ep.messages[1]["content"] != task.user_prompt  # the LLM's message, not the derived request
    assert ep.reward() == 1.0, ep.failure
    assert ep.toolkit.db["tasks"]["task_2"]["title"] == "Important Meeting"


def test_evaluation_runs_the_real_retail_and_mock_benchmarks(tmp_path, monkeypatch):
    from acl_lib.eval.harness import evaluate

    monkeypatch.chdir(ROOT / "notebooks")  # where a notebook runs: the model path is the checkout's
    cfg = load_config("smoke", [f"worlds.data_dir={TAU2}", "worlds.user_sim.backend=hf",
                                "worlds.user_sim.model=acl_lib/data/mini_base", "worlds.user_sim.max_new_tokens=32",
                                "worlds.n_test=1", "worlds.n_ood=1", "eval.max_turns=2"])
    metrics = evaluate(cfg, "null", tmp_path, benchmarks=["retail", "mock"])
    assert metrics["n_tasks"] == {"retail": 1, "mock": 1} and metrics["scores"] == {"retail": 0.0, "mock": 0.0}
    recs = [json.loads(line) for line in (tmp_path / "records" / "retail.jsonl").read_text().splitlines()]
    assert all(r["failure"].startswith(("ended before the customer finished", "user simulator failed")) for r in recs)
    assert all(r["messages"][1]["role"] == "user" and "user_sim" in r for r in recs)


# --- over HTTP: transformers serve on the loopback address ------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``transformers serve`` on 127.0.0.1 (models loaded per request: the mini base and its serving copy)."""
    exe = shutil.which("transformers", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip('transformers serve is not installed: pip install "transformers[serving]"')
    copy = llm_user.serving_copy(MINI_BASE, tmp_path_factory.mktemp("sim") / "mini_base_text")
    port = free_port()
    log = open(tmp_path_factory.mktemp("serve") / "serve.log", "w")
    proc = subprocess.Popen([exe, "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
                            stdout=log, stderr=subprocess.STDOUT, env=child_env())
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            if proc.poll() is not None:
                pytest.fail(f"transformers serve exited with {proc.returncode}; see {log.name}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.25)
        else:
            pytest.fail("transformers serve did not answer /health within 60 s")
        yield {"url": url + "/v1", "copy": str(copy)}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def chatty_agent(task, messages) -> str:
    """Two text turns to the customer, then the gold-replay agent: the simulator answers text turns (the mini base
    answers these two as text in most tasks, and with tool-call markup in a few)."""
    k = sum(1 for m in messages if m["role"] == "assistant")
    if k < 2:
        return ["Let me check.", "I see."][k]
    return gold_turn(task, k - 2)


@pytest.mark.slow
def test_over_http_against_transformers_serve(served):
    sim = UserSimConfig(backend="openai", url=served["url"], model=served["copy"], max_new_tokens=32, retries=0)
    env = RetailEnv(WorldsConfig(data_dir=str(TAU2), user_sim=sim))
    found = first_spoken(env, [t for t in env.tasks("test", 40) if write_task(t)], gold_agent)
    assert found
    task, ep = found[0]
    assert ep.messages[1]["content"] and ep.reward() == 1.0, ep.failure
    assert ep.record()["user_sim"]["model"].startswith("openai:")
    # the same model over HTTP and in process: greedy, the same first message
    local = llm_user.simulator_for(hf_sim())
    assert ep.messages[1]["content"] == llm_user.clean_reply(local(LLMUser(task.meta["user_scenario"], local).prompt()))
    # a conversation where the mini base writes tool-call markup as the customer: the serving copy answers it as
    # text (200), a garbled turn
    garbled = None
    for task in env.tasks("test", 40)[:8]:
        ep = play(env, task, chatty_agent, max_turns=12)
        if ep.reward() == 0.0 and "tool-call markup" in ep.failure:
            garbled = task
            break
    assert garbled is not None and ep.done
    # the model dir as it is: serve cannot parse the malformed tool call and answers an HTTP error, a failed turn
    # (500, or 400 when the call's arguments are not JSON: which one depends on the text the base writes, and that
    # differs between CPUs in the last float bits)
    sim500 = UserSimConfig(backend="openai", url=served["url"], model=str(MINI_BASE), max_new_tokens=32, retries=0)
    ep = play(RetailEnv(WorldsConfig(data_dir=str(TAU2), user_sim=sim500)), garbled, chatty_agent, max_turns=12)
    assert ep.done and ep.reward() == 0.0 and re.match(r"user simulator failed: HTTP (400|500) ", ep.failure)


@pytest.mark.slow
def test_remote_simulator_turns_run_concurrently_with_the_same_outcomes(served):
    from acl_lib.eval.harness import run_episodes

    records = {}
    for concurrency in (1, 4):
        sim = UserSimConfig(backend="openai", url=served["url"], model=served["copy"], max_new_tokens=24, retries=0,
                            concurrency=concurrency)
        env = RetailEnv(WorldsConfig(data_dir=str(TAU2), user_sim=sim))
        episodes = [env.start(t, max_turns=12) for t in env.tasks("test", 40)[:4]]  # answered, and one garbled
        assert {ep.step_concurrency for ep in episodes} == {concurrency}
        run_episodes(lambda batch: [chatty_agent(t, m) for t, m in batch], episodes, batch_size=8)
        records[concurrency] = [(r["messages"], r["reward"], r["failure"]) for r in (ep.record() for ep in episodes)]
    assert records[1] == records[4]
    assert any(len([m for m in msgs if m["role"] == "user"]) > 1 for msgs, _, _ in records[1])  # the user answered


def test_evaluation_refuses_real_retail_without_a_simulator_before_scoring(tmp_path):
    from acl_lib.eval.harness import evaluate

    cfg = load_config("smoke", [f"worlds.data_dir={TAU2}"])
    with pytest.raises(ConfigError, match="worlds.user_sim.backend"):
        evaluate(cfg, "null", tmp_path, benchmarks=["mock", "retail"])
    assert not (tmp_path / "metrics.json").exists() and not list((tmp_path).glob("records/*"))


def test_acl_eval_refuses_a_missing_simulator_or_key_with_exit_2(tmp_path):
    import subprocess as sp

    from conftest import ACL

    base = [*ACL, "eval", "--model", "null", "--out", str(tmp_path / "out"), "--profile", "smoke"]
    res = sp.run(base + ["--suites", "in_domain", "--set", f"worlds.data_dir={TAU2}"], capture_output=True, text=True,
                 env=child_env(), cwd=ROOT, timeout=120)
    assert res.returncode == 2 and "worlds.user_sim.backend" in res.stderr and "Traceback" not in res.stderr
    env = {k: v for k, v in child_env().items() if k != "ACL_TEST_NO_SUCH_KEY"}
    res = sp.run(base + ["--suites", "ood", "--set", f"worlds.data_dir={TAU2}", "worlds.user_sim.backend=openai",
                         "worlds.user_sim.model=m", "worlds.user_sim.url=http://127.0.0.1:9/v1",
                         "worlds.user_sim.api_key_env=ACL_TEST_NO_SUCH_KEY"], capture_output=True, text=True, env=env,
                 cwd=ROOT, timeout=120)
    assert res.returncode == 2 and "ACL_TEST_NO_SUCH_KEY is not set" in res.stderr and not (tmp_path / "out").exists()


def test_acl_eval_checks_the_user_simulator_once(tmp_path, monkeypatch):
    """``acl eval`` checks worlds.user_sim itself, before loading the checkpoint (exit 2 above); the evaluation it
    then runs does not check it again."""
    from acl_lib.cli import main
    from acl_lib.envs import benchmarks_for

    calls, real = [], llm_user.preflight
    monkeypatch.setattr(llm_user, "preflight", lambda worlds, envs: calls.append(set(envs)) or real(worlds, envs))
    code = main(["eval", "--model", "null", "--profile", "smoke", "--suites", "in_domain", "--out", str(tmp_path)])
    assert code == 0 and (tmp_path / "metrics.json").is_file()
    assert calls == [{b.env for b in benchmarks_for("in_domain")}]


def test_an_unreachable_endpoint_or_a_missing_key_is_a_clear_outcome(monkeypatch):
    chat = OpenAIChat(f"http://127.0.0.1:{free_port()}/v1", "m", retries=1, timeout_s=5)
    with pytest.raises(UserSimError, match=r"cannot reach .* \(after 2 tries\)"):
        chat([{"role": "user", "content": "hi"}])
    user = LLMUser({"instructions": "x"}, chat)
    assert user.first_message() == "" and "cannot reach" in user.error
    monkeypatch.delenv("ACL_TEST_NO_SUCH_KEY", raising=False)
    with pytest.raises(ConfigError, match="ACL_TEST_NO_SUCH_KEY is not set"):
        OpenAIChat("http://127.0.0.1:1/v1", "m", api_key_env="ACL_TEST_NO_SUCH_KEY")


class _Flaky:
    """A local OpenAI-compatible endpoint answering from a script: (status, headers) per request, then 200s."""

    def __init__(self, script: list[tuple[int, dict]]):
        import http.server
        import threading

        self.script, self.times = list(script), []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - the http.server API
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.times.append(time.monotonic())
                status, headers = outer.script.pop(0) if outer.script else (200, {})
                body = (json.dumps({"choices": [{"message": {"content": "fine"}}]}) if status == 200
                        else "busy").encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()


def test_rate_limits_back_off_exponentially_and_honour_retry_after():
    """Issue 32 item 9: a 429 waits what Retry-After says; other retries double their wait."""
    srv = _Flaky([(429, {"Retry-After": "0.6"}), (503, {}), (503, {})])
    try:
        chat = OpenAIChat(srv.url, "m", retries=3, backoff_s=0.2, max_backoff_s=5)
        assert chat([{"role": "user", "content": "hi"}]) == "fine"
        gaps = [b - a for a, b in zip(srv.times, srv.times[1:])]
        assert len(gaps) == 3
        # Retry-After 0.6 s; then 0.2 * 2**(attempt-1) s less up to 50% jitter: 0.2-0.4 s, 0.4-0.8 s (the upper
        # bounds leave room for a loaded machine)
        assert 0.6 <= gaps[0] < 2.5
        assert 0.2 <= gaps[1] < 2.5 and 0.4 <= gaps[2] < 3.0 and gaps[2] > gaps[1] - 0.2
    finally:
        srv.close()
    chat = OpenAIChat("http://127.0.0.1:1/v1", "m", backoff_s=1, max_backoff_s=10)
    assert chat.backoff(1, "3") == 3 and chat.backoff(1, "999") == 10  # capped
    assert 4 <= chat.backoff(4) <= 8 and chat.backoff(1, "not a date") <= 1
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 5))
    assert 3 <= chat.backoff(1, date) <= 6


def test_an_endpoint_that_fails_too_often_stops_the_run_instead_of_scoring_zeros():
    """Issue 32 item 9: single failures end their episode (reward 0); past max_failure_rate of recent requests the
    client raises SimulatorUnavailable, which no episode swallows."""
    srv = _Flaky([(200, {})] * 15 + [(503, {})] * 100)
    try:
        chat = OpenAIChat(srv.url, "m", retries=0, max_failure_rate=0.2)
        for _ in range(15):
            assert chat([{"role": "user", "content": "hi"}]) == "fine"
        for _ in range(5):  # 5 of 20 = 25% > 20%, but only from the 20th request on is a rate judged...
            user = LLMUser({"instructions": "x"}, chat)
            if len(chat._outcomes) + 1 < OpenAIChat.FAILURE_MIN_REQUESTS:
                assert user.first_message() == "" and "HTTP 503" in user.error  # ...before it: the episode fails
            else:
                with pytest.raises(llm_user.SimulatorUnavailable, match=r"5 of the last 20 requests failed .*20%.*"
                                   r"worlds.user_sim.max_failure_rate.*HTTP 503"):
                    user.first_message()
    finally:
        srv.close()
    healthy = OpenAIChat("http://127.0.0.1:1/v1", "m", max_failure_rate=0.2)
    for failed in [False] * 45 + [True] * 5:  # 10% of the window: episodes fail, the run goes on
        healthy._record(failed, "x")
