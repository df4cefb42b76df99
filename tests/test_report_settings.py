"""Tables that show a config value print it as configured, whatever the notebooks' display precision (one
decimal, for scores): a learning rate of 0.001 must not read 0.0."""

from __future__ import annotations

import pandas as pd

from acl_lib import views
from acl_lib.config import load_config, setting_text
from acl_lib.consolidate.merging import merge_specs, specs_frame


def test_recipe_table_of_a_mini_stage_shows_learning_rates_as_configured():
    cfg = load_config("mini", [])
    with pd.option_context("display.precision", 1):
        frame = views.recipe_frame(cfg, "math")
        text, html = frame.to_string(), frame.to_html()
    sft_lr = cfg.for_stage("math").sft.learning_rate
    assert sft_lr == 0.001  # the mini profile's math cold start; if it changes, change this line too
    for shown in (text, html):
        assert "0.001" in shown
        assert setting_text(cfg.for_stage("math").grpo.learning_rate) in shown
    assert frame.loc["sft.learning_rate", "value"] == "0.001"


def test_setting_text_keeps_small_and_exact_values():
    assert [setting_text(v) for v in (0.001, 5e-05, 0.25, True, None, 800)] == ["0.001", "5e-05", "0.25", "True",
                                                                                "None", "800"]


def test_merge_table_shows_densities_as_configured():
    cfg = load_config("mini", [])
    specs = [s for s in merge_specs(cfg, ties_density=0.25, dare_density=0.05) if s.method != "task_arithmetic"]
    assert {s.density for s in specs} == {0.25, 0.05}
    with pd.option_context("display.precision", 1):
        text = specs_frame(specs).to_string()
    assert "0.25" in text and "0.05" in text
