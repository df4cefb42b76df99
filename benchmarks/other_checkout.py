"""Run a benchmark script of this checkout against another checkout's ``acl_lib`` (old and new code side by side).

    python benchmarks/other_checkout.py /path/to/checkout benchmarks/throughput.py MODEL_DIR [args ...]

The suite is installed in editable mode, whose import hook maps ``acl_lib`` to this checkout whatever
``PYTHONPATH`` says; this drops that hook, puts the other checkout first on ``sys.path`` and runs the script as
``__main__`` (make a checkout of a commit with ``git worktree add /tmp/old <commit>``).
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    checkout, script = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    if not (checkout / "acl_lib" / "__init__.py").is_file():
        sys.exit(f"{checkout}: no acl_lib package there")
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path[:0] = [str(checkout), str(script.parent)]
    sys.argv = [str(script), *sys.argv[3:]]
    import acl_lib

    print(f"acl_lib from {Path(acl_lib.__file__).parent}", flush=True)
    runpy.run_path(str(script), run_name="__main__")
