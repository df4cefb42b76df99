"""Where forgetting lives: diagnostics over the checkpoints that the base, the sequential stages and the oracles
leave in the run store.

    checkpoints.py   which checkpoints a seed directory holds (sequential stages, oracles, cold-start SFT models)
    weights.py       task vectors, stage updates, PCA, cosines, SFT vs RL displacement: streamed Gram matrices
    tokens.py        fixed reference rollouts scored by later checkpoints: top-1 consistency by entropy bucket
    cl_metrics.py    average accuracy, backward / forward transfer, forgetting over a capability matrix

The weight and token diagnostics notebooks call these; their numbers go to
``outputs/<profile>/seed<k>/diagnostics/*.json``.
"""

import json
from pathlib import Path
from typing import TYPE_CHECKING

from acl_lib.atomic import jsonable, write_json

if TYPE_CHECKING:
    from acl_lib.config import Config

DIAG_DIR = "diagnostics"  # <seed_dir>/diagnostics/: weights.json, tokens.json, cl_metrics.json, reference/


def write_diagnostics(cfg: "Config", name: str, obj) -> Path:
    """Write ``obj`` to ``<seed_dir>/diagnostics/<name>.json`` atomically (the final tables read these files);
    returns the path. NaN and infinities become null."""
    return write_json(cfg.seed_dir() / DIAG_DIR / f"{name}.json", jsonable(obj))


def read_diagnostics(cfg: "Config", name: str):
    """The JSON a diagnostics notebook wrote (``<seed_dir>/diagnostics/<name>.json``)."""
    path = cfg.seed_dir() / DIAG_DIR / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: run the notebook that writes it (06: weights, cl_metrics; "
                                "07: tokens)")
    return json.loads(path.read_text())
