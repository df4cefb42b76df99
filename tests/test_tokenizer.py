"""The byte-level BPE tokenizer: exact round trip, digits, the Qwen3 chat tokens, save/reload."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from acl_lib.model.build import placeholder_corpus
from acl_lib.model.chat_template import IM_END, IM_START, MARKUP_TOKENS, PAD_TOKEN, RESPONSE_TEMPLATE
from acl_lib.model.tokenizer import train_tokenizer

VOCAB = 384


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(placeholder_corpus(300, seed=0), VOCAB)


def test_vocab_size_and_conventions(tok):
    assert len(tok) == VOCAB  # the placeholder corpus has enough pairs to fill the target
    assert tok.eos_token == IM_END and tok.pad_token == PAD_TOKEN
    assert tok.eos_token_id != tok.pad_token_id
    assert tok.padding_side == "left"
    assert set(tok.all_special_tokens) == {PAD_TOKEN, IM_START, IM_END}
    assert tok.response_template == RESPONSE_TEMPLATE


def test_too_small_vocab_is_refused():
    with pytest.raises(ValueError, match="no room"):
        train_tokenizer(["abc"], 256 + 9)


def test_chat_tokens_are_single_tokens_and_markup_survives_skip_special(tok):
    for t in (PAD_TOKEN, IM_START, IM_END, *MARKUP_TOKENS):
        ids = tok(t)["input_ids"]
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids) == [t]
    text = '<think>\nhm\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>'
    ids = tok(text)["input_ids"]
    kept = tok.decode(ids, skip_special_tokens=True)
    assert kept == text.replace(IM_END, "")  # markup kept, only the special eos dropped
    response = "<tool_response>x</tool_response>"
    assert tok.decode(tok(response)["input_ids"], skip_special_tokens=True) == response


def test_chat_markup_is_not_learned_as_bpe_merges(tok):
    # The markup is removed from the training text, so no learned token spells part of it.
    learned = [t for t, i in tok.get_vocab().items() if t not in (PAD_TOKEN, IM_START, IM_END, *MARKUP_TOKENS)]
    assert not [t for t in learned if "im_" in t or "tool_" in t]


def test_digits_are_split_one_per_token(tok):
    pieces = tok.convert_ids_to_tokens(tok("Answer: 2026 and 13+409=422")["input_ids"])
    digits = [p for p in pieces if any(c.isdigit() for c in p)]
    assert digits == list("2026") + list("13") + list("409") + list("422")


@settings(max_examples=200, deadline=None)
@given(
    st.text(alphabet=st.characters(codec="utf-8"), max_size=80)
    | st.sampled_from(
        [
            "  leading and trailing  ",
            "wait , what . do n't",  # what clean_up_tokenization_spaces would "fix"
            "tabs\tand\nnewlines\r\n",
            "émoji 🚀 中文",
            f"{IM_START}user\nhi{IM_END}\n",
        ]
    )
)
def test_decode_round_trips_exactly(tok, text):
    assert tok.decode(tok(text)["input_ids"]) == text


def test_left_padding(tok):
    batch = tok(["a", "a longer text 123"], padding=True)
    first = batch["input_ids"][0]
    n_pad = len(first) - len(tok("a")["input_ids"])
    assert n_pad > 0 and first[:n_pad] == [tok.pad_token_id] * n_pad
    assert batch["attention_mask"][0][:n_pad] == [0] * n_pad


def test_save_and_reload_through_autotokenizer(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    text = f"{IM_START}user\nWhat is 17 * 4?{IM_END}\n<tool_call>\n{{}}\n</tool_call> ünïcode"
    assert again(text)["input_ids"] == tok(text)["input_ids"]
    assert again.decode(again(text)["input_ids"]) == text
    assert again.chat_template == tok.chat_template
    assert again.response_template == RESPONSE_TEMPLATE  # saved in tokenizer_config.json
    assert (again.eos_token, again.pad_token, again.padding_side) == (IM_END, PAD_TOKEN, "left")
    assert len(again) == len(tok)


def test_keep_whole_words_are_single_tokens_within_the_budget(tmp_path):
    words = ["Thesund", "Dibriand"]
    tok = train_tokenizer(placeholder_corpus(300, seed=0), VOCAB, keep_whole=words)
    assert len(tok) == VOCAB
    text = "Where is Thesund? Dibriand and Thesund."
    ids = tok(text)["input_ids"]
    pieces = [tok.decode([i]) for i in ids]
    assert pieces.count(" Thesund") == 2 and " Dibriand" in pieces
    assert tok.decode(ids) == text
    tok.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path)(text)["input_ids"] == ids
    plain = train_tokenizer(placeholder_corpus(300, seed=0), VOCAB)
    assert len(plain(" Thesund")["input_ids"]) > 1  # without keep_whole the name is split
