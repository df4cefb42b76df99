"""`acl data prepare / check` (acl_lib/paper_data.py), offline: the conversions run on small files in each source's
schema (mostly the loader fixtures of tests/data), the layout they write is read by the real loaders, and `acl data
check` reports it complete; an empty directory lists every missing file, and broken files are named."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from acl_lib import paper_data as pd
from acl_lib.config import WorldsConfig
from conftest import ACL, ROOT, child_env
from paper_layout import DATA, jsonl_rows, write_jsonl


def acl(*args, cwd=ROOT):
    return subprocess.run([*ACL, *args], cwd=cwd, capture_output=True, text=True, env=child_env(), timeout=120)


def test_every_dataset_of_prepare_has_layout_files_and_a_conversion():
    names = {ds.name for ds in pd.DATASETS}
    assert {lf.dataset for lf in pd.LAYOUT} == names
    assert len({lf.path for lf in pd.LAYOUT}) == len(pd.LAYOUT) == 30
    gpqa = next(ds for ds in pd.DATASETS if ds.name == "gpqa")
    assert "gated" in gpqa.access and "HF_TOKEN" in gpqa.access


def test_conversions_write_the_layout_the_loaders_read(paper_layout):
    d, notes = paper_layout
    assert notes["ifbench"]["dropped"] == 1 and notes["if_train"] == {
        "rows": 2, "dropped": 1, "dropped_why": {"instruction id 'count:no_such_train_constraint' has no "
                                                  "verifier in the suite": 1}}
    assert notes["mmlu_redux"]["subjects"] >= 2 and (d / "math" / "dapo_math_17k.parquet").is_file()
    train = jsonl_rows(d / "instruct" / "train.jsonl")
    assert train[1] == {"key": "t2", "prompt": "Write about rain in at least 40 words.",
                        "instruction_id_list": ["length_constraints:number_words"],
                        "kwargs": [{"relation": "at least", "num_words": 40}]}
    assert all(None not in kw.values() for r in jsonl_rows(d / "instruct" / "ifeval.jsonl") for kw in r["kwargs"])

    from acl_lib.envs.instruct import InstructEnv
    from acl_lib.envs.math import MathEnv
    from acl_lib.envs.mock import MockEnv
    from acl_lib.envs.retail import RetailEnv
    from acl_lib.envs.search import SearchEnv

    worlds = WorldsConfig(data_dir=str(d))
    math = MathEnv(worlds)
    # the same tasks as from the loader fixture itself: the parquet's repeated prompts are deduplicated
    fixture = MathEnv(WorldsConfig(data_dir=str(DATA)))
    assert [t.id for t in math.tasks("train", 100)] == [t.id for t in fixture.tasks("train", 100)]
    for split in ("test", "gpqa", "mmlu_redux"):  # MMLU-Redux: the subject column comes from the configurations
        def rows(env, split=split):
            return sorted((t.user_prompt, t.answer, t.meta.get("subject")) for t in env.tasks(split, 100))

        assert rows(math) and rows(math) == rows(fixture)
    search = SearchEnv(worlds)
    multi = search.tasks("multi_hop", 100)
    assert {t.meta["source"] for t in multi} == {"2wikimultihopqa", "hotpotqa", "bamboogle", "musique"}
    assert "Röntgen" in search.search("x-rays discovered", 1)
    instruct = InstructEnv(worlds)
    assert len(instruct.tasks("train", 100)) == 2 and instruct.tasks("ifbench", 100)
    assert len(RetailEnv(worlds).tasks("test", 10**6)) == 40 and len(MockEnv(worlds).tasks("test", 100)) == 8


@pytest.mark.slow
def test_check_reports_the_fixture_layout_complete(paper_layout):
    d, _ = paper_layout
    report = pd.check(d)
    assert report.complete, report.format()
    assert report.warnings == [] and len(report.files) == 30
    res = acl("data", "check", "--data-dir", str(d))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "complete (30 ok of 30 files)" in res.stdout


@pytest.mark.slow
def test_check_on_an_empty_directory_lists_every_missing_file(tmp_path):
    res = acl("data", "check", "--data-dir", str(tmp_path))
    assert res.returncode == 1
    for lf in pd.LAYOUT:
        assert any(line.startswith(lf.path) and "missing" in line for line in res.stdout.splitlines()), lf.path
    assert "NOT complete (30 missing of 30 files)" in res.stdout
    res = acl("data", "check", "--data-dir", str(tmp_path / "nowhere"))
    assert res.returncode == 1 and "30 missing" in res.stdout
    (tmp_path / "f").write_text("x")
    res = acl("data", "check", "--data-dir", str(tmp_path / "f"))
    assert res.returncode == 2 and "a file, not a directory" in res.stdout


@pytest.mark.slow
def test_check_names_malformed_and_modified_files(paper_layout, tmp_path):
    d = shutil.copytree(paper_layout[0], tmp_path / "paper")  # a copy: this test breaks files
    aime = d / "math" / "aime26.jsonl"
    rows = jsonl_rows(aime)
    del rows[1]["answer"]
    aime.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "search" / "popqa" / "test.jsonl").write_text('{"question": "q", "golden_answers": ["a"]}\n{not json\n')
    write_jsonl(d / "instruct" / "ifbench.jsonl", jsonl_rows(d / "instruct" / "ifbench.jsonl") + [
        {"key": 1, "prompt": "p", "instruction_id_list": ["custom:no_such_check"], "kwargs": [{}]}])
    split = json.loads((d / "retail" / "split_tasks.json").read_text())
    split["test"].append("no-such-task")
    (d / "retail" / "split_tasks.json").write_text(json.dumps(split))
    with open(d / "search" / "wiki-18.jsonl", "a") as f:  # still well-formed, but not the prepared file
        f.write(json.dumps({"id": "x", "contents": '"X"\nan extra passage'}) + "\n")
    (d / "telecom" / "db.toml").write_text("[lines\n")
    (d / "mock" / "policy.md").unlink()
    report = {f.path: f for f in pd.check(d).files}
    assert report["math/aime26.jsonl"].status == "malformed" and "row 1: missing field 'answer'" in report[
        "math/aime26.jsonl"].detail
    assert report["search/popqa/test.jsonl"].status == "malformed" and ":2: not JSON" in report[
        "search/popqa/test.jsonl"].detail
    assert "'custom:no_such_check' has no verifier" in report["instruct/ifbench.jsonl"].detail
    assert "names tasks not in tasks.json: ['no-such-task']" in report["retail/split_tasks.json"].detail
    assert report["search/wiki-18.jsonl"].status == "modified"
    assert report["telecom/db.toml"].status == "malformed" and "not TOML" in report["telecom/db.toml"].detail
    assert report["mock/policy.md"].status == "missing"
    assert pd.check(d, checksums=False).files[[f.path for f in pd.LAYOUT].index("search/wiki-18.jsonl")].status == "ok"
    res = acl("data", "check", "--data-dir", str(d))
    assert res.returncode == 1 and "NOT complete (5 malformed, 1 missing, 1 modified, 23 ok of 30 files)" in res.stdout


@pytest.mark.slow
def test_conversions_refuse_sources_in_the_wrong_schema(tmp_path):
    bad = write_jsonl(tmp_path / "aime.jsonl", [{"problem_idx": 1, "question": "no problem field", "answer": 3}])
    with pytest.raises(pd.DataError, match="aime.jsonl row 0: missing field 'problem'"):
        pd.convert_aime(bad, tmp_path / "out")
    bad = write_jsonl(tmp_path / "train.jsonl", [{"key": "k", "messages": [{"role": "user", "content": "x"}],
                                            "ground_truth": "{'not': 'a constraint'}"}])
    with pytest.raises(pd.DataError, match="ground_truth is not a list"):
        pd.convert_if_train(bad, tmp_path / "out.jsonl")
    with pytest.raises(pd.DataError, match="lacks db.toml"):
        pd.convert_tau2("telecom", tmp_path, tmp_path / "out")
    res = acl("data", "prepare", "--data-dir", str(tmp_path / "p"), "--only", "no_such_set")
    assert res.returncode == 2 and "unknown data set(s) ['no_such_set']" in res.stdout
