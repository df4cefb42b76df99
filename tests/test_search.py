"""Search domain: answer checking, the generated world, the episode protocol, the scripted expert,
real-data loaders (FlashRAG files + saved bm25s index) and the HTTP retriever client."""

from __future__ import annotations

import json
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acl_lib.chat import format_tool_call
from acl_lib.config import WorldsConfig, load_config
from acl_lib.envs.base import Task, ToolError
from acl_lib.envs.retrievers import BM25Retriever, HTTPRetriever
from acl_lib.envs.search import (
    SearchEnv,
    build_world,
    document_texts,
    exact_match,
    extract_answer,
    format_passages,
    load_question_file,
    normalize_answer,
    parse_passages,
    scripted_expert,
)

FIXTURES = Path(__file__).parent / "data" / "search"


@pytest.fixture(scope="module")
def mini_env():
    return SearchEnv(load_config("mini").worlds, seed=0)


def run_expert(env, task, max_turns=8):
    ep = env.start(task, max_turns=max_turns)
    while not ep.done:
        ep.step(scripted_expert(task, ep.messages))
    return ep


# --- SQuAD normalisation and exact match ---------------------------------------------------------


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("The Beatles", "beatles"),
        ("  A  tale of   two cities! ", "tale of two cities"),
        ("Apple's", "apples"),
        ("the-end", "theend"),  # punctuation is deleted, not replaced by a space
        ("Theatre", "theatre"),  # articles only as whole words
        ("an", ""),
        ("U.S.A.", "usa"),
        ("Wilhelm Conrad Röntgen", "wilhelm conrad röntgen"),
        ("1,017 km", "1017 km"),
        ("the\tthe\nthe", ""),
        ("Anne, the queen.", "anne queen"),
    ],
)
def test_normalize_answer_follows_squad(raw, expected):
    assert normalize_answer(raw) == expected


def test_exact_match():
    assert exact_match("the Atlantic ocean.", ["Atlantic Ocean"])
    assert exact_match("Atlantic", ["Atlantic Ocean", "Atlantic"])
    assert exact_match("Canberra", "Canberra")  # a bare string is one gold answer
    assert not exact_match("Sydney", ["Canberra"])
    assert not exact_match("Atlantic", ["Atlantic Ocean"])  # exact, not containment
    assert not exact_match("Canberra", [])
    assert not exact_match(None, ["x"])


def test_extract_answer_takes_the_last_tag():
    assert extract_answer("I think <answer> Paris </answer>") == "Paris"
    assert extract_answer("<answer>a</answer> then <answer>b\nc</answer>") == "b\nc"
    assert extract_answer("no tag here") is None
    assert extract_answer("<answer>unclosed") is None
    assert extract_answer(None) is None


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_normalize_never_raises_and_is_idempotent(s):
    n = normalize_answer(s)
    assert normalize_answer(n) == n
    assert exact_match(s, [s])


@settings(max_examples=200, deadline=None)
@given(st.text(), st.text(), st.lists(st.text(), max_size=4) | st.text())
def test_extract_and_match_never_raise(prefix, inner, gold):
    text = f"{prefix}<answer>{inner}</answer>"
    got = extract_answer(text)
    assert got is not None
    assert isinstance(exact_match(got, gold), bool)
    extract_answer(prefix)


# --- the generated world ----------------------------------------------------------------------------


def test_world_size_and_timing_follow_config():
    t0 = time.perf_counter()
    env = SearchEnv(WorldsConfig(n_train=256, n_test=50, n_ood=40), seed=123)  # the mini sizes, a new seed
    assert env.retriever is not None  # built on first use: corpus + index
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0, f"corpus build + index took {elapsed:.2f}s"
    assert 150 <= len(env.documents) <= 600
    pools = env.world.pools
    assert len(pools["train"]) >= 256 and len(pools["test"]) == 50
    assert len(pools["single_hop"]) == len(pools["multi_hop"]) == 40
    small = SearchEnv(WorldsConfig(n_train=8, n_test=4, n_ood=4), seed=123)
    assert len(small.documents) < len(env.documents)
    for n_train, n_test, n_ood in [(1, 1, 1), (64, 16, 16), (10, 200, 3), (500, 10, 150), (40, 40, 120)]:
        pools = SearchEnv(WorldsConfig(n_train=n_train, n_test=n_test, n_ood=n_ood), seed=5).world.pools
        sizes = {k: len(v) for k, v in pools.items()}
        assert sizes["train"] >= n_train and sizes["test"] == n_test, sizes
        assert sizes["single_hop"] == sizes["multi_hop"] == n_ood, sizes


def test_documents_use_the_flashrag_schema_and_are_deterministic(mini_env):
    docs = mini_env.documents
    assert all(set(d) == {"id", "contents"} for d in docs)
    assert len({d["id"] for d in docs}) == len(docs)
    titles = [d["contents"].split("\n")[0] for d in docs]
    assert all(t.startswith('"') and t.endswith('"') for t in titles)
    assert len(set(titles)) == len(titles)
    again = SearchEnv(load_config("mini").worlds, seed=0)
    assert again.documents == docs
    other = SearchEnv(load_config("mini").worlds, seed=1)
    assert other.documents != docs
    assert document_texts(mini_env) == [d["contents"] for d in docs]


def test_tasks_are_deterministic_serialisable_and_disjoint(mini_env):
    a = mini_env.tasks("train", 40, seed=3)
    assert [t.to_dict() for t in a] == [t.to_dict() for t in mini_env.tasks("train", 40, seed=3)]
    assert [t.id for t in a] != [t.id for t in mini_env.tasks("train", 40, seed=4)]
    d = json.loads(json.dumps(a[0].to_dict()))
    assert Task.from_dict(d) == a[0]
    assert {t.benchmark for t in mini_env.tasks("test", 50)} == {"nq"}
    assert {t.benchmark for t in mini_env.tasks("multi_hop", 5)} == {"multi_hop"}

    def pairs(split):
        return {(t.meta["hops"][0]["subject"], t.meta["hops"][0]["relation"]) for t in mini_env.tasks(split, 10**6)}

    train, test = pairs("train"), pairs("test")
    assert train and test and not (train & test)
    train_q = {t.user_prompt for t in mini_env.tasks("train", 10**6)}
    for split in ("test", "single_hop", "multi_hop"):
        assert not train_q & {t.user_prompt for t in mini_env.tasks(split, 10**6)}
    # OOD single-hop relations never appear in training questions
    train_rel = {r for _, r in train}
    assert not train_rel & {r for _, r in pairs("single_hop")}
    # test entities may be train entities (only pairs are held out)
    assert {s for s, _ in train} & {s for s, _ in test}
    # multi-hop questions: two hops, and their final fact is never a training question
    E = mini_env.world.entities
    bridge_type = {"ceo_of": "company", "birth_country": "country", "ceo": "person", "river": "river"}
    for t in mini_env.tasks("multi_hop", 10**6):
        h1, h2 = t.meta["hops"]
        subj_type = next(k for k, v in E.items() if h1["subject"] in v)
        bridge = E[subj_type][h1["subject"]][h1["relation"]]
        assert bridge in E[bridge_type[h1["relation"]]]
        assert (bridge, h2["relation"]) not in train


def test_unknown_split_is_an_error(mini_env):
    with pytest.raises(ValueError, match="unknown split"):
        mini_env.tasks("dev", 3)


@pytest.mark.parametrize("profile", ["smoke", "mini"])
def test_expert_scores_100_percent_and_doing_nothing_scores_0(profile):
    cfg = load_config(profile)
    env = SearchEnv(cfg.worlds, seed=7)
    for split in env.splits:
        tasks = env.tasks(split, 10**6)
        assert tasks
        for task in tasks:
            ep = run_expert(env, task, max_turns=cfg.eval.max_turns)
            assert ep.reward() == 1.0, (task.user_prompt, ep.failure, ep.messages)
            n_search = sum(1 for m in ep.messages if m["role"] == "tool")
            assert n_search == len(task.meta["hops"])
            idle = env.start(task, max_turns=cfg.eval.max_turns)
            idle.step("")
            assert idle.reward() == 0.0 and idle.failure == "no <answer> tag"


def test_expert_reads_the_passages_not_the_gold(mini_env):
    task = next(t for t in mini_env.tasks("test", 50) if t.meta["hops"][0]["relation"] == "founded")
    first = scripted_expert(task, task.initial_messages())
    assert "<tool_call>" in first
    obs = mini_env.search(json.loads(first.split("\n")[1])["arguments"]["query"])
    gold = task.answer[0]
    assert gold in obs
    tampered = obs.replace(f"founded in {gold}", "founded in 1234")
    msgs = task.initial_messages() + [{"role": "assistant", "content": first}, {"role": "tool", "content": tampered}]
    assert scripted_expert(task, msgs) == "<answer>1234</answer>"
    # a passage that does not mention the subject: the expert retries with a plainer query
    msgs[-1]["content"] = "No results found."
    retry = scripted_expert(task, msgs)
    assert "<tool_call>" in retry and retry != first


def test_multi_hop_expert_extracts_the_bridge_from_the_observation(mini_env):
    task = next(t for t in mini_env.tasks("multi_hop", 40) if t.meta["kind"] == "ceo_founded")
    msgs = task.initial_messages()
    first = scripted_expert(task, msgs)
    query = json.loads(first.split("\n")[1])["arguments"]["query"]
    obs = mini_env.search(query)
    msgs += [{"role": "assistant", "content": first}, {"role": "tool", "content": obs}]
    second = json.loads(scripted_expert(task, msgs).split("\n")[1])["arguments"]["query"]
    company = mini_env.world.entities["person"][task.meta["hops"][0]["subject"]]["ceo_of"]
    assert company in second  # the bridge entity, read off the first passage
    assert company not in task.user_prompt


# --- the episode protocol --------------------------------------------------------------------------


def test_search_tool_output_format(mini_env):
    task = mini_env.tasks("test", 1)[0]
    ep = mini_env.start(task)
    obs = ep.step(format_tool_call("search", {"query": task.meta["hops"][0]["subject"]}))
    assert obs[0]["role"] == "tool"
    lines = obs[0]["content"].split("\n")
    assert len(lines) == mini_env.topk
    assert [ln.startswith(f"Doc {i}(Title: \"") for i, ln in enumerate(lines, 1)] == [True] * len(lines)
    assert parse_passages(obs[0]["content"])[0][0] == task.meta["hops"][0]["subject"]
    assert ep.messages[-2]["tool_calls"][0]["function"]["name"] == "search"
    assert not ep.done


def test_episode_failures(mini_env):
    task = mini_env.tasks("test", 1)[0]
    ep = mini_env.start(task)
    assert ep.step(format_tool_call("search", {"q": "x"}))[0]["content"].startswith("Error: missing required")
    empty = ep.step(format_tool_call("search", {"query": "   "}))[0]["content"]
    assert empty == "Error: query must be a non-empty string"
    assert ep.step(format_tool_call("lookup", {"query": "x"}))[0]["content"].startswith("Error: unknown tool")
    assert ep.step("<tool_call>{not json</tool_call>")[0]["content"].startswith("Error: malformed JSON")
    assert ep.step(format_tool_call("search", {"query": "zzqqxx"}))[0]["content"] == "No results found."
    assert len(ep.protocol_errors) == 3
    ep.step("<answer>definitely wrong</answer>")
    assert ep.done and ep.reward() == 0.0 and ep.failure.startswith("wrong answer")

    ep = mini_env.start(task)
    ep.step(f"<think><answer>{task.answer[0]}</answer></think>The answer is {task.answer[0]}.")
    assert ep.reward() == 0.0 and ep.failure == "no <answer> tag"  # an answer inside <think> does not count

    ep = mini_env.start(task, max_turns=2)
    for _ in range(2):
        ep.step(format_tool_call("search", {"query": "capital"}))
    assert ep.done and ep.reward() == 0.0 and "turn limit" in ep.failure

    ep = mini_env.start(task)
    ep.step(f"Found it. <answer>The {task.answer[0].upper()}.</answer>")
    assert ep.reward() == 1.0 and ep.failure is None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text() | st.sampled_from([
    '<tool_call>\n{"name": "search", "arguments": {"query": "born"}}\n</tool_call>',
    '<tool_call>{"name": "search", "arguments": {"query": 5}}</tool_call>',
    '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"\\u0000\\"}"}</tool_call>',
    "<answer></answer>", "<tool_call>", "</answer><answer>",
]), min_size=1, max_size=5))
def test_episode_step_never_raises(mini_env, turns):
    task = mini_env.tasks("multi_hop", 1)[0]
    ep = mini_env.start(task, max_turns=4)
    for text in turns:
        if ep.done:
            break
        for m in ep.step(text):
            assert isinstance(m["content"], str)
    r = ep.reward()
    assert 0.0 <= r <= 1.0 and (r == 1.0 or ep.failure)


# --- real data: FlashRAG question files, a wiki-style corpus, a saved bm25s index -------------------


@pytest.fixture()
def real_env(tmp_path):
    shutil.copytree(FIXTURES, tmp_path / "search")
    return SearchEnv(WorldsConfig(data_dir=str(tmp_path), search_topk=2), seed=0), tmp_path / "search"


def test_load_question_file(tmp_path):
    rows = load_question_file(FIXTURES / "nq" / "train.jsonl")
    assert len(rows) == 4 and rows[3]["golden_answers"] == ["1991"]  # a bare string is wrapped
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "question": "q"}\n')
    with pytest.raises(ValueError, match="golden_answers"):
        load_question_file(bad)


def test_real_tasks_from_flashrag_files(real_env):
    env, root = real_env
    assert env.documents == []
    test = env.tasks("test", 10**6)
    assert {t.id for t in test} == {"search/test/nq/test_0", "search/test/nq/test_1"}
    assert all(t.benchmark == "nq" and t.user_prompt.endswith("?") for t in test)
    single = env.tasks("single_hop", 10**6)
    assert {t.meta["source"] for t in single} == {"popqa", "triviaqa"}
    multi = env.tasks("multi_hop", 10**6)  # hotpotqa has only dev.jsonl, bamboogle test.jsonl
    assert {t.meta["source"] for t in multi} == {"hotpotqa", "bamboogle"}
    assert len(env.tasks("train", 2, seed=1)) == 2
    shutil.rmtree(root / "popqa"), shutil.rmtree(root / "triviaqa")
    with pytest.raises(FileNotFoundError, match="popqa/test.jsonl"):
        SearchEnv(env.worlds).tasks("single_hop", 3)


def test_real_corpus_index_is_built_once_and_reloaded(real_env):
    env, root = real_env
    index_dir = root / "corpus.jsonl.bm25s"
    assert not index_dir.exists()
    out = env.search("capital city of Australia")
    passages = dict(parse_passages(out))
    assert len(passages) == 2  # worlds.search_topk
    assert passages["Canberra"] == ("Canberra is the capital city of Australia. Founded after the federation of the "
                                    "colonies as the seat of government, it is the largest inland city of the country.")
    assert index_dir.is_dir() and (index_dir / "offsets.npy").exists()
    stamps = {p.name: p.stat().st_mtime_ns for p in index_dir.iterdir()}
    again = BM25Retriever.from_corpus_file(root / "corpus.jsonl")
    assert {p.name: p.stat().st_mtime_ns for p in index_dir.iterdir()} == stamps  # loaded, not rebuilt
    hits = again.search("Röntgen X-rays", 2)
    assert hits[0]["id"] == "1" and hits[0]["contents"].startswith('"Wilhelm Röntgen"\n')
    assert hits[0]["score"] > 0


def test_real_tasks_run_end_to_end_with_the_reader_expert(real_env):
    env, _ = real_env
    for split in env.splits:
        for task in env.tasks(split, 10**6):
            ep = run_expert(env, task)
            assert ep.reward() == 1.0, (task.user_prompt, ep.messages)


# --- the HTTP retriever client against a real local server -------------------------------------------


class _RetrievalServer:
    """A Search-R1-style ``POST /retrieve`` service on 127.0.0.1 backed by a real bm25s index; it shuts
    itself down after ``lifetime`` seconds even if a test forgets to."""

    def __init__(self, retriever: BM25Retriever, mode: str = "ok", lifetime: float = 20.0):
        requests = self.requests = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server API)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                requests.append((self.path, body))
                if mode == "slow":
                    time.sleep(1.0)  # past the client's timeout: it has hung up, nothing to answer
                    return
                if mode == "500" or self.path != "/retrieve":
                    self.send_response(500)
                    self.end_headers()
                    return
                if mode == "garbage":
                    payload = b"<html>not json</html>"
                else:
                    result = [[{"document": {"id": d["id"], "contents": d["contents"]}, "score": d["score"]}
                               for d in retriever.search(q, body["topk"])] for q in body["queries"]]
                    payload = json.dumps({"result": result}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/retrieve"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.timer = threading.Timer(lifetime, self.close)
        self.timer.daemon = True

    def __enter__(self):
        self.thread.start()
        self.timer.start()
        return self

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def __exit__(self, *exc):
        self.timer.cancel()
        self.close()
        self.thread.join(timeout=5)


def test_http_retriever_runs_episodes(mini_env):
    backend = mini_env.retriever
    with _RetrievalServer(backend) as srv:
        worlds = load_config("mini").worlds.model_copy(update={"retriever_url": srv.url})
        env = SearchEnv(worlds, seed=0)
        assert isinstance(env.retriever, HTTPRetriever)
        for task in env.tasks("multi_hop", 4) + env.tasks("test", 4):
            ep = run_expert(env, task)
            assert ep.reward() == 1.0, ep.messages
            query = json.loads(ep.messages[2]["tool_calls"][0]["function"]["arguments"])["query"]
            assert ep.messages[3]["content"] == mini_env.search(query)  # same passages as the local index
        path, body = srv.requests[0]
        assert path == "/retrieve" and body["topk"] == worlds.search_topk and body["return_scores"] is True
        assert isinstance(body["queries"], list) and len(body["queries"]) == 1


@pytest.mark.parametrize("mode", ["500", "garbage", "slow"])
def test_http_retriever_errors_become_observations(mini_env, mode):
    with _RetrievalServer(mini_env.retriever, mode=mode) as srv:
        client = HTTPRetriever(srv.url, timeout=0.3)
        with pytest.raises(ToolError, match="retriever unavailable"):
            client.search("capital", 3)
        worlds = load_config("smoke").worlds.model_copy(update={"retriever_url": srv.url})
        env = SearchEnv(worlds)
        env._retriever = client  # the short timeout
        task = env.tasks("test", 1)[0]
        ep = env.start(task)
        obs = ep.step(format_tool_call("search", {"query": "capital"}))
        assert obs[0]["content"].startswith("Error: retriever unavailable: ")
        assert not ep.done


def test_http_retriever_unreachable():
    with _RetrievalServer(BM25Retriever.from_documents([{"id": "0", "contents": '"Haarlem"\nA city.'}])) as srv:
        url = srv.url
    with pytest.raises(ToolError, match="retriever unavailable"):
        HTTPRetriever(url, timeout=0.5).search("x", 3)


def test_format_and_parse_passages_round_trip():
    docs = [{"id": "1", "contents": '"Mercury (planet)"\nThe smallest planet.'}, {"id": "2", "contents": '"B"\nline'}]
    text = format_passages(docs)
    assert text == 'Doc 1(Title: "Mercury (planet)") The smallest planet.\nDoc 2(Title: "B") line'
    assert parse_passages(text) == [("Mercury (planet)", "The smallest planet."), ("B", "line")]
    assert build_world(0, 12, 4, 4) is build_world(0, 12, 4, 4)  # one world per (seed, sizes), cached


def test_search_many_is_search_for_every_query(mini_env):
    """Issue 32 item 13: a batch of queries in one bm25s call returns what one call per query returns."""
    r = mini_env.retriever
    tasks = mini_env.tasks("test", 6) + mini_env.tasks("multi_hop", 3)
    queries = [t.user_prompt for t in tasks] + ["", "the of and"]  # empty, and nothing but stopwords
    k = mini_env.topk
    assert r.search_many(queries, k) == [r.search(q, k) for q in queries]
    with _RetrievalServer(r) as srv:
        client = HTTPRetriever(srv.url)
        assert client.search_many(queries[:4], k) == [client.search(q, k) for q in queries[:4]]
        assert [len(body["queries"]) for _, body in srv.requests] == [4, 1, 1, 1, 1]  # one request for the batch


def test_a_rounds_searches_are_retrieved_in_one_batch(mini_env, tmp_path):
    """The evaluator hands a round's turns to SearchEpisode.prefetch first: one search_many per round of turns
    instead of one search per episode, with the same scores and transcripts."""
    from acl_lib.eval.harness import run_episodes
    from acl_lib.eval.policies import ExpertPolicy

    calls = {"many": [], "one": 0}
    r = mini_env.retriever

    class Counting:
        def search(self, q, k):
            calls["one"] += 1
            return r.search(q, k)

        def search_many(self, qs, k):
            calls["many"].append(len(qs))
            return r.search_many(qs, k)

    tasks = mini_env.tasks("test", 8)
    plain = [mini_env.start(t, max_turns=8) for t in tasks]
    counting = Counting()  # the episodes of one world share its retriever
    for ep in plain:
        ep.retriever = counting
    run_episodes(ExpertPolicy(), plain, batch_size=8)
    assert calls["one"] == 0 and calls["many"] and max(calls["many"]) == 8  # the first round: all 8 searches at once
    assert all(ep.reward() == 1.0 for ep in plain)
    unbatched = [mini_env.start(t, max_turns=8) for t in tasks]
    for ep in unbatched:
        while not ep.done:
            ep.step(scripted_expert(ep.task, ep.messages))
    assert [ep.messages for ep in plain] == [ep.messages for ep in unbatched]
