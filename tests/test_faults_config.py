"""Fault suite, configuration (issue 11, defect 7): values that used to pass validation and failed minutes
later, or were silently changed, now fail at load time with a message that names the key."""

from __future__ import annotations

import pytest

from acl_lib.config import ConfigError, load_config


@pytest.mark.parametrize(
    "override, needle",
    [
        # a curriculum the sequential steps cannot run (they run stages 1-4): failed after the base was built
        ("pipeline.curriculum=[]", "sequential steps run stages 1-4"),
        ("pipeline.curriculum=[math,search,ecom]", "all 4 stages"),
        # the profile is --profile's: --set profile=paper wrote smoke-sized runs under outputs/paper/
        ("profile=paper", "--profile"),
        # a malformed YAML value was kept as text
        ("model.base_model={", "not valid YAML"),
        ("pipeline.curriculum=[math, search", "not valid YAML"),
        # lenient types: true became 1, .inf and .nan were numbers
        ("eval.k=true", "eval.k: must be an integer"),
        ("eval.k=4.0", "eval.k: must be an integer"),
        ("grpo.learning_rate=.inf", "grpo.learning_rate: must be a finite number"),
        ("grpo.learning_rate=.nan", "grpo.learning_rate: must be a finite number"),
        ("pretrain.noise=-.inf", "pretrain.noise: must be a finite number"),
        ("pretrain.mix={math: .inf}", "pretrain.mix: must be a finite number"),
        ("model.tie_word_embeddings=1", "model.tie_word_embeddings: must be true or false"),
        ("launcher.zero_stage=true", "launcher.zero_stage"),
        ("worlds.math_levels={train: [1, 1, 1, true], test: [1, 1, 1, 1]}", "worlds.math_levels"),
        # a stage cannot move its runs elsewhere
        ("pipeline.stage_overrides={ecom: [profile=paper]}", "where runs are stored"),
        ("pipeline.stage_overrides={ecom: [seed=3]}", "where runs are stored"),
    ],
)
def test_bad_values_fail_at_load_time_naming_the_key(override, needle):
    with pytest.raises(ConfigError) as exc:
        load_config("smoke", [override], seed=0)
    assert needle in str(exc.value)


def test_a_seed_set_twice_is_refused_and_the_same_seed_is_fine():
    with pytest.raises(ConfigError, match="--seed"):
        load_config("smoke", ["seed=3"], seed=0)
    assert load_config("smoke", ["seed=3"], seed=3).seed == 3
    assert load_config("smoke", ["seed=3"]).seed == 3  # no seed argument: --set decides (acl config)


def test_valid_values_still_load():
    cfg = load_config("smoke", ["grpo.learning_rate=2e-5", "pretrain.mix={math: 1, if: 0.5}", "eval.k=3",
                                "pipeline.curriculum=[if,math,search,ecom]", "model.base_model='{'"])
    assert cfg.grpo.learning_rate == pytest.approx(2e-5) and isinstance(cfg.grpo.learning_rate, float)
    assert cfg.pretrain.mix == {"math": 1.0, "if": 0.5} and cfg.eval.k == 3
    assert cfg.model.base_model == "{"  # quoted: the text is meant
    for profile in ("smoke", "mini", "paper"):
        load_config(profile)


def test_a_bad_stage_override_names_its_key_without_dumping_the_config():
    with pytest.raises(ConfigError) as exc:
        load_config("smoke", ['pipeline.stage_overrides={ecom: ["grpo.max_steps=abc"]}'])
    msg = str(exc.value)
    assert "pipeline.stage_overrides.ecom" in msg and "grpo.max_steps: must be an integer" in msg
    # the old message was an empty key followed by the whole config tree
    assert "papermill_dir" not in msg and "launcher" not in msg and len(msg) < 400, msg
    assert "\n  : " not in msg
