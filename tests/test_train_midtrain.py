"""Mid-training (phase 3 of the small base): its data never holds an evaluated task or entity, and the phase runs.

The leakage test draws the mid-training mixture the mini profile ships with (scaled to its configured size when
that is small enough, else a fixed sample of every domain) and checks it against every task the suite scores on
the evaluated world (world seed ``worlds.seed``): no equal prompt, no customer e-mail, user id or order id of the
evaluated retail world's gold actions, no question of the evaluated search world, and no document stating an
evaluated search fact (its subject's document with the gold answer).
"""

from __future__ import annotations

import json
import re

import pytest

from acl_lib.config import load_config
from acl_lib.envs import make_env
from acl_lib.train import midtrain

SAMPLE = "pretrain.midtrain_demos={math: 96, search: 64, ecom: 32, if: 96}"


def _text(row: dict) -> str:
    return json.dumps(row["messages"], ensure_ascii=False)


def _strings(x):
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _strings(v)
    elif isinstance(x, list):
        for v in x:
            yield from _strings(v)


@pytest.mark.slow
def test_midtrain_data_shares_no_task_or_entity_with_the_evaluated_world():
    cfg = load_config("mini", ["pretrain.midtrain_steps=1", SAMPLE], seed=0)
    rows, stats = midtrain.midtrain_demos(cfg)
    assert {d: s["kept"] for d, s in stats["domains"].items()} == {"math": 96, "search": 64, "ecom": 32, "if": 96}
    assert cfg.worlds.seed not in stats["world_seeds"]
    texts = [_text(r) for r in rows]
    blob = "\n".join(texts)

    # no evaluated prompt (any benchmark, in-domain or OOD) is a prompt of the mid-training data
    evaluated = midtrain.evaluated_prompts(cfg)
    prompts = {m["content"] for r in rows for m in r["messages"] if m["role"] == "user"}
    assert len(evaluated) > 100
    assert not prompts & evaluated

    # retail: the evaluated customers and orders (every id and e-mail in the gold actions) never appear
    retail = make_env("retail", cfg.worlds, seed=cfg.worlds.seed)
    ids = {s for t in retail.tasks("test", cfg.worlds.n_test, seed=cfg.worlds.seed)
           for a in t.answer["actions"] for s in _strings(a["arguments"])
           if "@" in s or s.startswith("#W") or re.fullmatch(r"[a-z]+_[a-z]+_\d+", s)}
    assert len(ids) >= cfg.worlds.n_test  # the pattern above does find them
    assert not [s for s in ids if s in blob]

    # search: no evaluated question, and no document that states an evaluated fact
    search = make_env("search", cfg.worlds, seed=cfg.worlds.seed)
    for t in search.tasks("test", cfg.worlds.n_test, seed=cfg.worlds.seed):
        assert t.user_prompt not in blob
        subject = t.meta["hops"][0]["subject"]
        for doc in re.findall(r'\(Title: "' + re.escape(subject) + r'"\)[^\n"]*', blob):
            assert not any(ans in doc for ans in t.answer), (subject, t.answer, doc)


def test_wide_if_vocabulary_rows_copy_the_prompts_words_and_leave_the_recipe_hash_alone():
    """pretrain.midtrain_if_vocab: wide draws the IF rows on acl_lib.envs.instruct.WIDE_NOUNS (none a held-out
    word): their topics are those words, the expert's answers carry them, no evaluated prompt is among them; at its
    default ("world") the key stays out of the recipe's hash (the shipped base's card matches it)."""
    from acl_lib.envs.instruct import TOPICS

    cfg = load_config("mini", ["pretrain.midtrain_steps=1", "pretrain.midtrain_demos={if: 48}",
                               "pretrain.midtrain_if_vocab=wide"], seed=0)
    rows, stats = midtrain.midtrain_demos(cfg)
    assert stats["domains"]["if"]["kept"] == 48
    prompts = [m["content"] for r in rows for m in r["messages"] if m["role"] == "user"]
    topics = [t for p in prompts for t in TOPICS["wide"] if f" {t}" in p]
    assert len(set(topics)) >= 30 and not set(prompts) & midtrain.evaluated_prompts(cfg)
    answers = "\n".join(m["content"] for r in rows for m in r["messages"] if m["role"] == "assistant")
    assert sum(t.split()[-1] in answers for t in set(topics)) >= 0.9 * len(set(topics))
    world = load_config("mini", ["pretrain.midtrain_if_vocab=world"], seed=0)
    assert world.hash("pretrain") == load_config("mini", seed=0).hash("pretrain") != cfg.hash("pretrain")
    assert "midtrain_if_vocab" not in world.to_dict()["pretrain"]


def test_midtrain_refuses_the_evaluated_world_and_unknown_domains():
    with pytest.raises(ValueError, match="unknown domain"):
        load_config("mini", ["pretrain.midtrain_demos={cooking: 3}"], seed=0)
    with pytest.raises(ValueError, match=">= 0"):
        load_config("mini", ["pretrain.midtrain_demos={math: -1}"], seed=0)
    cfg = load_config("mini", ["pretrain.midtrain_steps=0", "pretrain.midtrain_demos={math: 3}",
                             "pretrain.cooldown_steps=0"], seed=0)
    assert not midtrain.enabled(cfg)


@pytest.mark.slow
def test_pretrain_with_a_midtraining_phase_trains_on_assistant_tokens_and_resumes(tmp_path):
    """Smoke profile: the three phases run; phase 3's model becomes the base; a restart redoes nothing."""
    from acl_lib.pipeline import build_base
    from acl_lib.train.common import read_log

    cfg = load_config("smoke", [f"output_dir={tmp_path}", "pretrain.midtrain_steps=3", "pretrain.midtrain_batch_size=2",
                                "pretrain.midtrain_demos={math: 4, search: 2, ecom: 1, if: 2}"], seed=0)
    model_dir = build_base(cfg, evaluate=False)
    base = tmp_path / "smoke" / "seed0" / "base"
    mid = base / "checkpoints" / "midtrain"
    assert (mid / "model" / "model.safetensors").is_file()
    assert (base / "checkpoints" / "corpus" / "model" / "model.safetensors").is_file()
    same = (mid / "model" / "model.safetensors").read_bytes() == (base / "model" / "model.safetensors").read_bytes()
    assert same and str(base / "model") == model_dir
    summary = json.loads((base / "train_summary.json").read_text())
    assert summary["midtrain"]["demos"]["rows"] == 9 and summary["midtrain"]["steps"] == 3
    assert len([r for r in read_log(mid / "train_log.jsonl") if "loss" in r]) >= 1
    # what phase 3 trained on is kept beside it, each row an episode with the expert's turns
    rows = midtrain.read_demos(mid)
    assert len(rows) == 9 and all(any(m["role"] == "assistant" for m in r["messages"]) for r in rows)
    # a restart after phase 3 finished trains nothing more and gives the same model
    from acl_lib.train.pretrain import finish_midtrain

    n_log = len(read_log(mid / "train_log.jsonl"))
    again = finish_midtrain(cfg, base / "checkpoints" / "corpus" / "model", base)
    assert again["steps"] == 3 and len(read_log(mid / "train_log.jsonl")) == n_log
    assert (base / "model" / "model.safetensors").read_bytes() == (mid / "model" / "model.safetensors").read_bytes()


def test_midtraining_batches_rows_of_similar_length(tmp_path):
    """The mixture holds 100-token math rows and 2,000-token retail rows: mid-training groups them by length
    instead of padding every batch to its longest row."""
    from acl_lib.train.sft import sft_args

    cfg = midtrain.midtrain_config(load_config("smoke", ["pretrain.midtrain_steps=2", "pretrain.midtrain_lr=0.002"]))
    assert cfg.sft.max_steps == 2 and cfg.sft.learning_rate == 0.002 and cfg.sft.share_prefix
    assert sft_args(cfg, tmp_path, by_length=True).train_sampling_strategy == "group_by_length"
    assert sft_args(cfg, tmp_path).train_sampling_strategy == "random"
    with pytest.raises(ValueError, match="not both"):
        sft_args(cfg, tmp_path, sequential=True, by_length=True)


def test_the_model_card_describes_phase_3():
    """A base built with mid-training says so on its card: the mixture kept, the budget, the dropped prompts."""
    from acl_lib.model.shipped import read_card, render_card

    cfg = load_config("mini", ["pretrain.midtrain_steps=300", "pretrain.midtrain_batch_size=8"], seed=0)
    card = read_card(cfg)
    shipped = render_card(card)  # the shipped base was mid-trained with the profile's mixture
    assert "Phase 3, mid-training: 1840 steps x 8 rows" in shipped and "(math 4250, search 2400" in shipped
    card = dict(card, midtrain=None)
    assert "Phase 3" not in render_card(card)  # a base without phase 3 says nothing of it
    card = dict(card, config=dict(card["config"], pretrain=cfg.to_dict()["pretrain"]))
    card["midtrain"] = {"wall_s": 600.0, "steps": 300, "tokens_seen": 1_234_567, "demos": {
        "world_seeds": [1000, 1001], "domains": {"math": {"kept": 400, "dropped_as_evaluated": 0},
                                                 "ecom": {"kept": 300, "dropped_as_evaluated": 29}}}}
    text = render_card(card)
    assert "Phase 3, mid-training: 300 steps x 8 rows" in text and "(math 400, ecom 300;" in text
    assert "dropped: 29" in text and "1,234,567 tokens" in text and "phase 3 10.0 min" in text


@pytest.mark.slow
def test_a_cooldown_phase_follows_midtraining_and_becomes_the_base(tmp_path):
    """Smoke profile: phase 4 trains the corpus from phase 3's model; its model becomes the base, phase 3's is
    kept; a restart redoes nothing."""
    from acl_lib.pipeline import build_base
    from acl_lib.train.common import read_log
    from acl_lib.train.pretrain import COOLDOWN_DIR, finish_cooldown

    cfg = load_config("smoke", [f"output_dir={tmp_path}", "pretrain.midtrain_steps=2", "pretrain.midtrain_batch_size=2",
                                "pretrain.midtrain_demos={math: 2, if: 2}", "pretrain.cooldown_steps=3",
                                "pretrain.cooldown_lr=0.001"], seed=0)
    build_base(cfg, evaluate=False)
    base = tmp_path / "smoke" / "seed0" / "base"
    cool, mid = base / COOLDOWN_DIR, base / "checkpoints" / "midtrain"
    weights = {d: (d / "model" / "model.safetensors").read_bytes() for d in (base, cool, mid)}
    assert weights[base] == weights[cool] and weights[cool] != weights[mid]
    log = [r for r in read_log(cool / "train_log.jsonl") if "loss" in r]
    assert log and all(r["phase"] == "cooldown" for r in log) and log[-1]["step"] == 3
    summary = json.loads((base / "train_summary.json").read_text())
    assert summary["cooldown"]["steps"] == 3 and summary["midtrain"]["steps"] == 2
    n_log = len(read_log(cool / "train_log.jsonl"))
    assert finish_cooldown(cfg, mid / "model", base)["steps"] == 3
    assert len(read_log(cool / "train_log.jsonl")) == n_log


def test_a_cooldown_needs_a_midtraining_phase_and_leaves_older_recipe_hashes_alone():
    from acl_lib.config import ConfigError

    with pytest.raises(ConfigError, match="cooldown_steps=4 needs a mid-training phase"):
        load_config("smoke", ["pretrain.cooldown_steps=4"], seed=0)
    at_defaults = ["pretrain.cooldown_steps=0", "pretrain.cooldown_noise=null", "pretrain.world_retail_kinds=null"]
    plain = load_config("mini", at_defaults, seed=0).to_dict()["pretrain"]
    # keys added later are out of the dump at their defaults: the hashes of bases built before them still hold
    assert not {"cooldown_steps", "cooldown_lr", "cooldown_noise", "world_retail_kinds"} & set(plain)
    cooled = load_config("mini", [*at_defaults, "pretrain.cooldown_steps=100"], seed=0).to_dict()["pretrain"]
    assert cooled["cooldown_steps"] == 100 and "cooldown_lr" not in cooled


def test_the_model_card_describes_phase_4():
    from acl_lib.model.shipped import read_card, render_card

    cfg = load_config("mini", ["pretrain.cooldown_steps=100", "pretrain.cooldown_noise=0"], seed=0)
    card = read_card(cfg)
    card = dict(card, config=dict(card["config"], pretrain=cfg.to_dict()["pretrain"]),
                cooldown={"steps": 100, "wall_s": 300.0, "tokens_seen": 819_200})
    text = render_card(card)
    assert "Phase 4, cool-down: 100 steps x 16 x 512 tokens" in text and "noise at 0" in text
    assert "lr 0.0002 cosine, 819,200 tokens" in text and "phase 4 5.0 min" in text
    assert "Phase 4" not in render_card(dict(card, cooldown=None))
