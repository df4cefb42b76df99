"""The paper profile's data: ``acl data prepare`` downloads and converts it, ``acl data check`` checks it.

    acl data prepare --data-dir data/paper [--only math_dapo gpqa ...]   # a machine with hub access
    acl data check   --data-dir data/paper [--full] [--skip-checksums]  # before any GPU time

Everything the paper profile reads lives under ``worlds.data_dir`` in the layout its loaders read (``LAYOUT``:
``math/``, ``search/``, ``retail/``, ``mock/``, ``telecom/``, ``instruct/``; README "Real data"). Nothing is
downloaded at run time.

**prepare** runs, per data set of ``DATASETS``, a thin download step (``fetch_*``: the Hugging Face Hub through
``huggingface_hub`` / ``datasets``, tau2-bench's files from GitHub at ``TAU2_REF``) into ``<data_dir>/.downloads/``
and a conversion (``convert_*``, local files in, layout files out; the tests run these on small files in each
source schema). It then writes ``MANIFEST.json``: per layout file its sha256, size, rows and source, plus the
conversion notes (rows dropped and why). A data set that fails (no network, a gated repository without access)
is reported and the others still prepared; the exit code is then 1.

GPQA-Diamond is gated: open https://huggingface.co/datasets/Idavidrein/gpqa while logged in, accept its terms,
then ``huggingface-cli login`` (or set ``HF_TOKEN``) on the machine that runs ``prepare --only gpqa``.

**check** reports every layout file as ``ok``, ``missing``, ``malformed`` (a required field absent or of the
wrong type, a row that does not parse, an instruction id the suite cannot verify, split ids not in the task
file) or ``modified`` (its sha256 differs from ``MANIFEST.json``); exit code 0 only when all are ok. Large files
are checked on their first ``max_rows`` rows (1,000; ``--full``: every row); checksums cover whole files
(``--skip-checksums`` skips them: the 14 GB corpus takes a minute).

Conversions worth knowing: MMLU-Redux's 57 subject configurations become one file with a ``subject`` column;
IFEval, IFBench and the IF training prompts keep only rows whose every instruction id the suite's verifiers know
(``ifeval_checks``; the loader would refuse the others), and the training prompts (allenai/IF_multi_constraints_
upto5: ``messages``, ``ground_truth``) are rewritten in the IFEval schema; the FlashRAG files and the corpus are
copied (the corpus decompressed); tau2 files are copied as they are.
"""

from __future__ import annotations

import ast
import csv
import gzip
import json
import shutil
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from acl_lib.atomic import file_sha256
from acl_lib.envs import instruct  # noqa: F401 - registers every verifier (IFEval and the OOD ones)
from acl_lib.envs.ifeval_checks import validate_instruction

MANIFEST = "MANIFEST.json"
DOWNLOADS = ".downloads"
TAU2_REF = "v1.0.0"  # the tau2-bench tag the vendored fixtures come from
TAU2_RAW = "https://raw.githubusercontent.com/sierra-research/tau2-bench/{ref}/data/tau2/domains/{domain}/{file}"
MAX_ROWS = 1000


class DataError(ValueError):
    """A source or layout file that does not have the expected schema."""


# --- reading rows ---------------------------------------------------------------------------------------------


def read_rows(path: str | Path, limit: int | None = None) -> Iterator[dict]:
    """Rows of a ``.jsonl`` (``.jsonl.gz``), ``.json`` (a list of objects), ``.parquet`` or ``.csv`` file, at most
    ``limit``. A line that is not a JSON object raises ``DataError`` naming the file and line."""
    p = Path(path)
    name = p.name
    n = 0
    if name.endswith((".jsonl", ".jsonl.gz")):
        opener = gzip.open if name.endswith(".gz") else open
        with opener(p, "rt", encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if limit is not None and n >= limit:
                    return
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    raise DataError(f"{p}:{lineno}: not JSON ({exc})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{p}:{lineno}: expected a JSON object, got {type(row).__name__}")
                n += 1
                yield row
    elif name.endswith(".json"):
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise DataError(f"{p}: not JSON ({exc})") from None
        if not isinstance(data, list):
            raise DataError(f"{p}: expected a JSON list of rows, got {type(data).__name__}")
        for i, row in enumerate(data[:limit] if limit is not None else data):
            if not isinstance(row, dict):
                raise DataError(f"{p}: row {i} is not an object")
            yield row
    elif name.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(p)
        except Exception as exc:  # pyarrow's errors have many types
            raise DataError(f"{p}: not a parquet file ({exc})") from None
        for batch in pf.iter_batches(batch_size=512):
            for row in batch.to_pylist():
                if limit is not None and n >= limit:
                    return
                n += 1
                yield row
    elif name.endswith(".csv"):
        with open(p, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                if limit is not None and n >= limit:
                    return
                n += 1
                yield row
    else:
        raise DataError(f"{p}: unknown format (expected .jsonl, .jsonl.gz, .json, .parquet or .csv)")


def write_jsonl(path: Path, rows) -> int:
    """Write rows as JSON lines (UTF-8, non-ASCII kept) through a temporary file; returns the row count."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            n += 1
    tmp.replace(path)
    return n


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    if src.name.endswith(".gz") and not dst.name.endswith(".gz"):
        with gzip.open(src, "rb") as fi, open(tmp, "wb") as fo:
            shutil.copyfileobj(fi, fo, 1 << 20)
    else:
        shutil.copyfile(src, tmp)
    tmp.replace(dst)


# --- schema checks (one per kind of layout file) -----------------------------------------------------------------


def _need(row: dict, key: str, types: type | tuple, where: str) -> Any:
    if key not in row or row[key] is None:
        raise DataError(f"{where}: missing field '{key}'")
    if not isinstance(row[key], types):
        want = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
        raise DataError(f"{where}: field '{key}' must be {want}, got {type(row[key]).__name__}")
    return row[key]


def _rows(path: Path, limit: int | None, check: Callable[[dict, str], None]) -> int:
    n = 0
    for i, row in enumerate(read_rows(path, limit)):
        check(row, f"{path.name} row {i}")
        n += 1
    if n == 0:
        raise DataError(f"{path.name}: no rows")
    return n


def _dapo_row(row: dict, where: str) -> None:
    prompt = _need(row, "prompt", (list, tuple), where)
    if not any(isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str) for m in prompt):
        raise DataError(f"{where}: 'prompt' has no user message with text content")
    rm = _need(row, "reward_model", dict, where)
    if rm.get("ground_truth") in (None, ""):
        raise DataError(f"{where}: missing field 'reward_model.ground_truth'")


def _aime_row(row: dict, where: str) -> None:
    _need(row, "problem", str, where)
    _need(row, "answer", (str, int), where)


def _gpqa_row(row: dict, where: str) -> None:
    for key in ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3"):
        if not str(row.get(key) or "").strip():
            raise DataError(f"{where}: missing field '{key}'")


def _mmlu_row(row: dict, where: str) -> None:
    _need(row, "question", str, where)
    choices = _need(row, "choices", (list, tuple), where)
    if len(choices) != 4:
        raise DataError(f"{where}: 'choices' must hold 4 options, got {len(choices)}")
    _need(row, "answer", (int, str), where)
    _need(row, "subject", str, where)


def _question_row(row: dict, where: str) -> None:
    _need(row, "question", str, where)
    gold = _need(row, "golden_answers", (list, tuple, str), where)
    if not gold:
        raise DataError(f"{where}: 'golden_answers' is empty")


def _corpus_row(row: dict, where: str) -> None:
    _need(row, "id", (str, int), where)
    _need(row, "contents", str, where)


def _ifeval_row(row: dict, where: str) -> None:
    _need(row, "prompt", str, where)
    ids = _need(row, "instruction_id_list", (list, tuple), where)
    kwargs = row.get("kwargs") or [{}] * len(ids)
    if len(kwargs) != len(ids):
        raise DataError(f"{where}: {len(ids)} instruction ids but {len(kwargs)} kwargs")
    for iid, kw in zip(ids, kwargs):
        try:
            validate_instruction(iid, kw)
        except KeyError:
            raise DataError(f"{where}: instruction id {iid!r} has no verifier in the suite") from None
        except ValueError as exc:
            raise DataError(f"{where}: {exc}") from None


def _tau2_task_row(row: dict, where: str) -> None:
    _need(row, "id", (str, int), where)
    scenario = _need(row, "user_scenario", dict, where)
    if not scenario.get("instructions"):
        raise DataError(f"{where}: missing field 'user_scenario.instructions'")
    if "evaluation_criteria" not in row:
        raise DataError(f"{where}: missing field 'evaluation_criteria'")


def _json_object(path: Path, keys: tuple[str, ...]) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise DataError(f"{path.name}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise DataError(f"{path.name}: expected a JSON object")
    for k in keys:
        if not isinstance(data.get(k), dict):
            raise DataError(f"{path.name}: missing table '{k}'")
    return data


def _check_split(path: Path, limit: int | None, required: tuple[str, ...] = ()) -> int:
    """A ``split_tasks.json``: split name -> task ids. With ``required`` splits (retail's train and test, which
    RetailEnv reads), their ids must be tasks of the ``tasks.json`` beside it (telecom's splits also name the
    tasks of its other task files)."""
    data = _json_object(path, ())
    tasks_file = path.with_name("tasks.json")
    ids = {str(t.get("id")) for t in read_rows(tasks_file)} if required and tasks_file.is_file() else None
    for name in required:
        if not isinstance(data.get(name), list):
            raise DataError(f"{path.name}: missing split '{name}'")
    for name, members in data.items():
        if not isinstance(members, list):
            raise DataError(f"{path.name}: split '{name}' is not a list of task ids")
        unknown = [m for m in members if ids is not None and str(m) not in ids]
        if unknown:
            raise DataError(f"{path.name}: split '{name}' names tasks not in tasks.json: {unknown[:5]}")
    return sum(len(v) for v in data.values())


def _check_text(path: Path, limit: int | None) -> int:
    if not path.read_text(encoding="utf-8").strip():
        raise DataError(f"{path.name}: empty")
    return 1


def _check_toml(path: Path, limit: int | None) -> int:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise DataError(f"{path.name}: not TOML ({exc})") from None
    if not data:
        raise DataError(f"{path.name}: empty")
    return len(data)


def _rows_check(fn):
    return lambda path, limit: _rows(path, limit, fn)


CHECKS: dict[str, Callable[[Path, int | None], int]] = {
    "dapo": _rows_check(_dapo_row),
    "aime": _rows_check(_aime_row),
    "gpqa": _rows_check(_gpqa_row),
    "mmlu_redux": _rows_check(_mmlu_row),
    "questions": _rows_check(_question_row),
    "corpus": _rows_check(_corpus_row),
    "ifeval": _rows_check(_ifeval_row),
    "tau2_tasks": _rows_check(_tau2_task_row),
    "retail_db": lambda p, limit: len(_json_object(p, ("products", "users", "orders"))["orders"]),
    "mock_db": lambda p, limit: len(_json_object(p, ("tasks", "users"))["tasks"]),
    "retail_split": lambda p, limit: _check_split(p, limit, ("train", "test")),
    "split": _check_split,
    "text": _check_text,
    "toml": _check_toml,
}


@dataclass(frozen=True)
class LayoutFile:
    """One file the paper profile reads: its path under the data dir (the first of ``names`` that exists counts)
    and the schema ``kind`` it is checked against (a key of ``CHECKS``)."""

    names: tuple[str, ...]
    kind: str
    dataset: str  # the DATASETS entry that writes it

    @property
    def path(self) -> str:
        return self.names[0]

    def find(self, data_dir: Path) -> Path | None:
        return next((data_dir / n for n in self.names if (data_dir / n).is_file()), None)


def _f(dataset: str, kind: str, *names: str) -> LayoutFile:
    return LayoutFile(tuple(names), kind, dataset)


FLASHRAG_FILES = {  # dataset folder -> file stem (search.REAL_DATASETS)
    "nq": ("train", "test"), "popqa": ("test",), "triviaqa": ("test",), "2wikimultihopqa": ("dev",),
    "hotpotqa": ("dev",), "bamboogle": ("test",), "musique": ("dev",),
}
TAU2_FILES = {
    "retail": ("db.json", "tasks.json", "split_tasks.json", "policy.md"),
    "mock": ("db.json", "tasks.json", "split_tasks.json", "policy.md"),
    "telecom": ("db.toml", "user_db.toml", "tasks.json", "split_tasks.json", "main_policy.md",
                "tech_support_manual.md"),
}
_TAU2_KIND = {"tasks.json": "tau2_tasks", "split_tasks.json": "split", "policy.md": "text", "main_policy.md": "text",
              "tech_support_manual.md": "text", "db.toml": "toml", "user_db.toml": "toml"}


def _tau2_kind(domain: str, name: str) -> str:
    if name == "db.json":
        return "retail_db" if domain == "retail" else "mock_db"
    if domain == "retail" and name == "split_tasks.json":
        return "retail_split"  # RetailEnv reads its train and test splits
    return _TAU2_KIND[name]

LAYOUT: list[LayoutFile] = [
    _f("math_dapo", "dapo", "math/dapo_math_17k.parquet", "math/dapo_math_17k.jsonl", "math/dapo_math_17k.json"),
    _f("aime26", "aime", "math/aime26.jsonl", "math/aime26.json", "math/aime26.parquet"),
    _f("gpqa", "gpqa", "math/gpqa_diamond.csv"),
    _f("mmlu_redux", "mmlu_redux", "math/mmlu_redux.jsonl", "math/mmlu_redux.parquet"),
    *[_f("flashrag", "questions", f"search/{d}/{s}.jsonl") for d, stems in FLASHRAG_FILES.items() for s in stems],
    _f("wiki_corpus", "corpus", "search/wiki-18.jsonl", "search/corpus.jsonl"),
    *[_f(f"tau2_{dom}", _tau2_kind(dom, f), f"{dom}/{f}") for dom, files in TAU2_FILES.items() for f in files],
    _f("ifeval", "ifeval", "instruct/ifeval.jsonl"),
    _f("ifbench", "ifeval", "instruct/ifbench.jsonl"),
    _f("if_train", "ifeval", "instruct/train.jsonl"),
]


# --- conversions: local source files -> layout files --------------------------------------------------------------


def convert_dapo(src: Path, data_dir: Path) -> dict:
    """DAPO-Math-17K as released (parquet or jsonl: ``prompt``, ``reward_model``, ...), checked and copied."""
    _rows(src, MAX_ROWS, _dapo_row)
    suffix = ".parquet" if src.name.endswith(".parquet") else ".jsonl" if src.name.endswith(".jsonl") else ".json"
    _copy(src, data_dir / f"math/dapo_math_17k{suffix}")
    return {}


def convert_aime(src: Path, data_dir: Path) -> dict:
    """AIME 2026 in the MathArena schema (``problem_idx``, ``problem``, ``answer``) -> ``math/aime26.jsonl``."""
    rows = []
    for i, r in enumerate(read_rows(src)):
        _aime_row(r, f"{src.name} row {i}")
        rows.append({"problem_idx": r.get("problem_idx", r.get("id", i + 1)), "problem": r["problem"],
                     "answer": r["answer"]})
    write_jsonl(data_dir / "math/aime26.jsonl", rows)
    return {"rows": len(rows)}


def convert_gpqa(src: Path, data_dir: Path) -> dict:
    """GPQA-Diamond's original CSV, checked and copied (the loader reads its columns as they are)."""
    _rows(src, None, _gpqa_row)
    _copy(src, data_dir / "math/gpqa_diamond.csv")
    return {}


def convert_mmlu_redux(srcs: dict[str, Path], data_dir: Path) -> dict:
    """MMLU-Redux 2.0, one source file per subject configuration (``question``, ``choices``, ``answer``,
    ``error_type``, ...) -> one ``math/mmlu_redux.jsonl`` with a ``subject`` column."""
    def rows():
        for subject, src in sorted(srcs.items()):
            for r in read_rows(src):
                r = dict(r, subject=subject)
                _mmlu_row(r, f"{src.name} ({subject})")
                yield r
    return {"rows": write_jsonl(data_dir / "math/mmlu_redux.jsonl", rows()), "subjects": len(srcs)}


def convert_flashrag(srcs: dict[str, Path], data_dir: Path) -> dict:
    """FlashRAG question files (``id``, ``question``, ``golden_answers``), keyed ``"<dataset>/<stem>"``, checked
    (every row) and written to ``search/<dataset>/<stem>.jsonl`` with ``golden_answers`` always a list."""
    counts = {}
    for key, src in sorted(srcs.items()):
        def rows(src=src):
            for i, r in enumerate(read_rows(src)):
                _question_row(r, f"{src.name} row {i}")
                gold = r["golden_answers"]
                yield dict(r, golden_answers=[gold] if isinstance(gold, str) else [str(g) for g in gold])
        counts[key] = write_jsonl(data_dir / f"search/{key}.jsonl", rows())
    return {"rows": counts}


def convert_corpus(src: Path, data_dir: Path) -> dict:
    """The Wikipedia corpus (``id``, ``contents`` = ``"Title"\\ntext``; jsonl or jsonl.gz) ->
    ``search/wiki-18.jsonl``, decompressed; the bm25s index is built beside it on first use."""
    _rows(src, MAX_ROWS, _corpus_row)
    _copy(src, data_dir / "search/wiki-18.jsonl")
    return {}


def convert_tau2(domain: str, src_dir: Path, data_dir: Path) -> dict:
    """tau2-bench's files of ``domain`` (``TAU2_FILES``), copied as they are into ``<data_dir>/<domain>/``."""
    missing = [f for f in TAU2_FILES[domain] if not (src_dir / f).is_file()]
    if missing:
        raise DataError(f"tau2 {domain}: {src_dir} lacks {', '.join(missing)}")
    for f in TAU2_FILES[domain]:
        _copy(src_dir / f, data_dir / domain / f)
    return {}


def _verifiable(ids: list, kwargs: list) -> str | None:
    """Why an instruction list cannot be scored by the suite, or None."""
    try:
        _ifeval_row({"prompt": "", "instruction_id_list": ids, "kwargs": kwargs}, "row")
    except DataError as exc:
        return str(exc).split(": ", 1)[-1]
    return None


def convert_ifeval(src: Path, dst: Path) -> dict:
    """IFEval / IFBench rows (``key``, ``prompt``, ``instruction_id_list``, ``kwargs``) -> ``dst``, keeping rows whose
    every instruction the suite can verify; ``kwargs`` keep only their non-null entries (Arrow pads every row's
    kwargs with the other rows' keys as nulls)."""
    kept, dropped = [], {}
    for i, r in enumerate(read_rows(src)):
        for key in ("prompt", "instruction_id_list"):
            if key not in r:
                raise DataError(f"{src.name} row {i}: missing field '{key}'")
        ids = list(r["instruction_id_list"])
        kwargs = [{k: v for k, v in (kw or {}).items() if v is not None} for kw in (r.get("kwargs") or [{}] * len(ids))]
        why = _verifiable(ids, kwargs)
        if why:
            dropped[why] = dropped.get(why, 0) + 1
            continue
        kept.append({"key": r.get("key", i), "prompt": r["prompt"], "instruction_id_list": ids, "kwargs": kwargs})
    write_jsonl(dst, kept)
    return {"rows": len(kept), "dropped": sum(dropped.values()), "dropped_why": dropped}


def _ground_truth(value: Any) -> list[dict]:
    """IF-RLVR ``ground_truth``: a JSON (or Python-literal) string of ``{"instruction_id": [...], "kwargs": [...]}``
    or a list of them."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = ast.literal_eval(value)
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, dict) and "instruction_id" in v for v in value):
        raise DataError(f"ground_truth is not a list of {{instruction_id, kwargs}}: {str(value)[:120]}")
    return value


def convert_if_train(src: Path, dst: Path) -> dict:
    """The IF training prompts (allenai/IF_multi_constraints_upto5: ``key``, ``messages``, ``ground_truth``) in the
    IFEval schema, keeping rows whose every instruction the suite can verify."""
    kept, dropped = [], {}
    for i, r in enumerate(read_rows(src)):
        where = f"{src.name} row {i}"
        msgs = _need(r, "messages", (list, tuple), where)
        prompt = next((m.get("content") for m in reversed(list(msgs))
                       if isinstance(m, dict) and m.get("role") == "user"), None)
        if not isinstance(prompt, str):
            raise DataError(f"{where}: 'messages' has no user message")
        try:
            truth = _ground_truth(_need(r, "ground_truth", (str, list, dict), where))
        except (ValueError, SyntaxError) as exc:
            raise DataError(f"{where}: ground_truth does not parse ({exc})") from None
        ids = [iid for t in truth for iid in t["instruction_id"]]
        kwargs = [{k: v for k, v in (kw or {}).items() if v is not None} for t in truth
                  for kw in (t.get("kwargs") or [{}] * len(t["instruction_id"]))]
        why = _verifiable(ids, kwargs) if len(ids) == len(kwargs) else "instruction ids and kwargs differ in number"
        if why:
            dropped[why] = dropped.get(why, 0) + 1
            continue
        kept.append({"key": r.get("key", i), "prompt": prompt, "instruction_id_list": ids, "kwargs": kwargs})
    write_jsonl(dst, kept)
    return {"rows": len(kept), "dropped": sum(dropped.values()), "dropped_why": dropped}


# --- downloads (thin; not run by the tests) -------------------------------------------------------------------


def _hub_file(repo: str, filename: str, dest: Path) -> Path:
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(repo, filename, repo_type="dataset", local_dir=dest))


def _hub_rows(repo: str, dest: Path, config: str | None = None, split: str = "train", fmt: str = "jsonl") -> Path:
    """One split of a hub data set, saved as ``fmt`` (jsonl or parquet) through ``datasets.load_dataset`` (so the
    repository's own file layout does not matter)."""
    import datasets

    ds = datasets.load_dataset(repo, config, split=split)
    out = dest / f"{repo.replace('/', '__')}{'__' + config if config else ''}__{split}.{fmt}"
    dest.mkdir(parents=True, exist_ok=True)
    if fmt == "parquet":
        ds.to_parquet(str(out))
    else:
        ds.to_json(str(out), lines=True, force_ascii=False)
    return out


def _url(url: str, dest: Path) -> Path:
    import urllib.request

    dest.parent.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(url, timeout=120) as resp, open(dest, "wb") as f:
        shutil.copyfileobj(resp, f)
    return dest


def _fetch_tau2(domain: str, dl: Path) -> Path:
    d = dl / "tau2" / domain
    for f in TAU2_FILES[domain]:
        _url(TAU2_RAW.format(ref=TAU2_REF, domain=domain, file=f), d / f)
    return d


def _mmlu_subjects() -> list[str]:
    from datasets import get_dataset_config_names

    return get_dataset_config_names("edinburgh-dawg/mmlu-redux-2.0")


@dataclass(frozen=True)
class Dataset:
    """One data set of the paper profile: where it comes from, how to get access, how it is fetched and converted."""

    name: str
    source: str
    prepare: Callable[[Path, Path], dict]  # (download dir, data dir) -> conversion notes
    access: str = ""


DATASETS: list[Dataset] = [
    Dataset("math_dapo", "hf:BytedTsinghua-SIA/DAPO-Math-17k (train, ~1.8M rows: each prompt repeated)",
            lambda dl, d: convert_dapo(_hub_rows("BytedTsinghua-SIA/DAPO-Math-17k", dl, fmt="parquet"), d)),
    Dataset("aime26", "hf:MathArena/aime_2026 (train)",
            lambda dl, d: convert_aime(_hub_rows("MathArena/aime_2026", dl), d)),
    Dataset("gpqa", "hf:Idavidrein/gpqa (gpqa_diamond.csv)",
            lambda dl, d: convert_gpqa(_hub_file("Idavidrein/gpqa", "gpqa_diamond.csv", dl), d),
            access="gated: accept the terms at https://huggingface.co/datasets/Idavidrein/gpqa (logged in), then "
                   "`huggingface-cli login` or set HF_TOKEN, and run `acl data prepare --only gpqa` again"),
    Dataset("mmlu_redux", "hf:edinburgh-dawg/mmlu-redux-2.0 (every subject, test)",
            lambda dl, d: convert_mmlu_redux({s: _hub_rows("edinburgh-dawg/mmlu-redux-2.0", dl, s, "test")
                                              for s in _mmlu_subjects()}, d)),
    Dataset("flashrag",
            "hf:RUC-NLPIR/FlashRAG_datasets (nq, popqa, triviaqa, 2wikimultihopqa, hotpotqa, bamboogle, musique)",
            lambda dl, d: convert_flashrag({f"{ds}/{s}": _hub_file("RUC-NLPIR/FlashRAG_datasets", f"{ds}/{s}.jsonl", dl)
                                            for ds, stems in FLASHRAG_FILES.items() for s in stems}, d)),
    Dataset("wiki_corpus", "hf:PeterJinGo/wiki-18-corpus (wiki-18.jsonl.gz, the Search-R1 corpus, ~14 GB unpacked)",
            lambda dl, d: convert_corpus(_hub_file("PeterJinGo/wiki-18-corpus", "wiki-18.jsonl.gz", dl), d)),
    *[Dataset(f"tau2_{dom}", f"github:sierra-research/tau2-bench@{TAU2_REF} data/tau2/domains/{dom}/",
              lambda dl, d, dom=dom: convert_tau2(dom, _fetch_tau2(dom, dl), d)) for dom in TAU2_FILES],
    Dataset("ifeval", "hf:google/IFEval (train)",
            lambda dl, d: convert_ifeval(_hub_rows("google/IFEval", dl), d / "instruct/ifeval.jsonl")),
    Dataset("ifbench", "hf:allenai/IFBench_test (train)",
            lambda dl, d: convert_ifeval(_hub_rows("allenai/IFBench_test", dl), d / "instruct/ifbench.jsonl")),
    Dataset("if_train", "hf:allenai/IF_multi_constraints_upto5 (train)",
            lambda dl, d: convert_if_train(_hub_rows("allenai/IF_multi_constraints_upto5", dl),
                                           d / "instruct/train.jsonl")),
]


# --- manifest, prepare, check -------------------------------------------------------------------------------------


sha256 = file_sha256  # one implementation, in acl_lib.atomic


def write_manifest(data_dir: str | Path, notes: dict[str, dict] | None = None) -> Path:
    """``MANIFEST.json`` for every layout file present: sha256, bytes, source; plus the conversion ``notes``."""
    d = Path(data_dir)
    sources = {ds.name: ds.source for ds in DATASETS}
    old = json.loads((d / MANIFEST).read_text()) if (d / MANIFEST).is_file() else {}
    files = dict(old.get("files") or {})
    for lf in LAYOUT:
        p = lf.find(d)
        if p is not None:
            files[str(p.relative_to(d))] = {"sha256": sha256(p), "bytes": p.stat().st_size, "dataset": lf.dataset,
                                            "source": sources.get(lf.dataset, "")}
    manifest = {"written_at": datetime.now(UTC).isoformat(timespec="seconds"), "tau2_ref": TAU2_REF,
                "files": dict(sorted(files.items())), "notes": {**(old.get("notes") or {}), **(notes or {})}}
    (d / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return d / MANIFEST


def prepare(data_dir: str | Path, only: list[str] | None = None, log: Callable[[str], None] = print) -> dict[str, str]:
    """Download and convert ``only`` (default: every data set of ``DATASETS``) into ``data_dir``; write the manifest.
    Returns {data set: error} for those that failed (empty when all were prepared)."""
    d = Path(data_dir)
    names = [ds.name for ds in DATASETS]
    unknown = sorted(set(only or []) - set(names))
    if unknown:
        raise DataError(f"unknown data set(s) {unknown}; data sets are {names}")
    dl = d / DOWNLOADS
    failed, notes = {}, {}
    for ds in DATASETS:
        if only and ds.name not in only:
            continue
        log(f"{ds.name}: {ds.source}")
        try:
            notes[ds.name] = ds.prepare(dl / ds.name, d)
        except Exception as exc:  # one data set's failure never costs the others
            first_line = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            failed[ds.name] = f"{type(exc).__name__}: {first_line}"
            log(f"{ds.name}: FAILED ({failed[ds.name]})" + (f"\n    {ds.access}" if ds.access else ""))
            continue
        log(f"{ds.name}: done {notes[ds.name] or ''}".rstrip())
    write_manifest(d, notes)
    return failed


@dataclass
class FileStatus:
    path: str  # relative to the data dir (the name found, else the preferred one)
    status: str  # ok | missing | malformed | modified
    rows: int | None = None  # rows (or records) checked
    detail: str = ""


@dataclass
class CheckReport:
    data_dir: Path
    files: list[FileStatus] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return all(f.status == "ok" for f in self.files)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in self.files:
            out[f.status] = out.get(f.status, 0) + 1
        return out

    def format(self) -> str:
        w = max(len(f.path) for f in self.files)
        lines = [f"{'file':<{w}}  {'status':<9}  {'rows':>7}  detail", "-" * (w + 30)]
        for f in self.files:
            rows = "" if f.rows is None else str(f.rows)
            lines.append(f"{f.path:<{w}}  {f.status:<9}  {rows:>7}  {f.detail}".rstrip())
        lines += [f"warning: {x}" for x in self.warnings]
        summary = ", ".join(f"{n} {s}" for s, n in sorted(self.counts().items()))
        verdict = "complete" if self.complete else "NOT complete"
        lines.append(f"{self.data_dir}: {verdict} ({summary} of {len(self.files)} files)")
        return "\n".join(lines)


def check(data_dir: str | Path, max_rows: int | None = MAX_ROWS, checksums: bool = True) -> CheckReport:
    """Check every ``LAYOUT`` file under ``data_dir``: present, in its schema (first ``max_rows`` rows; None: all),
    and, when ``MANIFEST.json`` lists it and ``checksums``, unchanged since ``prepare``."""
    d = Path(data_dir)
    report = CheckReport(d)
    manifest: dict = {}
    if (d / MANIFEST).is_file():
        try:
            manifest = json.loads((d / MANIFEST).read_text()).get("files") or {}
        except ValueError:
            report.warnings.append(f"{MANIFEST} is not JSON: checksums not verified")
    elif d.is_dir() and any(d.iterdir()):
        report.warnings.append(f"no {MANIFEST} (not written by `acl data prepare`): checksums not verified")
    for lf in LAYOUT:
        p = lf.find(d)
        if p is None:
            alts = f" (or {', '.join(lf.names[1:])})" if len(lf.names) > 1 else ""
            report.files.append(FileStatus(lf.path, "missing", detail=f"from {lf.dataset}{alts}"))
            continue
        rel = str(p.relative_to(d))
        try:
            rows = CHECKS[lf.kind](p, max_rows)
        except (DataError, UnicodeDecodeError, OSError) as exc:
            report.files.append(FileStatus(rel, "malformed", detail=str(exc)))
            continue
        entry = manifest.get(rel)
        if checksums and entry and entry.get("sha256") != sha256(p):
            report.files.append(FileStatus(rel, "modified", rows, f"sha256 differs from {MANIFEST}"))
            continue
        report.files.append(FileStatus(rel, "ok", rows))
    return report


# --- CLI ----------------------------------------------------------------------------------------------------------


def cli_prepare(args) -> int:
    """``acl data prepare --data-dir DIR [--only NAME ...]``: 0 when every data set was prepared, else 1."""
    d = Path(args.data_dir)
    if d.exists() and not d.is_dir():
        print(f"acl: error: --data-dir {d}: a file, not a directory", flush=True)
        return 2
    d.mkdir(parents=True, exist_ok=True)
    try:
        failed = prepare(d, args.only)
    except DataError as exc:
        print(f"acl: error: {exc}")
        return 2
    report = check(d, checksums=False)
    print(report.format())
    if failed:
        print(f"\n{len(failed)} data set(s) failed: " + ", ".join(failed) + f"; rerun with --only {' '.join(failed)}")
        return 1
    return 0 if report.complete else 1


def cli_check(args) -> int:
    """``acl data check --data-dir DIR``: 0 when every file is present and well-formed, else 1 (2: bad usage)."""
    d = Path(args.data_dir)
    if d.exists() and not d.is_dir():
        print(f"acl: error: --data-dir {d}: a file, not a directory")
        return 2
    report = check(d, max_rows=None if args.full else MAX_ROWS, checksums=not args.skip_checksums)
    print(report.format())
    return 0 if report.complete else 1
