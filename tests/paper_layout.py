"""The data layout of ``acl data prepare``, built offline from small source files in each source's schema (mostly
the loader fixtures of tests/data). A helper module, not a test module: conftest.py builds it once per session
(fixture ``paper_layout``); tests/test_paper_data.py checks it, tests/test_paper_rehearsal.py runs on it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from acl_lib import paper_data as pd

DATA = Path(__file__).resolve().parent / "data"


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    """Write ``rows`` as JSON lines at ``path`` (parents made); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def jsonl_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def sources(tmp: Path) -> dict:
    """Small source files, each in the schema its hub (or GitHub) release has."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp / "src"
    src.mkdir()
    dapo = src / "dapo-math-17k.parquet"  # released as parquet, prompts repeated
    rows = jsonl_rows(DATA / "math" / "dapo_math_17k.jsonl")
    pq.write_table(pa.Table.from_pylist(rows + rows), dapo)
    mmlu = {}
    for r in jsonl_rows(DATA / "math" / "mmlu_redux.jsonl"):  # one configuration per subject, no subject column
        subject = r.pop("subject")
        mmlu.setdefault(subject, []).append(r)
    mmlu = {s: write_jsonl(src / "mmlu" / f"{s}.jsonl", rs) for s, rs in mmlu.items()}
    flashrag = {f"{d}/{s}": DATA / "search" / d / f"{s}.jsonl" for d, stems in pd.FLASHRAG_FILES.items() for s in stems
                if (DATA / "search" / d / f"{s}.jsonl").is_file()}
    for key, q, a in (
        ("2wikimultihopqa/dev", "Who was born first, Marie Curie or Wilhelm Röntgen", ["Wilhelm Röntgen"]),
        ("musique/dev", "In which city was the discoverer of X-rays born", "Lennep"),
    ):
        row = {"id": "dev_0", "question": q, "golden_answers": a, "metadata": {"type": "compositional"}}
        flashrag[key] = write_jsonl(src / "flashrag" / f"{key}.jsonl", [row])
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
    write_jsonl(ifbench, jsonl_rows(DATA / "instruct" / "ifbench.jsonl") + [
        {"key": 9999, "prompt": "Write a poem.", "instruction_id_list": ["custom:no_such_check"], "kwargs": [{}]}])
    # messages + ground_truth (JSON or Python literal)
    if_train = write_jsonl(src / "IF_multi_constraints_upto5.jsonl", [
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
