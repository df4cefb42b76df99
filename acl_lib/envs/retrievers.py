"""Retrievers for the search domain: a local BM25 index (``bm25s``) and a client of a Search-R1-style
retrieval service over HTTP (``worlds.retriever_url``). Both have ``search(query, k) -> [{"id",
"contents", "score"}]``; ``search.SearchEnv`` picks one and formats what it returns.
"""

from __future__ import annotations

import http.client
import json
import urllib.request
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from acl_lib.envs.base import ToolError


def _tokenize_queries(queries: list[str]) -> list[list[str]]:
    import bm25s

    return bm25s.tokenize(queries, stopwords="en", return_ids=False, show_progress=False)


try:  # bm25s's fast scoring backend, where numba is installed (the gpu extra); numpy otherwise
    import numba  # noqa: F401

    _BACKEND = "numba"
except ImportError:
    _BACKEND = "numpy"


class BM25Retriever:
    """BM25 (bm25s) over a list of ``{"id", "contents"}`` documents.

    ``docs`` may be a list or any callable ``i -> doc`` (the real corpus is read from disk by offset,
    so a 21M-passage corpus never sits in memory).
    """

    def __init__(self, bm25, get_doc: Callable[[int], dict], built: bool = False):
        self.bm25 = bm25
        self._get_doc = get_doc
        self.built = built  # from_corpus_file: True if this process built the saved index, False if it loaded it

    @classmethod
    def from_documents(cls, docs: list[dict]) -> BM25Retriever:
        import bm25s

        tokens = bm25s.tokenize([d["contents"] for d in docs], stopwords="en", show_progress=False)
        bm25 = bm25s.BM25()
        bm25.index(tokens, show_progress=False)
        return cls(bm25, docs.__getitem__)

    @classmethod
    def from_corpus_file(cls, corpus_path: str | Path) -> BM25Retriever:
        """Load the index saved next to ``corpus_path`` (``<corpus>.bm25s/``), building it if missing.

        Every rank of a training job opens the search world, so several processes may find the index missing
        at once: the build runs under an exclusive lock (``<corpus>.bm25s.lock``, an ``flock``), the first
        process builds, the others wait and then load what it saved. Across nodes this needs a shared filesystem
        whose ``flock`` works between machines; otherwise build the index once before the job (any single
        process calling this)."""
        import bm25s

        corpus_path = Path(corpus_path)
        index_dir = corpus_path.with_name(corpus_path.name + ".bm25s")
        offsets_file = index_dir / "offsets.npy"
        built = False
        if not offsets_file.exists():
            with _exclusive(index_dir.with_name(index_dir.name + ".lock")):
                if not offsets_file.exists():  # another process may have built it while this one waited
                    cls._build_index(corpus_path, index_dir)
                    built = True
        bm25 = bm25s.BM25.load(str(index_dir), mmap=True, show_progress=False)
        offsets = np.load(offsets_file, mmap_mode="r")

        def get_doc(i: int) -> dict:
            with open(corpus_path, "rb") as f:
                f.seek(int(offsets[i]))
                return json.loads(f.readline())

        return cls(bm25, get_doc, built=built)

    @staticmethod
    def _build_index(corpus_path: Path, index_dir: Path) -> None:
        """Tokenise and index the corpus, save the index with the documents' byte offsets at ``index_dir``."""
        import shutil

        import bm25s

        offsets = []  # byte offset of every document line: documents are read back by seek
        with open(corpus_path, "rb") as f:
            pos = f.tell()
            for line in iter(f.readline, b""):
                if line.strip():
                    offsets.append(pos)
                pos = f.tell()

        def contents():  # streamed, so only token ids (not the corpus text) are held in memory
            with open(corpus_path, "rb") as f:
                for line in f:
                    if line.strip():
                        yield json.loads(line)["contents"]

        tokenizer = bm25s.tokenization.Tokenizer(stopwords="en")  # same rules as ``_tokenize_queries``
        tokens = tokenizer.tokenize(contents(), length=len(offsets), return_as="tuple", show_progress=False)
        bm25 = bm25s.BM25()
        bm25.index(tokens, show_progress=False)
        tmp = index_dir.with_name(index_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)  # left by a build that crashed (the lock says none is running)
        bm25.save(str(tmp), show_progress=False)
        np.save(tmp / "offsets.npy", np.asarray(offsets, dtype=np.int64))
        tmp.rename(index_dir)  # complete or absent: a crashed build never looks finished

    def search(self, query: str, k: int) -> list[dict]:
        """Top-``k`` documents (``id``, ``contents``, ``score``) with a positive BM25 score, best first."""
        return self.search_many([query], k)[0]

    def search_many(self, queries: list[str], k: int) -> list[list[dict]]:
        """``search`` for every query, in one ``bm25s`` call over all of them (its threads, and its numba backend
        where numba is installed): what a turn of many search episodes asks, retrieved as one batch."""
        tokens = _tokenize_queries(list(queries))
        n_docs = int(self.bm25.scores["num_docs"])
        out: list[list[dict]] = [[] for _ in queries]
        live = [i for i, t in enumerate(tokens) if t]
        if not live or n_docs == 0:
            return out
        ids, scores = self.bm25.retrieve([tokens[i] for i in live], k=min(k, n_docs), show_progress=False,
                                         n_threads=0 if len(live) == 1 else -1, backend_selection=_BACKEND)
        for row, i in enumerate(live):
            for j, sc in zip(ids[row], scores[row]):
                if sc > 0:
                    doc = self._get_doc(int(j))
                    out[i].append({"id": str(doc.get("id", j)), "contents": doc["contents"], "score": float(sc)})
        return out


@contextmanager
def _exclusive(lock_path: Path):
    """Hold an exclusive ``flock`` on ``lock_path`` (created), waiting for any other holder; released on exit,
    and by the operating system if the process dies."""
    import fcntl

    with open(lock_path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class HTTPRetriever:
    """Client of a Search-R1-style retrieval service.

    Request: ``POST <url>`` with ``{"queries": [...], "topk": k, "return_scores": true}``; response:
    ``{"result": [[{"document": {"id", "contents"}, "score"}, ...]]}`` (one list per query). Any
    failure (network, timeout, HTTP status, bad JSON, unexpected shape) raises ``ToolError``, which the
    episode shows the agent as ``Error: retriever unavailable: ...``.
    """

    def __init__(self, url: str, timeout: float = 30.0):
        self.url = url
        self.timeout = timeout

    def search(self, query: str, k: int) -> list[dict]:
        return self.search_many([query], k)[0]

    def search_many(self, queries: list[str], k: int) -> list[list[dict]]:
        """Every query in one request (the service's batch API)."""
        body = json.dumps({"queries": list(queries), "topk": k, "return_scores": True}).encode()
        req = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                payload = json.loads(resp.read().decode("utf-8"))
            results = []
            for q in range(len(queries)):
                docs = []
                for item in payload["result"][q]:
                    # without return_scores the server returns bare documents; accept both shapes
                    doc = item["document"] if "document" in item else item
                    docs.append({"id": str(doc.get("id", "")), "contents": str(doc["contents"]),
                                 "score": item.get("score")})
                results.append(docs[:k])
            return results
        # URLError and timeouts are OSErrors; a bad payload raises one of the others
        except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError, TypeError) as exc:
            raise ToolError(f"retriever unavailable: {type(exc).__name__}: {exc}") from None
