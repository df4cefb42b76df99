"""Instruction-following domain: IFEval verifier semantics, loose mode, scores, generator, loader, expert."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acl_lib.config import WorldsConfig
from acl_lib.envs.base import Task
from acl_lib.envs.ifeval_checks import (
    IFEVAL_IDS,
    OOD_IDS,
    VERIFIERS,
    check_instruction,
    check_instruction_loose,
    count_bullets,
    count_sentences,
    count_words,
    ifeval_scores,
    split_sentences,
    validate_instruction,
)
from acl_lib.envs.instruct import (
    GENERATED_IFEVAL_IDS,
    TOPICS,
    InstructEnv,
    compatible,
    load_ifeval_jsonl,
    scripted_expert,
)
from ifeval_kit import KWARGS

DATA = Path(__file__).parent / "data"


def ok(iid, kwargs, response, prompt=None):
    return check_instruction(iid, kwargs, response, prompt)


# ---------------------------------------------------------------- keywords


def test_keywords_existence():
    kw = {"keywords": ["lantern", "Maple"]}
    assert ok("keywords:existence", kw, "A LANTERN hung from the maple tree.")
    assert not ok("keywords:existence", kw, "A lantern hung from the oak tree.")
    # IFEval uses re.search without word boundaries: a substring counts
    assert ok("keywords:existence", {"keywords": ["art"]}, "Let us start.")


def test_keywords_frequency_relations():
    at_least = {"keyword": "cat", "frequency": 2, "relation": "at least"}
    less = {"keyword": "cat", "frequency": 2, "relation": "less than"}
    assert ok("keywords:frequency", at_least, "Cat and cat.")
    assert not ok("keywords:frequency", at_least, "One cat only.")
    assert ok("keywords:frequency", less, "One cat only.")
    assert not ok("keywords:frequency", less, "Cat and CAT.")  # case-insensitive, 2 is not < 2
    assert ok("keywords:frequency", at_least, "catalog category")  # substring matches, as IFEval


def test_forbidden_words_use_word_boundaries():
    kw = {"forbidden_words": ["good", "nice"]}
    assert ok("keywords:forbidden_words", kw, "Goodness is a virtue.")
    assert not ok("keywords:forbidden_words", kw, "It was GOOD.")
    assert not ok("keywords:forbidden_words", kw, "a nice day")


def test_letter_frequency_counts_lowercased_text():
    at_least = {"letter": "e", "let_frequency": 3, "let_relation": "at least"}
    less = {"letter": "E", "let_frequency": 3, "let_relation": "less than"}
    assert ok("keywords:letter_frequency", at_least, "EEe")
    assert not ok("keywords:letter_frequency", at_least, "ee")
    assert ok("keywords:letter_frequency", less, "Ee")
    assert not ok("keywords:letter_frequency", less, "eEe")


# ---------------------------------------------------------------- length


def test_word_count_is_regexp_w_plus():
    assert count_words("Hello, world! It's 3.5 o'clock.") == 8
    less = {"num_words": 3, "relation": "less than"}
    at_least = {"num_words": 3, "relation": "at least"}
    assert ok("length_constraints:number_words", less, "one two")
    assert not ok("length_constraints:number_words", less, "one two three")  # strict <
    assert ok("length_constraints:number_words", at_least, "one two three")  # >=
    assert not ok("length_constraints:number_words", at_least, "one two")


def test_sentence_splitter_approximates_punkt():
    assert count_sentences("Hello there. How are you? Great!") == 3
    assert count_sentences("Dr. Smith went to Washington. He met Mr. Jones.") == 2
    assert count_sentences("We saw the U.S. team play. It was fun.") == 2
    assert count_sentences("no punctuation at all") == 1
    assert count_sentences("one line\nanother line") == 1  # newlines alone never split
    assert count_sentences("It costs 3.5 dollars. Fine.") == 2
    assert count_sentences("Wait... what happened?") == 1
    assert count_sentences("He said \"stop.\" Then he left.") == 2
    assert count_sentences("") == 0
    assert split_sentences("A. B.") == ["A. B."]  # single-letter initials do not end a sentence
    assert count_sentences("We sat in the sun. It was warm. The answer is no. Yes.") == 4
    assert count_sentences("The value is 3.5. Next we add 2. then more.") == 2
    assert count_sentences("See e.g. the docs. Visit example.com. Done.") == 3


def test_number_sentences_relations():
    text = "One. Two. Three."
    assert ok("length_constraints:number_sentences", {"num_sentences": 3, "relation": "at least"}, text)
    assert not ok("length_constraints:number_sentences", {"num_sentences": 4, "relation": "at least"}, text)
    assert ok("length_constraints:number_sentences", {"num_sentences": 4, "relation": "less than"}, text)
    assert not ok("length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"}, text)


def test_number_paragraphs_markdown_divider():
    kw = {"num_paragraphs": 3}
    assert ok("length_constraints:number_paragraphs", kw, "a\n***\nb\n***\nc")
    assert ok("length_constraints:number_paragraphs", kw, "***\na\n***\nb\n***\nc\n***")  # edge dividers ignored
    assert not ok("length_constraints:number_paragraphs", kw, "a\n***\nb")
    assert not ok("length_constraints:number_paragraphs", kw, "a\n***\n\n***\nb\n***\nc")  # empty middle paragraph
    assert not ok("length_constraints:number_paragraphs", kw, "a\n\nb\n\nc")  # blank lines are not dividers


def test_nth_paragraph_first_word():
    kw = {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "Then"}
    assert ok("length_constraints:nth_paragraph_first_word", kw, "First part.\n\nThen, the second part.")
    assert ok("length_constraints:nth_paragraph_first_word", kw, "First part.\n\n\"then\" came.")
    assert not ok("length_constraints:nth_paragraph_first_word", kw, "First part.\n\nNext the second part.")
    assert not ok("length_constraints:nth_paragraph_first_word", kw, "A.\n\nThen b.\n\nC.")  # 3 paragraphs
    assert not ok("length_constraints:nth_paragraph_first_word", kw, "Only one paragraph.")


# ---------------------------------------------------------------- content / format


def test_postscript_markers():
    assert ok("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hi.\n\nP.S. see you")
    assert ok("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hi.\np. s. lowercase works")
    assert not ok("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hi. PS no dots")
    assert ok("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Hi.\nP.P.S more")
    assert not ok("detectable_content:postscript", {"postscript_marker": "P.P.S"}, "Hi.\nP.S. only one")
    assert ok("detectable_content:postscript", {"postscript_marker": "Note:"}, "Text\nnote: later")


def test_placeholders():
    kw = {"num_placeholders": 2}
    assert ok("detectable_content:number_placeholders", kw, "Dear [name], see you at [place].")
    assert not ok("detectable_content:number_placeholders", kw, "Dear [name], see you.")


def test_bullet_lists_count_star_and_dash():
    kw = {"num_bullets": 3}
    assert ok("detectable_format:number_bullet_lists", kw, "Intro\n* one\n* two\n- three")
    assert not ok("detectable_format:number_bullet_lists", kw, "* one\n* two")
    assert not ok("detectable_format:number_bullet_lists", kw, "* one\n* two\n* three\n* four")
    # "**bold**" lines are not bullets
    assert ok("detectable_format:number_bullet_lists", {"num_bullets": 1}, "**Title**\n* one")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("*- \n\ta.")), max_size=40))
def test_count_bullets_matches_ifeval_regex(text):
    assert count_bullets(text, "*") == len(re.findall(r"^\s*\*[^\*].*$", text, flags=re.MULTILINE))
    assert count_bullets(text, "-") == len(re.findall(r"^\s*-.*$", text, flags=re.MULTILINE))


def test_constrained_response():
    assert ok("detectable_format:constrained_response", {}, "My answer is yes.")
    assert ok("detectable_format:constrained_response", {}, "Well... My answer is maybe. Because.")
    assert not ok("detectable_format:constrained_response", {}, "my answer is yes.")
    assert not ok("detectable_format:constrained_response", {}, "Yes.")


def test_highlighted_sections():
    kw = {"num_highlights": 2}
    assert ok("detectable_format:number_highlighted_sections", kw, "This is *one* and *two*.")
    assert not ok("detectable_format:number_highlighted_sections", kw, "This is *one* and * * empty.")
    assert not ok("detectable_format:number_highlighted_sections", kw, "*one\ntwo*")  # no newline inside
    assert ok("detectable_format:number_highlighted_sections", {"num_highlights": 1}, "**bold**")


def test_multiple_sections():
    kw = {"section_spliter": "Section", "num_sections": 2}
    assert ok("detectable_format:multiple_sections", kw, "Section 1\nabc\nSection 2\ndef")
    assert not ok("detectable_format:multiple_sections", kw, "Section 1\nabc")
    assert not ok("detectable_format:multiple_sections", kw, "SECTION 1\nabc\nSECTION 2\ndef")  # case-sensitive
    assert ok("detectable_format:multiple_sections", {"section_spliter": " Day ", "num_sections": 2}, "Day 1 a Day 2 b")


def test_json_format_strips_fences():
    assert ok("detectable_format:json_format", {}, '{"a": 1}')
    assert ok("detectable_format:json_format", {}, '```json\n{"a": [1, 2]}\n```')
    assert ok("detectable_format:json_format", {}, "```\n[1]\n```")
    assert not ok("detectable_format:json_format", {}, 'Here it is: {"a": 1}')
    assert not ok("detectable_format:json_format", {}, "{'a': 1}")


def test_title():
    assert ok("detectable_format:title", {}, "<<My Title>>\nbody")
    assert not ok("detectable_format:title", {}, "<<   >>\nbody")
    assert not ok("detectable_format:title", {}, "<My Title>\nbody")
    assert not ok("detectable_format:title", {}, "<<My\nTitle>>")


def test_case_rules():
    assert ok("change_case:english_lowercase", {}, "all lower, 123!")
    assert not ok("change_case:english_lowercase", {}, "Not all lower")
    assert ok("change_case:english_capital", {}, "ALL OF THIS ANSWER IS WRITTEN IN CAPITAL LETTERS, 123!")
    assert not ok("change_case:english_capital", {}, "ALL CAPS but one")


def test_capital_word_frequency():
    at_least = {"capital_frequency": 2, "capital_relation": "at least"}
    less = {"capital_frequency": 2, "capital_relation": "less than"}
    assert ok("change_case:capital_word_frequency", at_least, "This is VERY IMPORTANT.")
    assert not ok("change_case:capital_word_frequency", at_least, "This is VERY important.")
    assert ok("change_case:capital_word_frequency", less, "This is VERY important.")
    assert not ok("change_case:capital_word_frequency", less, "WOW, SUCH caps.")
    at_most_0 = {"capital_frequency": 1, "capital_relation": "less than"}
    assert ok("change_case:capital_word_frequency", at_most_0, "well-KNOWN")
    assert not ok("change_case:capital_word_frequency", at_most_0, "WELL-KNOWN")


def test_no_comma():
    assert ok("punctuation:no_comma", {}, "No commas here.")
    assert not ok("punctuation:no_comma", {}, "One, comma.")


def test_end_checker():
    kw = {"end_phrase": "Any other questions?"}
    assert ok("startend:end_checker", kw, "Done. any other QUESTIONS?  \n")
    assert ok("startend:end_checker", kw, '"Done. Any other questions?"')  # outer quotes stripped
    assert not ok("startend:end_checker", kw, "Any other questions? Bye.")


def test_quotation():
    assert ok("startend:quotation", {}, '  "quoted text"  ')
    assert not ok("startend:quotation", {}, '"')
    assert not ok("startend:quotation", {}, "'single'")
    assert not ok("startend:quotation", {}, '"half')


def test_repeat_prompt():
    kw = {"prompt_to_repeat": "Write a poem about rain."}
    assert ok("combination:repeat_prompt", kw, "  write a poem about RAIN. Here it is.")
    assert not ok("combination:repeat_prompt", kw, "Sure! Write a poem about rain.")
    # without the kwarg, the prompt stands in
    assert ok("combination:repeat_prompt", {}, "Hi there. Hello.", prompt="Hi there.")


def test_two_responses():
    assert ok("combination:two_responses", {}, "First answer.\n******\nSecond answer.")
    assert ok("combination:two_responses", {}, "******\nFirst.\n******\nSecond.\n******")  # edges ignored
    assert not ok("combination:two_responses", {}, "Same.\n******\nSame.")
    assert not ok("combination:two_responses", {}, "One.\n******\n\n******\nTwo.")
    assert not ok("combination:two_responses", {}, "A\n******\nB\n******\nC")
    assert not ok("combination:two_responses", {}, "Only one.")


# ---------------------------------------------------------------- registry-wide rules


def test_every_required_id_is_registered():
    required = """keywords:existence keywords:frequency keywords:forbidden_words keywords:letter_frequency
    length_constraints:number_words length_constraints:number_sentences length_constraints:number_paragraphs
    detectable_content:postscript detectable_content:number_placeholders detectable_format:number_bullet_lists
    detectable_format:constrained_response detectable_format:number_highlighted_sections
    detectable_format:multiple_sections detectable_format:json_format detectable_format:title
    change_case:english_lowercase change_case:english_capital change_case:capital_word_frequency
    punctuation:no_comma startend:end_checker startend:quotation combination:repeat_prompt
    combination:two_responses""".split()
    assert set(required) <= set(IFEVAL_IDS)
    assert len(OOD_IDS) >= 8 and not set(OOD_IDS) & set(IFEVAL_IDS)


def test_empty_response_follows_nothing():
    # IFEval: `response.strip() and check_following(response)`, so even no_comma fails on an empty answer
    for iid in ("punctuation:no_comma", "keywords:forbidden_words", "change_case:english_lowercase"):
        kw = {"forbidden_words": ["x"]} if iid == "keywords:forbidden_words" else {}
        assert not ok(iid, kw, "   \n")
        assert not check_instruction_loose(iid, kw, "")


def test_none_kwargs_are_dropped_and_unknown_ids_raise():
    kw = {"num_words": 3, "relation": "at least", "keywords": None, "letter": None}
    assert ok("length_constraints:number_words", kw, "one two three")
    with pytest.raises(KeyError, match="unknown instruction id"):
        check_instruction("keywords:nonexistent", {}, "text")
    with pytest.raises(KeyError):
        validate_instruction("detectable_format:rephrase", {})
    with pytest.raises(ValueError):
        validate_instruction("length_constraints:number_words", {"num_words": 3, "relation": "at most"})
    with pytest.raises(ValueError):
        validate_instruction("keywords:frequency", {"keyword": "cat"})


def test_loose_mode_rules():
    # an intro line before the JSON: strict fails, loose (first line removed) passes
    resp = 'Sure, here is the JSON:\n{"a": 1}'
    assert not check_instruction("detectable_format:json_format", {}, resp)
    assert check_instruction_loose("detectable_format:json_format", {}, resp)
    # markdown bold around the end phrase: loose removes the asterisks
    resp = "Done. **Any other questions?**"
    assert not check_instruction("startend:end_checker", {"end_phrase": "Any other questions?"}, resp)
    assert check_instruction_loose("startend:end_checker", {"end_phrase": "Any other questions?"}, resp)
    # a trailing remark after the end phrase: loose drops the last line
    resp = "Text. Any other questions?\n(I hope this helps)"
    assert check_instruction_loose("startend:end_checker", {"end_phrase": "Any other questions?"}, resp)
    # loose never makes a clearly broken answer pass
    assert not check_instruction_loose("punctuation:no_comma", {}, "a, b\nc, d\ne, f")


def test_ifeval_scores_prompt_and_instruction_level():
    records = [
        {"prompt": "p1", "instruction_id_list": ["punctuation:no_comma", "startend:quotation"], "kwargs": [{}, {}],
         "response": '"no commas here"'},  # 2/2
        {"prompt": "p2", "instruction_id_list": ["punctuation:no_comma", "detectable_format:json_format"],
         "kwargs": [{}, {}], "response": 'Here:\n{"a": 1}'},  # strict 1/2, loose 2/2
        {"prompt": "p3", "instruction_id_list": ["change_case:english_capital"], "kwargs": [{}], "response": "lower"},
    ]
    s = ifeval_scores(records)
    assert s["prompt_strict"] == pytest.approx(100 / 3)
    assert s["inst_strict"] == pytest.approx(100 * 3 / 5)
    assert s["prompt_loose"] == pytest.approx(200 / 3)
    assert s["inst_loose"] == pytest.approx(100 * 4 / 5)
    assert ifeval_scores([]) == {"prompt_strict": 0.0, "inst_strict": 0.0, "prompt_loose": 0.0, "inst_loose": 0.0}


# ---------------------------------------------------------------- out-of-domain types


def test_ood_verifiers():
    assert ok("count:word_count_range", {"min_words": 3, "max_words": 4}, "one two three")
    assert not ok("count:word_count_range", {"min_words": 3, "max_words": 4}, "one two three four five")
    assert ok("count:unique_word_count", {"N": 3}, "a b c a")
    assert not ok("count:unique_word_count", {"N": 3}, "a b A. b")
    assert ok("ratio:stop_words", {"percentage": 50}, "the cat sat here")  # the + here = 50%
    assert not ok("ratio:stop_words", {"percentage": 40}, "the cat sat here")
    assert ok("count:conjunctions", {"small_n": 2}, "Tea and cake, but no milk.")
    assert not ok("count:conjunctions", {"small_n": 2}, "Tea and cake and milk.")
    assert ok("count:person_names", {"N": 2}, "Emma met Noah.")
    assert not ok("count:person_names", {"N": 2}, "Emma met Emma and Emmanuel.")
    assert ok("count:numbers", {"N": 2}, "It took 3.5 hours and 12 cups.")
    assert not ok("count:numbers", {"N": 2}, "It took 3 hours, 4 cups and 5 plates.")
    assert ok("words:prime_lengths", {}, "We can study it.")
    assert not ok("words:prime_lengths", {}, "We can read it.")
    assert ok("format:newline", {}, "one\ntwo\n\nthree.")
    assert not ok("format:newline", {}, "one two\nthree")
    assert ok("ratio:sentence_type", {}, "A cat. A dog. Why?")
    assert not ok("ratio:sentence_type", {}, "A cat. Why? How?")
    assert ok("format:emoji", {}, "Sunny day \U0001F31E. Nice walk \U0001F6B6!")
    assert not ok("format:emoji", {}, "Sunny day \U0001F31E. Nice walk!")


# ---------------------------------------------------------------- never raises

_IDS = [i for i in VERIFIERS if i != "language:response_language"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=200)
       | st.text(alphabet=st.sampled_from(list('*-\n .,"<>[]{}#P.S0123456789aZ')), max_size=200))
def test_verifiers_never_raise(text):
    for iid in _IDS:
        assert isinstance(check_instruction(iid, KWARGS.get(iid, {}), text), bool)
        assert isinstance(check_instruction_loose(iid, KWARGS.get(iid, {}), text), bool)


def test_bad_kwargs_and_non_string_responses_give_false():
    assert check_instruction("length_constraints:number_words", {"num_words": "x", "relation": "at least"},
                             "a b") is False
    assert check_instruction("keywords:letter_frequency", {"letter": "ab", "let_frequency": 1,
                                                           "let_relation": "less than"}, "a") is False
    assert check_instruction("punctuation:no_comma", {}, None) is False
    assert check_instruction_loose("punctuation:no_comma", {}, 42) is False


def test_huge_inputs_stay_fast():
    texts = ["\n" * 50_000, " \n" * 30_000 + "-", " " * 60_000 + "x", "." * 60_000, "a" * 60_000, "*x* [y], " * 8_000]
    t0 = time.process_time()  # CPU seconds: a bound on work, whatever else shares the cores
    for text in texts:
        for iid in _IDS:
            check_instruction_loose(iid, KWARGS.get(iid, {}), text)
    assert time.process_time() - t0 < 15


# ---------------------------------------------------------------- generator and environment


def _drive(env, task, text):
    ep = env.start(Task.from_dict(json.loads(json.dumps(task.to_dict()))))
    ep.step(text)
    return ep


def test_expert_scores_one_and_empty_scores_zero():
    env = InstructEnv(WorldsConfig(), seed=3)
    for split in env.splits:
        tasks = env.tasks(split, 60, seed=1)
        assert len(tasks) == 60
        for task in tasks:
            assert task.meta["score_kind"] == "all"
            ep = _drive(env, task, scripted_expert(task, task.initial_messages()))
            assert ep.reward() == 1.0, (task.user_prompt, ep.messages[-1]["content"], ep.failure)
            empty = _drive(env, task, "")
            assert empty.reward() == 0.0
            assert "failed instructions" in empty.failure


def test_partial_reward_and_failure_lists_ids():
    task = Task(id="t", domain="instruct", benchmark="ifeval", system_prompt="", user_prompt="p",
                answer={"key": 1, "prompt": "p", "instruction_id_list": ["punctuation:no_comma", "startend:quotation"],
                        "kwargs": [{}, {}]})
    env = InstructEnv()
    ep = _drive(env, task, "no commas but no quotes")
    assert ep.reward() == 0.5 and "startend:quotation" in ep.failure and "no_comma" not in ep.failure
    # a reasoning block is not part of the answer
    assert _drive(env, task, '<think>hmm, let me think</think>"done"').reward() == 1.0


def test_splits_are_deterministic_disjoint_and_cover_families():
    env = InstructEnv(WorldsConfig(), seed=0)
    train = env.tasks("train", 120, seed=0)
    again = InstructEnv(WorldsConfig(), seed=0).tasks("train", 120, seed=0)
    assert [t.to_dict() for t in train] == [t.to_dict() for t in again]
    assert [t.user_prompt for t in train] != [t.user_prompt for t in env.tasks("train", 120, seed=1)]
    test = env.tasks("test", 120, seed=0)
    ood = env.tasks("ifbench", 60, seed=0)
    assert not {t.user_prompt for t in train} & {t.user_prompt for t in test}
    assert not {t.meta["topic"] for t in train} & {t.meta["topic"] for t in test}
    assert {t.benchmark for t in test} == {"ifeval"} and {t.benchmark for t in ood} == {"ifbench"}
    train_ids = {i for t in train for i in t.answer["instruction_id_list"]}
    test_ids = {i for t in test for i in t.answer["instruction_id_list"]}
    ood_ids = {i for t in ood for i in t.answer["instruction_id_list"]}
    assert train_ids <= set(GENERATED_IFEVAL_IDS) and test_ids <= set(GENERATED_IFEVAL_IDS)
    assert len(train_ids) >= 20 and len(test_ids) >= 20
    assert ood_ids <= set(OOD_IDS) and len(ood_ids) >= 8 and not ood_ids & train_ids
    for t in train + test + ood:
        ids = t.answer["instruction_id_list"]
        assert 1 <= len(ids) <= 3 and compatible(ids)
        assert t.user_prompt == t.answer["prompt"]
    assert all(t.meta["topic"] in TOPICS["ifbench"] for t in ood)


def test_the_wide_vocabulary_holds_no_held_out_word_and_leaves_the_world_alone():
    """The mid-training vocabulary (pretrain.midtrain_if_vocab: wide) shares no word with any held-out pool or topic
    (ifeval's, ifbench's), its prompts are the same families on other words, the expert passes them, and the
    world's own train prompts are unchanged by its existence."""
    from acl_lib.envs import instruct

    held_out = {w for split in ("test", "ifbench") for t in TOPICS[split] for w in t.lower().split()} - {"the", "a"}
    for pool in (instruct.KEYWORDS, instruct.FORBIDDEN, instruct.FIRST_WORDS):
        held_out |= set(pool["test"])
    held_phrases = set(instruct.END_PHRASES["test"])
    wide_words = set(instruct.WIDE_NOUNS) | set(instruct.WIDE_ADVERBS)
    assert len(instruct.WIDE_NOUNS) >= 150 and not wide_words & held_out
    assert not wide_words & set(instruct.KEYWORDS["train"]) and not set(instruct.WIDE_END_PHRASES) & held_phrases
    wide = InstructEnv(WorldsConfig(), seed=1000, vocab="wide").tasks("train", 400, seed=5000)
    topics = {t.meta["topic"] for t in wide}
    assert len(topics) >= 100 and topics <= set(TOPICS["wide"])
    kws = {k for t in wide for kw in t.answer["kwargs"] for k in kw.get("keywords", [])}
    assert len(kws) >= 50 and kws <= set(instruct.WIDE_NOUNS)
    env = InstructEnv(WorldsConfig(), seed=1000, vocab="wide")
    assert all(_drive(env, t, scripted_expert(t, t.initial_messages())).reward() == 1.0 for t in wide[:50])
    world = InstructEnv(WorldsConfig(), seed=1000).tasks("train", 50, seed=5000)
    assert {t.meta["topic"] for t in world} <= set(TOPICS["train"])
    again = InstructEnv(WorldsConfig(), seed=1000, vocab="world").tasks("train", 50, seed=5000)
    assert [t.user_prompt for t in again] == [t.user_prompt for t in world]
    with pytest.raises(ValueError, match="vocabulary"):
        InstructEnv(WorldsConfig(), vocab="large")


def test_compatibility_rules():
    assert not compatible(["change_case:english_lowercase", "change_case:english_capital"])
    assert not compatible(["detectable_format:json_format", "detectable_format:title"])
    assert not compatible(["detectable_format:constrained_response", "punctuation:no_comma"])
    assert compatible(["detectable_format:json_format", "keywords:existence"])
    assert compatible(["punctuation:no_comma", "detectable_format:title", "keywords:forbidden_words"])


def test_real_jsonl_loader(tmp_path):
    env = InstructEnv(WorldsConfig(data_dir=str(DATA)), seed=0)
    test = env.tasks("test", 100)
    assert len(test) == 6 and test[0].answer["kwargs"][0] == {}  # None-valued kwargs dropped
    repeat = "Write a product description for a reusable water bottle."
    assert test[3].answer["kwargs"][0] == {"prompt_to_repeat": repeat}
    assert len(env.tasks("test", 2, seed=5)) == 2
    ood = env.tasks("ifbench", 100)
    assert {i for t in ood for i in t.answer["instruction_id_list"]} <= set(OOD_IDS)
    # a real-looking answer is scored with IFEval's rules
    ep = _drive(env, test[2], "My answer is maybe.")
    assert ep.reward() == 1.0
    ep = _drive(env, test[4], "Day 1\nBeach walk.\nDay 2\nHarbor tour.\nP.S. Pack a hat.")
    assert ep.reward() == 1.0
    # no train.jsonl under data_dir: an error naming it, never generated mini prompts (tests/test_paper_data.py)
    with pytest.raises(FileNotFoundError, match="train.jsonl"):
        env.tasks("train", 3)
    # an unknown id in a data file is a load-time KeyError that names the file and line
    bad = tmp_path / "instruct"
    bad.mkdir()
    (bad / "ifeval.jsonl").write_text(json.dumps({"key": 1, "prompt": "x", "instruction_id_list": ["keywords:nope"],
                                                  "kwargs": [{}]}) + "\n")
    with pytest.raises(KeyError, match="ifeval.jsonl:1"):
        InstructEnv(WorldsConfig(data_dir=str(tmp_path))).tasks("test", 1)
    with pytest.raises(FileNotFoundError):
        InstructEnv(WorldsConfig(data_dir=str(tmp_path))).tasks("ifbench", 1)
    assert len(load_ifeval_jsonl(DATA / "instruct" / "ifbench.jsonl")) == 3


def test_real_train_file_excludes_benchmark_prompts(tmp_path):
    d = tmp_path / "instruct"
    d.mkdir()
    rows = [json.loads(line) for line in (DATA / "instruct" / "ifeval.jsonl").read_text().splitlines()]
    (d / "ifeval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    train = InstructEnv(WorldsConfig(data_dir=str(tmp_path))).tasks("train", 100)
    assert [t.answer["key"] for t in train] == [r["key"] for r in rows[3:]]
    assert {t.benchmark for t in train} == {"ifeval_train"}
    with pytest.raises(ValueError, match="unknown instruct split"):
        InstructEnv().tasks("dev", 1)


def test_response_language_needs_langdetect(monkeypatch):
    import sys

    kw = {"language": "en"}
    monkeypatch.setitem(sys.modules, "langdetect", None)  # simulate "not installed"
    with pytest.raises(ImportError, match="langdetect"):
        validate_instruction("language:response_language", kw)
    assert check_instruction("language:response_language", kw, "Hello there, how are you today?") is False


def test_response_language_with_langdetect():
    pytest.importorskip("langdetect")
    kw = {"language": "fr"}
    french, english = ("Bonjour, je suis très content de vous voir aujourd'hui.",
                       "Hello, I am very happy to see you today, my friend.")
    assert check_instruction("language:response_language", kw, french)
    assert not check_instruction("language:response_language", kw, english)


def test_tasks_survive_an_arrow_round_trip():
    # TRL trainers rebuild tasks from dataset rows; Arrow merges every row's kwargs dicts into one struct,
    # so unused keys come back as None and must be ignored (as IFEval drops None kwargs).
    datasets = pytest.importorskip("datasets")
    env = InstructEnv(WorldsConfig(), seed=0)
    tasks = env.tasks("train", 30, seed=2) + env.tasks("ifbench", 10, seed=2)
    rows = datasets.Dataset.from_list([{"task": json.dumps(t.to_dict()), "answer": t.answer} for t in tasks])
    for row, task in zip(rows, tasks):
        assert any(v is None for kw in row["answer"]["kwargs"] for v in kw.values())  # padded by Arrow
        rebuilt = Task.from_dict({**json.loads(row["task"]), "answer": row["answer"]})
        assert _drive(env, rebuilt, scripted_expert(task, [])).reward() == 1.0


def test_expert_quotes_keywords_as_the_prompt_does():
    """The expert writes a required keyword with the prompt's quotes, so the words it copies tokenize as they
    do in the prompt (' "', 'th', 'und', 'er' against ' th', 'und', 'er' unquoted)."""
    env = InstructEnv(WorldsConfig(), seed=0)
    tasks = [t for t in env.tasks("test", 200, seed=0) if "keywords:existence" in t.answer["instruction_id_list"]]
    assert tasks
    for task in tasks:
        words = task.answer["kwargs"][task.answer["instruction_id_list"].index("keywords:existence")]["keywords"]
        reply = scripted_expert(task, task.initial_messages())
        for w in words:
            assert f'"{w}"' in task.user_prompt
            # as written, upper-cased (english_capital) or inside a JSON string (json_format)
            assert f'"{w}"' in reply.lower() or f'\\"{w}\\"' in reply.lower(), (w, reply)
