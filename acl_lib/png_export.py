"""Whether plotly can write PNG copies of figures here, decided without starting anything that can hang.

kaleido 1.x exports PNGs through a headless Chrome. Where none is installed, its sync server's thread dies with
``ChromeNotFoundError`` (on the kernel's stderr, which nobody sees) and ``fig.to_image()`` then waits forever for
a server that is gone. So the decision is made in three steps, each bounded:

1. ``ACL_PNG=0`` in the environment turns PNG copies off (``ACL_PNG=1``: already checked, by ``acl run``);
2. look for a Chrome the way kaleido does (choreographer's ``Chromium.find_browser``: its own download, then
   ``BROWSER_PATH``, ``PATH`` and the usual install paths); ``BROWSER_PATH``, when set, is the only place
   looked at, so pointing it at an empty directory shows what a machine without a browser does;
3. export one tiny figure in a child process with a time limit; only if that works does the caller start
   kaleido's server in its own process.

Without PNG copies every figure is still interactive in JupyterLab and in nbconvert HTML (plotly.js embedded);
``hint()`` says how to get PNG copies.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from acl_lib.processes import kill_tree

PNG_ENV = "ACL_PNG"
# Why PNG copies are off, handed from `acl run` to its kernels with ACL_PNG=0 (so the hint is printed there too).
WHY_ENV = "ACL_PNG_WHY"
PROBE_TIMEOUT_S = 90.0  # a cold Chrome start on two busy cores takes a few seconds; a hang takes forever
_PROBE = (
    "import plotly.graph_objects as go\n"
    "png = go.Figure(go.Bar(x=[1], y=[1])).to_image(format='png', width=60, height=40)\n"
    "assert png[:8] == b'\\x89PNG\\r\\n\\x1a\\n', png[:16]\n"
)
HOW_TO_GET_PNG = ("for PNG copies install a Chrome for kaleido (`plotly_get_chrome`, in this environment) "
                  "or a system Chromium (e.g. `apt install chromium`); ACL_PNG=0 turns them off")

_decided: dict[str, tuple[bool, str]] = {}


def find_chrome() -> str | None:
    """The Chrome kaleido would start, or None. ``BROWSER_PATH`` set means: only there."""
    override = os.environ.get("BROWSER_PATH")
    if override is not None:
        return override if _is_exe(override) else None
    try:
        from choreographer.browsers.chromium import Chromium
    except ImportError:  # no kaleido (it brings choreographer): no PNG export either
        return None
    try:
        path = Chromium.find_browser(skip_local=False)
    except Exception:  # a lookup that fails finds nothing
        return None
    return path if path and _is_exe(path) else None


def _is_exe(path: str) -> bool:
    p = Path(path)
    return p.is_file() and os.access(p, os.X_OK)


def probe(timeout_s: float = PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """Export one tiny figure in a child process (its own process group, killed whole at ``timeout_s``).

    Returns ``(ok, why)``; ``why`` says what failed."""
    try:
        proc = subprocess.Popen([sys.executable, "-c", _PROBE], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True, text=True)
    except OSError as exc:
        return False, f"could not start the PNG probe ({exc})"
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        return False, f"a test PNG export did not finish within {timeout_s:.0f} s"
    if proc.returncode != 0:
        last = (err or "").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        return False, f"a test PNG export failed ({last[0][:200]})"
    return True, ""


def _kill_group(proc: subprocess.Popen) -> None:
    kill_tree(proc.pid)
    proc.wait()


def decide(timeout_s: float = PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """``(png_available, why_not)`` for this process, decided once (see the module docstring)."""
    if "png" not in _decided:
        flag = os.environ.get(PNG_ENV, "").strip().lower()
        if flag in ("0", "false", "no", "off"):
            _decided["png"] = (False, os.environ.get(WHY_ENV) or f"{PNG_ENV}=0")
        elif flag in ("1", "true", "yes", "on"):
            _decided["png"] = (True, "")
        elif find_chrome() is None:
            _decided["png"] = (False, "no Chrome or Chromium found")
        else:
            _decided["png"] = probe(timeout_s)
    return _decided["png"]


def environment_for_children(timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, str]:
    """Decide once in a parent (``acl run``) and hand the answer to its kernels: ``{ACL_PNG: ..., ...}``."""
    ok, why = decide(timeout_s)
    return {PNG_ENV: "1"} if ok else {PNG_ENV: "0", WHY_ENV: why}


def hint(why: str) -> str:
    """One line for a person: PNG copies are off, why, and how to get them."""
    if why.startswith(PNG_ENV):
        return f"Figures: interactive only, no PNG copies ({why})."
    return f"Figures: interactive only, no PNG copies ({why}); {HOW_TO_GET_PNG}."
