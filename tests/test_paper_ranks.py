"""Issue 15, real data at the paper profile: several ranks open the search corpus at once (one builds the BM25
index, the others wait and load it), and a missing instruction-following training file is an error."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from acl_lib.config import WorldsConfig
from acl_lib.envs.instruct import InstructEnv
from conftest import ROOT, child_env

DATA = Path(__file__).parent / "data"

# One "rank": open the corpus with a slowed-down index build (so the ranks really overlap), search once.
_RANK = """
import json, sys, time
import bm25s
from acl_lib.envs.retrievers import BM25Retriever

index = bm25s.BM25.index
def slow_index(self, *a, **kw):
    time.sleep(2.0)
    return index(self, *a, **kw)
bm25s.BM25.index = slow_index
r = BM25Retriever.from_corpus_file(sys.argv[1])
print(json.dumps({"built": r.built, "hits": len(r.search("river", 2))}))
"""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ranks_build_the_bm25_index_once(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    shutil.copy(DATA / "search" / "corpus.jsonl", corpus)
    procs = [subprocess.Popen([sys.executable, "-c", _RANK, str(corpus)], cwd=ROOT, env=child_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=100)
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(r["built"] for r in results) == [False, False, True]  # one build, two loads
    assert len({r["hits"] for r in results}) == 1 and results[0]["hits"] > 0
    assert (tmp_path / "corpus.jsonl.bm25s" / "offsets.npy").exists()
    assert not (tmp_path / "corpus.jsonl.bm25s.tmp").exists()


def test_missing_if_training_file_is_an_error_naming_it(tmp_path):
    d = tmp_path / "instruct"
    d.mkdir()
    shutil.copy(DATA / "instruct" / "ifeval.jsonl", d / "ifeval.jsonl")
    env = InstructEnv(WorldsConfig(data_dir=str(tmp_path)), seed=0)
    assert len(env.tasks("test", 100)) > 0  # the benchmark file is there
    with pytest.raises(FileNotFoundError, match=str(d / "train.jsonl")):
        env.tasks("train", 3)  # the old code trained on generated mini prompts instead, without a word
    assert InstructEnv(WorldsConfig(), seed=0).tasks("train", 3)[0].meta["source"] == "generated"  # mini: generated
