"""Writes that never leave a half-written file or directory under its final name.

    atomic_write_text(path, text)       readers see the old file or the new one, never a partial one
    write_json(path, obj)               the same for JSON
    with atomic_dir(path) as tmp: ...   fill ``tmp``; on success it replaces ``path``, on an error it is removed

Used by the run store (``acl_lib.runs``) and by the trainers (``acl_lib.train``), which know nothing of runs:
they write into an output directory through these helpers.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old file or the new one, never a partial one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """``obj`` as indented JSON at ``path``, written atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")
    return Path(path)


@contextmanager
def atomic_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary dir beside ``final``; on success it replaces ``final`` (an older one is
    removed), on an exception it is deleted. ``final`` is therefore never half-written."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        # rename the old one away first: a crash between the two renames leaves no <final>, never a mix
        old = Path(tempfile.mkdtemp(prefix=f".tmp-old-{final.name}-", dir=final.parent))
        os.rename(final, old / "x")
        os.rename(tmp, final)
        shutil.rmtree(old)
    else:
        os.rename(tmp, final)


def file_sha256(path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def jsonable(obj):
    """``obj`` with NaN and infinities as None (JSON has neither), numpy scalars and arrays as Python values, and
    dict keys as strings: what ``write_json`` of measured numbers needs."""
    import math

    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "tolist") and hasattr(obj, "dtype"):  # a numpy array or scalar (numpy is not imported here)
        obj = obj.tolist()
        if isinstance(obj, list):
            return jsonable(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
