"""One world per world seed: training, evaluation and every training seed see the same world."""

from __future__ import annotations

import json

import pytest

from acl_lib.config import DOMAINS, load_config
from acl_lib.envs import STAGE_ENV
from acl_lib.eval import harness
from acl_lib.train import trl_env


def _fingerprint(env) -> str:
    """What makes a world: its test tasks and a fixed draw of its training tasks (prompts, tools, answers)."""
    tasks = env.tasks("test", 3, seed=0) + env.tasks("train", 3, seed=0)
    docs = [d["contents"] for d in getattr(env, "documents", [])[:5]]
    return json.dumps([t.to_dict() for t in tasks] + docs, sort_keys=True, default=str)


@pytest.mark.parametrize("domain", DOMAINS)
def test_training_and_evaluation_build_the_same_world_for_every_seed(domain, tmp_path):
    prints = set()
    for seed in (0, 1, 2):
        cfg = load_config("smoke", {"output_dir": str(tmp_path)}, seed=seed)
        train_world = _fingerprint(trl_env.make_env(domain, cfg))
        eval_world = _fingerprint(harness.world(cfg, STAGE_ENV[domain]))
        assert train_world == eval_world, f"{domain}, seed {seed}: training and evaluation worlds differ"
        prints.add(train_world)
    assert len(prints) == 1, f"{domain}: the training seed changed the world"
    # ... while the world seed does change it (so the check above could fail).
    other = load_config("smoke", {"output_dir": str(tmp_path), "worlds.seed": 7})
    assert _fingerprint(trl_env.make_env(domain, other)) not in prints
