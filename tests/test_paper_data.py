"""`acl data prepare / check` (acl_lib/paper_data.py), offline: the conversions run on small files in each source's
schema (mostly the loader fixtures of tests/data), the layout they write is read by the real loaders, and `acl data
check` reports it complete; an empty directory lists every missing file, and broken files are named."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from acl_lib import paper_data as pd
from acl_lib.config import WorldsConfig
from conftest import ACL, ROOT, child_env

DATA = ROOT / "tests" / "data"


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def sources(tmp: Path) -> dict:
    """Small source files, each in the schema its hub (or GitHub) release has."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp / "src"
    src.mkdir()
    dapo = src / "dapo-math-17k.parquet"  # released as parquet, prompts repeated
    rows = _rows(DATA / "math" / "dapo_math_17k.jsonl")
    pq.write_table(pa.Table.from_pylist(rows + rows), dapo)
    mmlu = {}
    for r in _rows(DATA / "math" / "mmlu_redux.jsonl"):  # one configuration per subject, no subject column
        subject = r.pop("subject")
        mmlu.setdefault(subject, []).append(r)
    mmlu = {s: _jsonl(src / "mmlu" / f"{s}.jsonl", rs) for s, rs in mmlu.items()}
    flashrag = {f"{d}/{s}": DATA / "search" / d / f"{s}.jsonl" for d, stems in pd.FLASHRAG_FILES.items() for s in stems
                if (DATA / "search" / d / f"{s}.jsonl").is_file()}
    for key, q, a in (("2wikimultihopqa/dev", "Who was born first, Marie Curie or Wilhelm Röntgen", ["Wilhelm Röntgen"]),
                      ("musique/dev", "In which city was the discoverer of X-rays born", "Lennep")):
        flashrag[key] = _jsonl(src / "flashrag" / f"{key}.jsonl", [{"id": "dev_0", "question": q, "golden_answers": a,
                                                                   "metadata": {"type": "compositional"}}])
    corpus = src / "wiki-18.jsonl.gz"
    corpus.write_bytes(gzip.compress((DATA / "search" / "corpus.jsonl").read_bytes()))
    telecom = src / "telecom"  # tau2's own files (tests/data/tau2/telecom), the small set standing in for tasks.json
    telecom.mkdir()
    for f in ("db.toml", "user_db.toml", "main_policy.md", "tech_support_manual.md"):
        (telecom / f).write_bytes((DATA / "tau2" / "telecom" / f).read_bytes())
    small = json.loads((DATA / "tau2" / "telecom" / "tasks_small.json").read_text())
    (telecom / "tasks.json").write_text(json.dumps(small))
    ids = [t["id"] for t in small]  # "full" also names a task of tau2's other task files, as the real split does
    (telecom / "split_tasks.json").write_text(json.dumps({"small": ids, "test": ids[:4],
                                                          "full": ids + ["[service_issue]x"]}))
    ifbench = src / "IFBench_test.jsonl"  # one row with a constraint the suite cannot verify: dropped
    _jsonl(ifbench, _rows(DATA / "instruct" / "ifbench.jsonl") + [
        {"key": 9999, "prompt": "Write a poem.", "instruction_id_list": ["custom:no_such_check"], "kwargs": [{}]}])
    if_train = _jsonl(src / "IF_multi_constraints_upto5.jsonl", [  # messages + ground_truth (JSON or Python literal)
        {"key": "t1", "messages": [{"role": "user", "content": "Describe a cat without any commas."}],
         "ground_truth": json.dumps([{"instruction_id": ["punctuation:no_comma"], "kwargs": [None]}]),
         "dataset": "ifeval", "constraint_type": "single", "constraint": "no commas"},
        {"key": "t2", "messages": [{"role": "user", "content": "Write about rain in at least 40 words."}],
         "ground_truth": str([{"instruction_id": ["length_constraints:number_words"],
                               "kwargs": [{"relation": "at least", "num_words": 40}]}]),
         "dataset": "ifeval", "constraint_type": "single", "constraint": "40 words"},
        {"key": "t3", "messages": [{"role": "user", "content": "Write a haiku."}],
         "ground_truth": json.dumps([{"instruction_id": ["count:no_such_train_constraint"], "kwargs": [{}]}]),
         "dataset": "ifbench_train", "constraint_type": "single", "constraint": "?"},
    ])
    return {"dapo": dapo, "aime": DATA / "math" / "aime26.jsonl", "gpqa": DATA / "math" / "gpqa_diamond.csv",
            "mmlu": mmlu, "flashrag": flashrag, "corpus": corpus, "telecom": telecom, "ifbench": ifbench,
            "if_train": if_train}


def build_layout(tmp: Path) -> tuple[Path, dict]:
    """Run every conversion on the small sources; write the manifest."""
    s = sources(tmp)
    d = tmp / "paper"
    notes = {
        "math_dapo": pd.convert_dapo(s["dapo"], d),
        "aime26": pd.convert_aime(s["aime"], d),
        "gpqa": pd.convert_gpqa(s["gpqa"], d),
        "mmlu_redux": pd.convert_mmlu_redux(s["mmlu"], d),
        "flashrag": pd.convert_flashrag(s["flashrag"], d),
        "wiki_corpus": pd.convert_corpus(s["corpus"], d),
        "tau2_retail": pd.convert_tau2("retail", DATA / "tau2" / "retail", d),
        "tau2_mock": pd.convert_tau2("mock", DATA / "tau2" / "mock", d),
        "tau2_telecom": pd.convert_tau2("telecom", s["telecom"], d),
        "ifeval": pd.convert_ifeval(DATA / "instruct" / "ifeval.jsonl", d / "instruct" / "ifeval.jsonl"),
        "ifbench": pd.convert_ifeval(s["ifbench"], d / "instruct" / "ifbench.jsonl"),
        "if_train": pd.convert_if_train(s["if_train"], d / "instruct" / "train.jsonl"),
    }
    pd.write_manifest(d, notes)
    return d, notes


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    return build_layout(tmp_path_factory.mktemp("data"))


def acl(*args, cwd=ROOT):
    return subprocess.run([*ACL, *args], cwd=cwd, capture_output=True, text=True, env=child_env(), timeout=120)


def test_every_dataset_of_prepare_has_layout_files_and_a_conversion():
    names = {ds.name for ds in pd.DATASETS}
    assert {lf.dataset for lf in pd.LAYOUT} == names
    assert len({lf.path for lf in pd.LAYOUT}) == len(pd.LAYOUT) == 30
    gpqa = next(ds for ds in pd.DATASETS if ds.name == "gpqa")
    assert "gated" in gpqa.access and "HF_TOKEN" in gpqa.access


def test_conversions_write_the_layout_the_loaders_read(layout):
    d, notes = layout
    assert notes["ifbench"]["dropped"] == 1 and notes["if_train"] == {
        "rows": 2, "dropped": 1, "dropped_why": {"instruction id 'count:no_such_train_constraint' has no "
                                                  "verifier in the suite": 1}}
    assert notes["mmlu_redux"]["subjects"] >= 2 and (d / "math" / "dapo_math_17k.parquet").is_file()
    train = _rows(d / "instruct" / "train.jsonl")
    assert train[1] == {"key": "t2", "prompt": "Write about rain in at least 40 words.",
                        "instruction_id_list": ["length_constraints:number_words"],
                        "kwargs": [{"relation": "at least", "num_words": 40}]}
    assert all(None not in kw.values() for r in _rows(d / "instruct" / "ifeval.jsonl") for kw in r["kwargs"])

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
        got = sorted((t.user_prompt, t.answer, t.meta.get("subject")) for t in math.tasks(split, 100))
        assert got and got == sorted((t.user_prompt, t.answer, t.meta.get("subject")) for t in fixture.tasks(split, 100))
    search = SearchEnv(worlds)
    multi = search.tasks("multi_hop", 100)
    assert {t.meta["source"] for t in multi} == {"2wikimultihopqa", "hotpotqa", "bamboogle", "musique"}
    assert "Röntgen" in search.search("x-rays discovered", 1)
    instruct = InstructEnv(worlds)
    assert len(instruct.tasks("train", 100)) == 2 and instruct.tasks("ifbench", 100)
    assert len(RetailEnv(worlds).tasks("test", 10**6)) == 40 and len(MockEnv(worlds).tasks("test", 100)) == 8


def test_check_reports_the_fixture_layout_complete(layout):
    d, _ = layout
    report = pd.check(d)
    assert report.complete, report.format()
    assert report.warnings == [] and len(report.files) == 30
    res = acl("data", "check", "--data-dir", str(d))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "complete (30 ok of 30 files)" in res.stdout


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


def test_check_names_malformed_and_modified_files(tmp_path):
    d, _ = build_layout(tmp_path)
    aime = d / "math" / "aime26.jsonl"
    rows = _rows(aime)
    del rows[1]["answer"]
    aime.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "search" / "popqa" / "test.jsonl").write_text('{"question": "q", "golden_answers": ["a"]}\n{not json\n')
    _jsonl(d / "instruct" / "ifbench.jsonl", _rows(d / "instruct" / "ifbench.jsonl") + [
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


def test_conversions_refuse_sources_in_the_wrong_schema(tmp_path):
    bad = _jsonl(tmp_path / "aime.jsonl", [{"problem_idx": 1, "question": "no problem field", "answer": 3}])
    with pytest.raises(pd.DataError, match="aime.jsonl row 0: missing field 'problem'"):
        pd.convert_aime(bad, tmp_path / "out")
    bad = _jsonl(tmp_path / "train.jsonl", [{"key": "k", "messages": [{"role": "user", "content": "x"}],
                                            "ground_truth": "{'not': 'a constraint'}"}])
    with pytest.raises(pd.DataError, match="ground_truth is not a list"):
        pd.convert_if_train(bad, tmp_path / "out.jsonl")
    with pytest.raises(pd.DataError, match="lacks db.toml"):
        pd.convert_tau2("telecom", tmp_path, tmp_path / "out")
    res = acl("data", "prepare", "--data-dir", str(tmp_path / "p"), "--only", "no_such_set")
    assert res.returncode == 2 and "unknown data set(s) ['no_such_set']" in res.stdout
