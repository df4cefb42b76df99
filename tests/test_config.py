"""Config: profiles load and validate; overrides are typed; mistakes fail early and name the key."""

from __future__ import annotations

import pytest

from acl_lib.config import DOMAINS, Config, ConfigError, available_profiles, load_config, parse_override


def test_every_profile_loads_and_keeps_its_name():
    assert {"smoke", "mini", "paper"} <= set(available_profiles())
    for name in available_profiles():
        cfg = load_config(name)
        assert isinstance(cfg, Config) and cfg.profile == name


def test_profiles_only_change_values():
    smoke, paper = load_config("smoke"), load_config("paper")
    assert smoke.model.hidden_size < load_config("mini").model.hidden_size
    assert paper.model.base_model == "Qwen/Qwen3-8B-Base" and not paper.pretrain.enabled
    assert paper.launcher.mode == "multi_node" and paper.eval.backend == "vllm"
    assert smoke.to_dict().keys() == paper.to_dict().keys()


def test_overrides_are_parsed_as_yaml_and_validated():
    cfg = load_config("smoke", ["eval.k=4", "pipeline.curriculum=[if,math,search,ecom]",
                                "model.base_model=Qwen/Qwen3-8B-Base",
                                "pipeline.cold_start={math: true, search: false}", "grpo.learning_rate=2e-5"], seed=3)
    assert cfg.eval.k == 4 and cfg.seed == 3
    assert cfg.pipeline.curriculum == ["if", "math", "search", "ecom"]
    assert cfg.model.base_model == "Qwen/Qwen3-8B-Base"
    assert cfg.grpo.learning_rate == pytest.approx(2e-5)
    assert cfg.pipeline.cold_start == {"math": True, "search": False}
    assert load_config("smoke", {"eval.k": 2}).eval.k == 2
    assert parse_override("a.b= [1, 2]") == ("a.b", [1, 2])


@pytest.mark.parametrize(
    "override, needle",
    [
        ("no_such_key=1", "no_such_key"),
        ("eval.nope=1", "eval.nope"),
        ("eval.k=0", "eval.k"),
        ("eval.k=many", "eval.k"),
        ("eval.backend=tpu", "eval.backend"),
        ("eval=3", "eval"),
        ("eval.k.x=1", "'k' is a value"),
        ("pipeline.curriculum=[math,math]", "repeats"),
        ("pipeline.curriculum=[math,cooking]", "cooking"),
        ("novalue", "key=value"),
    ],
)
def test_mistakes_fail_early_and_say_where(override, needle):
    with pytest.raises(ConfigError) as exc:
        load_config("smoke", [override])
    assert needle in str(exc.value)


def test_unknown_key_lists_valid_keys_and_unknown_profile_lists_profiles():
    with pytest.raises(ConfigError, match="Valid keys: .*eval.k"):
        load_config("smoke", ["eval.kk=1"])
    with pytest.raises(ConfigError, match="profiles are"):
        load_config("huge")


def test_seed_dir_and_hash():
    cfg = load_config("mini", seed=2)
    # a relative output_dir is taken from the project root, wherever the notebook runs
    from acl_lib.config import project_root

    assert cfg.seed_dir() == project_root() / "outputs" / "mini" / "seed2"
    assert (project_root() / "acl_lib").is_dir() and (project_root() / "notebooks").is_dir()
    assert cfg.hash() == load_config("mini", seed=2).hash()
    other = load_config("mini", ["eval.k=3"], seed=2)
    assert other.hash() != cfg.hash() and other.hash("model") == cfg.hash("model")
    assert set(DOMAINS) == set(cfg.pipeline.curriculum)


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["sft.samples_per_task=0"], "sft.samples_per_task"),
        (["sft.samples_per_task=true"], "sft.samples_per_task"),
        (["sft.teacher_temperature=-1"], "sft.teacher_temperature"),
        (["sft.teacher_top_p=0"], "sft.teacher_top_p"),
        (["sft.teacher_top_p=1.5"], "sft.teacher_top_p"),
        (["sft.teacher=''"], "sft.teacher must be expert, base, incoming"),
        (["sft.teacher=' base'"], "without surrounding spaces"),
        (["sft.teacher=7"], "sft.teacher"),
        (["sft.teachr=base"], "unknown config key 'sft.teachr'"),
        (["sft.teacher=my-model", "sft.teacher_url=localhost:8000/v1"], "an http(s):// base URL"),
        (["sft.teacher=base", "sft.teacher_url=http://127.0.0.1:8000/v1"], "the model it serves, not 'base'"),
        (["sft.teacher=base", "sft.teacher_api_key_env=KEY"], "set sft.teacher_url too"),
        (["sft.samples_per_task=4"], "the scripted expert gives the same episode every time"),
        (["sft.teacher=base", "sft.samples_per_task=4", "sft.teacher_temperature=0"], "a greedy teacher"),
        (["pipeline.stage_overrides.search=[sft.samples_per_task=0]"], "sft.samples_per_task"),
    ],
)
def test_bad_cold_start_teachers_fail_early_and_say_why(overrides, needle):
    with pytest.raises(ConfigError) as exc:
        load_config("smoke", overrides)
    assert needle in str(exc.value)


def test_cold_start_teachers_that_validate():
    assert load_config("smoke").sft.teacher == "expert"
    cfg = load_config("smoke", ["sft.teacher=base", "sft.samples_per_task=4", "sft.teacher_top_p=0.95"])
    assert (cfg.sft.teacher, cfg.sft.samples_per_task, cfg.sft.teacher_top_p) == ("base", 4, 0.95)
    cfg = load_config("paper", ["sft.teacher=Qwen/Qwen3-32B", "sft.teacher_url=http://node2:8002/v1",
                                "sft.teacher_api_key_env=TEACHER_KEY"])
    assert cfg.sft.teacher_url == "http://node2:8002/v1" and cfg.hash("sft") != load_config("paper").hash("sft")
    assert load_config("smoke", ["sft.teacher=incoming", "sft.teacher_temperature=0"]).sft.samples_per_task == 1


def test_mini_stages_train_on_the_episodes_their_benchmark_scores():
    """Math, search and IF roll out under their in-domain benchmark's limits (eval.limits), so RL neither rewards
    answers too long to be scored nor cuts off ones the benchmark would accept."""
    from acl_lib.envs import IN_DOMAIN

    cfg = load_config("mini")
    for domain in ("math", "search", "if"):
        stage = cfg.for_stage(domain)
        turns, tokens = cfg.eval.limits_for(IN_DOMAIN[domain])
        if domain == "search":  # multi-turn: turns and tokens per turn
            assert (stage.grpo.max_turns, stage.grpo.max_new_tokens) == (turns, tokens), domain
        else:  # single-turn: one completion
            assert stage.grpo.max_completion_length == tokens, domain


@pytest.mark.parametrize("key", ["pretrain.midtrain_demos", "pretrain.mix", "pipeline.stage_overrides",
                                 "pipeline.cold_start", "mmopd.mixture", "sdft.mixture", "mle.stage_overrides",
                                 "ablations.sdft_mixture"])
def test_every_per_domain_setting_rejects_an_unknown_domain_with_one_message(key):
    value = {"pipeline.stage_overrides": "{maths: []}", "mle.stage_overrides": "{maths: []}",
             "pipeline.cold_start": "{maths: true}", "pretrain.midtrain_demos": "{maths: 1}"}.get(key, "{maths: 1.0}")
    with pytest.raises(ConfigError, match=r"unknown domain\(s\) \['maths'\]; domains are \['math', 'search'"):
        load_config("smoke", [f"{key}={value}"])
