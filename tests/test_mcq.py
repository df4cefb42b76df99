"""Multiple-choice OOD sets of the math domain: letter extraction, generated sets, GPQA / MMLU-Redux loaders."""

from __future__ import annotations

import collections
import random
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from acl_lib.config import WorldsConfig
from acl_lib.envs import mcq
from acl_lib.envs.math import MathEnv, scripted_expert, solution_text, wrong_solution_text
from acl_lib.envs.mcq import LETTERS, extract_choice, is_correct_choice

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize(
    "response, expected",
    [
        ("Answer: B", "B"),
        ("Answer:C", "C"),
        ("answer: d", "D"),  # lower-case letter alone on the line
        ("The answer is (C).", "C"),
        ("the answer is B because 2 * 3 = 6", "B"),
        ("So the answer is: A", "A"),
        ("The correct option is D", "D"),
        ("**Answer: (b)**", "B"),  # bracketed lower-case letter
        ("Answer: $\\boxed{D}$", "D"),
        ("Answer: \\textbf{A}", "A"),
        ("Answer: (A) 12 m", "A"),
        ("Answer: C) 12 m", "C"),
        ("Answer: A. Wait, actually the answer is C.", "C"),  # last match wins, even on one line
        ("Answer: B\nHmm.\nAnswer: D\n", "D"),
        ("The answer is a prime number, so", None),  # lower-case article, not a choice
        ("the answer is Always B", None),  # 'A' followed by a letter is a word
        ("Answer: I think it is B", None),
        ("Answer: E", None),  # only four options
        ("Answer: 42", None),
        ("B", None),  # a bare letter is no answer statement
        ("", None),
    ],
)
def test_extract_choice(response, expected):
    assert extract_choice(response) == expected


def test_is_correct_choice():
    assert is_correct_choice("... Answer: b", "B")
    assert is_correct_choice("The answer is (C)", " c ")
    assert not is_correct_choice("Answer: B", "C")
    assert not is_correct_choice("", "A")
    assert not is_correct_choice("Answer: A", "")
    assert not is_correct_choice("Answer: A", "Z")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.text(max_size=3))
def test_fuzz_never_raises(response, gold):
    got = extract_choice(response)
    assert got is None or got in LETTERS
    assert isinstance(is_correct_choice(response, gold), bool)


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="aA:"), max_size=200), st.sampled_from(LETTERS),
       st.sampled_from(["Answer: {x}", "The answer is ({x}).", "the answer is {x}", "Answer:{x}", "**Answer:** {x}"]))
def test_fuzz_forms(prefix, letter, form):
    text = prefix + "\n" + form.format(x=letter) + " \n"
    assert extract_choice(text) == letter


@pytest.mark.parametrize("split", ["gpqa", "mmlu_redux"])
def test_generated_sets(split):
    env = MathEnv(seed=1)
    tasks = env.tasks(split, 240, seed=0)
    assert [t.to_dict() for t in tasks] == [t.to_dict() for t in MathEnv(seed=1).tasks(split, 240, seed=0)]
    assert [t.id for t in tasks] != [t.id for t in MathEnv(seed=2).tasks(split, 240, seed=0)]
    assert len({t.user_prompt for t in tasks}) == 240
    assert {t.meta["family"] for t in tasks} == set(mcq.FAMILIES[split])
    counts = collections.Counter(t.answer for t in tasks)
    assert set(counts) == set(LETTERS) and min(counts.values()) > 240 * 0.15  # shuffled, not always A
    for t in tasks:
        opts = t.meta["options"]
        assert len(opts) == 4 and len(set(opts)) == 4
        assert t.benchmark == split and t.domain == "math" and t.meta["format"] == "mcq"
        for i, letter in enumerate(LETTERS):  # the prompt lists A-D
            assert f"\n{letter}) {opts[i]}" in t.user_prompt
        if t.meta["family"] not in ("syllogism", "prime", "largest"):
            # numeric families: the explanation ends on the gold option's value
            value = re.sub(r"[^\d]", " ", opts[LETTERS.index(t.answer)]).split()[0]
            assert re.search(rf"\b{value}\b", t.meta["explanation"])


def test_gold_is_really_right_for_checkable_families():
    for t in MathEnv().tasks("mmlu_redux", 300):
        opts, gold = t.meta["options"], LETTERS.index(t.answer)
        if t.meta["family"] == "prime":
            is_prime = [all(int(o) % d for d in range(2, int(o))) for o in opts]
            assert is_prime == [i == gold for i in range(4)]
        if t.meta["family"] == "largest":
            vals = [eval(o) for o in opts]  # "a * b" strings we generated ourselves
            assert vals.index(max(vals)) == gold and vals.count(max(vals)) == 1


def test_expert_and_wrong_solutions():
    env, rng = MathEnv(), random.Random(0)
    for split in ("gpqa", "mmlu_redux"):
        for t in env.tasks(split, 60):
            ep = env.start(t)
            ep.step(scripted_expert(t, ep.messages))
            assert ep.reward() == 1.0
            assert solution_text(t).endswith(f"Answer: {t.answer}")
            ep = env.start(t)
            ep.step(wrong_solution_text(t, rng))
            assert ep.reward() == 0.0 and ep.failure.startswith("wrong answer: got ")
            ep = env.start(t)
            ep.step("I am not sure.")
            assert ep.reward() == 0.0 and ep.failure.startswith("no Answer:")


def test_real_gpqa_loader():
    env = MathEnv(WorldsConfig(data_dir=str(DATA)), seed=0)
    tasks = env.tasks("gpqa", 100)
    correct = {"recA1x": "20 m", "recB2y": "Nitrogen", "recC3z": "46", "recD4w": "0.50"}
    assert [t.id for t in tasks] == ["gpqa-recA1x", "gpqa-recB2y", "gpqa-recC3z", "gpqa-recD4w"]
    # cells are text as written: "0.50" is not turned into 0.5, "None" is not turned into a missing value
    assert sorted(tasks[3].meta["options"]) == ["0.25", "0.50", "1.0", "None"]
    for t in tasks:
        assert t.meta["options"][LETTERS.index(t.answer)] == correct[t.meta["record_id"]]
        assert "Incorrect" not in t.user_prompt and t.user_prompt.endswith(t.meta["options"][3])
    assert "negligible.\nTaking g" in tasks[0].user_prompt  # a multi-line quoted CSV field survives
    # deterministic per world seed; another world seed reshuffles at least one question
    assert [t.answer for t in MathEnv(WorldsConfig(data_dir=str(DATA)), seed=0).tasks("gpqa", 100)] == \
        [t.answer for t in tasks]
    worlds = WorldsConfig(data_dir=str(DATA))
    orders = {tuple(tuple(t.meta["options"]) for t in MathEnv(worlds, seed=s).tasks("gpqa", 9)) for s in range(6)}
    assert len(orders) > 1


def test_real_mmlu_redux_loader_drops_flagged_rows():
    env = MathEnv(WorldsConfig(data_dir=str(DATA)))
    tasks = env.tasks("mmlu_redux", 100)
    # 5 rows; "wrong_groundtruth" and "bad_question_clarity" rows are excluded
    assert [t.meta["question"] for t in tasks] == [
        "What is 15% of 80?", "Which of the following is a prime number?",
        "If all squares are rectangles and ABCD is a square, which must be true?"]
    assert [t.answer for t in tasks] == ["B", "C", "B"]
    assert [t.meta["subject"] for t in tasks] == ["elementary_mathematics", "elementary_mathematics", "formal_logic"]
    assert "B) 12\n" in tasks[0].user_prompt
    assert len(env.tasks("mmlu_redux", 2, seed=3)) == 2
