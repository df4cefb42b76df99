"""``benchmarks/build_mini_base.py --reuse-phases``: phases 1-2 of an earlier build are taken only when every
setting but phase 3's and the tokenizer are the same."""

from pathlib import Path

import pytest
import yaml

from acl_lib.config import load_config
from acl_lib.train import pretrain
from bench_kit import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


def builder():
    return load_benchmark("build_mini_base")


def earlier_build(tmp_path: Path, cfg) -> Path:
    """A finished build's run directory: phases 1-3 (each a model and its summary) and its config."""
    src = tmp_path / "earlier" / "base"
    for d in (pretrain.WARMUP_DIR, pretrain.CORPUS_DIR, pretrain.MIDTRAIN_DIR):
        (src / d / "model").mkdir(parents=True)
        (src / d / "model" / "model.safetensors").write_bytes(b"weights of " + d.encode())
        (src / d / "model" / "tokenizer.json").write_text('{"tok": 1}')
        (src / d / "train_summary.json").write_text('{"wall_s": 1.0}')
    (src / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    return src


@pytest.fixture
def wrapped(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(pretrain, "train_pretrain", lambda cfg, model_dir, corpus, out_dir: calls.append(out_dir))
    model_dir = tmp_path / "init"
    model_dir.mkdir()
    (model_dir / "tokenizer.json").write_text('{"tok": 1}')
    return calls, model_dir


def test_phases_1_2_are_reused_when_only_phase_3_changed(wrapped, tmp_path):
    calls, model_dir = wrapped
    src = earlier_build(tmp_path, load_config("mini", ["pretrain.midtrain_steps=900"], seed=0))
    builder().reuse_phases(str(src))
    out = tmp_path / "new"
    pretrain.train_pretrain(load_config("mini", ["pretrain.midtrain_steps=1000"], seed=0), model_dir, [], out)
    assert calls == [out]
    for d in (pretrain.WARMUP_DIR, pretrain.CORPUS_DIR):
        assert (out / d / "model" / "model.safetensors").read_bytes() == b"weights of " + d.encode()
        assert (out / d / "REUSED_FROM").is_file()
    assert not (out / pretrain.MIDTRAIN_DIR).exists()  # other phase-3 settings: phase 3 is trained again


def test_phases_1_3_are_reused_when_only_the_cool_down_changed(wrapped, tmp_path):
    calls, model_dir = wrapped
    src = earlier_build(tmp_path, load_config("mini", ["pretrain.cooldown_lr=0.0002"], seed=0))
    builder().reuse_phases(str(src))
    out = tmp_path / "new"
    pretrain.train_pretrain(load_config("mini", ["pretrain.cooldown_lr=0.00005"], seed=0), model_dir, [], out)
    assert calls == [out]
    for d in (pretrain.WARMUP_DIR, pretrain.CORPUS_DIR, pretrain.MIDTRAIN_DIR):
        assert (out / d / "model" / "model.safetensors").read_bytes() == b"weights of " + d.encode()
        assert (out / d / "REUSED_FROM").is_file()


@pytest.mark.parametrize("change, needle", [(["pretrain.max_steps=7"], "pretrain.max_steps"),
                                            (["worlds.n_train=256"], "worlds.n_train")])
def test_other_phase_1_2_settings_are_refused_and_named(wrapped, tmp_path, change, needle):
    calls, model_dir = wrapped
    src = earlier_build(tmp_path, load_config("mini", [], seed=0))
    builder().reuse_phases(str(src))
    with pytest.raises(SystemExit, match=needle):
        pretrain.train_pretrain(load_config("mini", change, seed=0), model_dir, [], tmp_path / "new")
    assert calls == [] and not (tmp_path / "new").exists()


def test_another_tokenizer_is_refused(wrapped, tmp_path):
    calls, model_dir = wrapped
    src = earlier_build(tmp_path, load_config("mini", [], seed=0))
    (model_dir / "tokenizer.json").write_text('{"tok": 2}')
    builder().reuse_phases(str(src))
    with pytest.raises(SystemExit, match="another tokenizer"):
        pretrain.train_pretrain(load_config("mini", [], seed=0), model_dir, [], tmp_path / "new")
    assert calls == []


def test_an_unfinished_earlier_build_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no finished phases 1-2"):
        builder().reuse_phases(str(tmp_path / "nothing"))


def test_a_phase_without_its_summary_is_not_finished(tmp_path):
    """A phase's model without its ``train_summary.json`` (stopped between the two writes) is neither skipped on
    a restart nor taken by ``--reuse-phases``."""
    src = earlier_build(tmp_path, load_config("mini", [], seed=0))
    assert pretrain.finished_phase(src / pretrain.CORPUS_DIR) == {"wall_s": 1.0}
    (src / pretrain.CORPUS_DIR / "train_summary.json").unlink()
    assert pretrain.finished_phase(src / pretrain.CORPUS_DIR) is None
    with pytest.raises(SystemExit, match=f"no finished phase .* at {src / pretrain.CORPUS_DIR}"):
        builder().reuse_phases(str(src))


def test_every_set_flag_counts():
    """A second ``--set`` adds its overrides (it replaced the first, silently dropping settings from a build)."""
    args = builder().parse_args(["--set", "pretrain.midtrain_if_vocab=wide", "--set", "pretrain.midtrain_steps=10",
                                 "pretrain.midtrain_lr=0.001"])
    assert args.overrides == ["pretrain.midtrain_if_vocab=wide", "pretrain.midtrain_steps=10",
                              "pretrain.midtrain_lr=0.001"]


def test_from_base_takes_only_a_base_of_this_recipe_without_phase_4(monkeypatch, tmp_path):
    """``--from-base`` runs phase 4 alone from a base whose card names this recipe's phases 1-3 and whose weights
    are the card's; anything else is refused before any training."""
    import json

    from acl_lib.atomic import file_sha256

    mod = builder()
    trained = []
    monkeypatch.setattr(pretrain, "finish_cooldown", lambda cfg, src, out: trained.append(src))
    # the profile's recipe without phase 4, and a cooled recipe of it (both on the evaluated desk alone)
    plain = load_config("mini", ["pretrain.cooldown_steps=0", "pretrain.cooldown_noise=null",
                                 "pretrain.world_retail_kinds=null"], seed=0)
    cooled = load_config("mini", ["pretrain.cooldown_steps=50", "pretrain.cooldown_noise=0",
                                  "pretrain.cooldown_lr=0.001", "pretrain.world_retail_kinds=null"], seed=0)
    monkeypatch.setattr(mod, "same_phase_3_draw", lambda cfg, card: None)  # the next test's business
    src = tmp_path / "base"
    src.mkdir()
    (src / "model.safetensors").write_bytes(b"weights")
    card = {"recipe_config_hash": mod.recipe_hash(plain), "sha256": "0" * 64}
    (src / "card.json").write_text(json.dumps(card))
    with pytest.raises(SystemExit, match="not the weights its card names"):
        mod.cooldown_from_base(cooled, str(src), str(tmp_path / "out"))
    (src / "card.json").write_text(json.dumps(dict(card, recipe_config_hash="abc")))
    with pytest.raises(SystemExit, match="built by recipe abc"):
        mod.cooldown_from_base(cooled, str(src), str(tmp_path / "out"))
    with pytest.raises(SystemExit, match="no phase 4"):
        mod.cooldown_from_base(plain, str(src), str(tmp_path / "out"))
    assert trained == []
    # the hash of the phases 1-3 leaves the cool-down out; the cooled recipe's own hash is another
    assert mod.recipe_hash(mod.phases_1_3(cooled)) == card["recipe_config_hash"] != mod.recipe_hash(cooled)
    # a base of this recipe with the card's weights is taken, and phase 4 runs from it
    (src / "card.json").write_text(json.dumps(dict(card, sha256=file_sha256(src / "model.safetensors"))))
    with pytest.raises(FileNotFoundError):  # the stand-in trains nothing, so there is no model to copy
        mod.cooldown_from_base(cooled, str(src), str(tmp_path / "out"))
    assert trained == [src]


def test_a_base_built_on_a_wider_desk_is_the_same_recipe_when_phase_3_draws_the_same_episodes():
    """``pretrain.world_retail_kinds`` lets a base learn on a wider retail desk than the evaluated one: its
    pretraining corpus and mid-training episodes are those of a build whose evaluated desk is that wide, so the
    phases 1-3 hash is that build's; ``--from-base`` still refuses when phase 3 would keep or drop (as
    evaluated) other episodes than the base's card records."""
    import copy

    from acl_lib.model.corpus import base_corpus
    from acl_lib.train import midtrain

    mod = builder()
    five = "[order_status, order_total, cancel, modify_order_address, modify_user_address]"
    three = "[order_status, order_total, cancel]"
    small = ["pretrain.midtrain_demos={math: 2, search: 2, ecom: 24, if: 2}", "pretrain.corpus_chars=40000",
             "pretrain.world_seeds=[1000, 1001]"]
    wide = load_config("mini", [*small, f"worlds.retail_kinds={five}", "pretrain.world_retail_kinds=null",
                                "pretrain.cooldown_steps=0", "pretrain.cooldown_noise=null"], seed=0)
    narrow = load_config("mini", [*small, f"worlds.retail_kinds={three}", f"pretrain.world_retail_kinds={five}",
                                  "pretrain.cooldown_steps=100"], seed=0)
    narrow_only = load_config("mini", [*small, f"worlds.retail_kinds={three}", "pretrain.world_retail_kinds=null"],
                              seed=0)
    assert narrow.worlds.retail_kinds != narrow.pretraining_worlds().retail_kinds == wide.worlds.retail_kinds
    assert mod.recipe_hash(mod.phases_1_3(narrow)) == mod.recipe_hash(wide) != mod.recipe_hash(narrow)
    rows, stats = midtrain.midtrain_demos(wide)
    assert midtrain.midtrain_demos(narrow)[0] == rows != midtrain.midtrain_demos(narrow_only)[0]
    assert base_corpus(narrow)[0] == base_corpus(wide)[0] != base_corpus(narrow_only)[0]
    assert mod.same_phase_3_draw(narrow, {"midtrain": {"demos": stats}}) is None
    other = copy.deepcopy(stats)
    other["domains"]["ecom"]["dropped_as_evaluated"] += 1
    assert "phase 3 would draw" in mod.same_phase_3_draw(narrow, {"midtrain": {"demos": other}})


def test_the_mini_profile_is_the_recipe_of_the_shipped_base():
    """The shipped base's card names the mini profile's recipe (its hash), and the phases 1-3 it was built from
    (``--from-base``) are the profile's phases 1-3: editing the recipe without rebuilding the base fails here."""
    import json

    mod = builder()
    card = json.loads((ROOT / "acl_lib" / "data" / "mini_base" / "card.json").read_text())
    cfg = load_config("mini", [], seed=0)
    assert mod.recipe_hash(cfg) == card["recipe_config_hash"]
    if card.get("phases_1_3_from"):
        assert card["phases_1_3_from"].startswith(f"the base of recipe {mod.recipe_hash(mod.phases_1_3(cfg))} ")
