"""The budget table: each run's time and training budgets read from a store, grouped by the study's steps."""

from __future__ import annotations

import json

import pytest

from acl_lib import budget


def _run(seed_dir, name, duration, elapsed=None, config="", jobs=(), same_as=None):
    d = seed_dir / name
    d.mkdir(parents=True)
    (d / "COMPLETE.json").write_text(json.dumps({"duration_s": duration}))
    if elapsed is not None:  # its evaluation: a nested run
        (d / "eval").mkdir()
        (d / "eval" / "COMPLETE.json").write_text(json.dumps({"duration_s": elapsed}))
    if same_as:
        (d / "same_as.json").write_text(json.dumps({"run": same_as}))
    (d / "config.yaml").write_text(config)
    for rel, summary in jobs:
        (d / rel).mkdir(parents=True, exist_ok=True)
        (d / rel / "train_summary.json").write_text(json.dumps(summary))
    return d


@pytest.fixture
def store(tmp_path):
    seed = tmp_path / "seed0"
    _run(seed, "base", 60.0, elapsed=30.0)
    # a stage: its cold start records no rows_per_step (read from config.yaml), its GRPO records rollouts_per_step
    _run(seed, "seq_search", 600.0, elapsed=90.0, config="sft:\n  batch_size: 4\ngrpo:\n  batch_size: 16\n",
         jobs=[("checkpoints/sft", {"job": "sft", "steps": 40, "wall_s": 100.0}),
               (".", {"job": "grpo", "steps": 80, "wall_s": 400.0, "rollouts_per_step": 16})])
    # an MLE expert: its own recipe in the header's extra line, the profile's grpo below it (not the expert's)
    _run(seed, "mle_expert_math", 120.0,
         config='# run mle_expert_math\n# extra: {"grpo": {"batch_size": 32}}\ngrpo:\n  batch_size: 64\n',
         jobs=[("checkpoints/grpo", {"job": "lora_grpo", "steps": 40, "wall_s": 110.0})])
    # a copy of another run's checkpoint: its jobs' budgets count, their time does not
    _run(seed, "oracle_search", 1.0, elapsed=2.0, config="grpo:\n  batch_size: 16\n", same_as="seq_search",
         jobs=[(".", {"job": "grpo", "steps": 80, "wall_s": 400.0, "rollouts_per_step": 16})])
    (seed / "seq_ecom").mkdir()  # not complete: left out
    return seed


def test_runs_read_their_time_and_budgets(store):
    rows = {r["run"]: r for r in budget.run_rows(store)}
    assert set(rows) == {"base", "seq_search", "mle_expert_math", "oracle_search"}
    s = rows["seq_search"]
    assert s["step"] == "01-04 the sequential stages" and s["wall_s"] == 690.0 and s["eval_s"] == 90.0
    assert s["train_s"] == 500.0 and s["rl_s"] == 400.0
    assert s["rollouts"] == 80 * 16 and s["rows_seen"] == 40 * 4
    assert rows["mle_expert_math"]["rollouts"] == 40 * 32  # the expert's recipe, not the profile's 64
    assert rows["mle_expert_math"]["step"] == "11 MLE" and rows["base"]["rollouts"] is None
    o = rows["oracle_search"]
    assert o["same_as"] == "seq_search" and o["train_s"] == 0 and o["wall_s"] == 3.0 and o["rollouts"] == 1280
    assert budget.rl_budgets(rows.values()) == {"seq_search": 1280, "mle_expert_math": 1280, "oracle_search": 1280}


def test_parts_are_shares_of_the_seed_averaged_over_seeds(store, tmp_path):
    other = tmp_path / "seed1"
    _run(other, "base", 180.0)
    _run(other, "seq_search", 900.0)
    parts = budget.part_rows([budget.run_rows(store), budget.run_rows(other)])
    by = {p["part"]: p for p in parts}
    assert [p["part"] for p in parts] == ["00 the base model", "01-04 the sequential stages", "05 the oracles",
                                          "11 MLE", "total"]
    assert by["00 the base model"]["wall_s"] == (90.0 + 180.0) / 2  # seed 0's base: 60 s + its 30 s evaluation
    assert by["11 MLE"]["wall_s"] == 60.0  # 120 in one seed, none in the other
    assert by["01-04 the sequential stages"]["wall_s"] == (690.0 + 900.0) / 2
    assert by["total"]["wall_s"] == 135.0 + 795.0 + 1.5 + 60.0
    assert by["01-04 the sequential stages"]["share"] == pytest.approx(795.0 / 991.5)
    assert sum(p["share"] for p in parts[:-1]) == pytest.approx(1.0)
    table = budget.budget_markdown(parts, budget.rl_budgets(budget.run_rows(store)), n_seeds=2)
    assert "| 01-04 the sequential stages | 13.2 | 80% |" in table and "| seq_search | 1,280 |" in table
    with pytest.raises(ValueError, match="no complete runs"):
        budget.part_rows([[]])


def test_a_runs_extra_recipe_is_written_beside_its_config(tmp_path):
    """What a run is keyed on beyond the config (an MLE expert's own grpo section) is in its config.yaml header,
    where the budget table reads it; the file still parses as the resolved config."""
    import yaml

    from acl_lib.config import load_config
    from acl_lib.runs import Run, run_once

    cfg = load_config("smoke", overrides={"output_dir": str(tmp_path)})
    run = Run(cfg, "mle_expert_math", sections=("grpo",), extra={"grpo": {"batch_size": 32}})
    run_once(run, lambda r: None)
    text = (run.path / "config.yaml").read_text()
    assert '# extra: {"grpo": {"batch_size": 32}}' in text
    assert yaml.safe_load(text)["grpo"]["batch_size"] == cfg.grpo.batch_size
    assert budget._section_above(run.path / "x" / "train_summary.json", run.path, "grpo") == {"batch_size": 32}


def test_the_mini_consolidations_get_the_studys_proportions():
    """Issue 62 item 3 as configured: every MLE expert at least its oracle's RL rollouts, MMOPD at least one stage's
    GRPO rollouts, SDFT at least 64 prompts x 8 samples per oracle with its held-out stopping on."""
    from acl_lib.config import load_config
    from acl_lib.report import configured_rollouts

    cfg = load_config("mini")
    r = configured_rollouts(cfg)
    for d in cfg.pipeline.curriculum:
        assert r[f"mle_expert_{d}"] >= r[f"oracle_{d}"] > 0, d
    assert r["mmopd"] >= min(r[f"seq_{d}"] for d in cfg.pipeline.curriculum)
    assert cfg.sdft.n_prompts >= 64 and cfg.sdft.group_size >= 8 and cfg.sdft.heldout_fraction > 0
