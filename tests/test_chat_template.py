"""The Qwen3-convention chat template: exact rendering, assistant mask, prefix preservation, parsing."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2.exceptions import TemplateError
from trl.chat_template_utils import (
    get_training_chat_template,
    is_chat_template_prefix_preserving,
    is_chat_template_stop_token_trained,
    parse_response,
    supports_tool_calling,
)

from acl_lib.chat import ToolCall, ToolCallError, format_tool_call, parse_assistant
from acl_lib.model.build import placeholder_corpus
from acl_lib.model.chat_template import render_chat
from acl_lib.model.tokenizer import train_tokenizer

SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Look something up.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}
CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate.",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
    },
}


def _call(name, args):
    return {"type": "function", "function": {"name": name, "arguments": args}}


# A multi-turn tool conversation: content + two calls (dict and JSON-string arguments), two tool results
# grouped into one turn, a bare call, one result, a final answer with a think block.
MESSAGES = [
    {"role": "system", "content": "You are a desk agent."},
    {"role": "user", "content": "Who wrote Dune, and what is 6*7?"},
    {
        "role": "assistant",
        "content": "Let me check.",
        "tool_calls": [_call("search", {"query": "Dune author"}), _call("calc", '{"x": 42}')],
    },
    {"role": "tool", "name": "search", "content": "Dune is a novel by Frank Herbert."},
    {"role": "tool", "name": "calc", "content": "42"},
    {"role": "assistant", "content": None, "tool_calls": [_call("search", {"query": "Frank Herbert born"})]},
    {"role": "tool", "name": "search", "content": "Frank Herbert was born in 1920."},
    {"role": "assistant", "content": "<think>\nenough\n</think>\n\nFrank Herbert; 42."},
]
TOOLS = [SEARCH, CALC]

SYSTEM_TURN = (
    "<|im_start|>system\nYou are a desk agent.\n\n# Tools\n\nYou can call functions to help with the task. "
    "Their signatures are listed inside <tools></tools> XML tags, one JSON schema per line:\n<tools>\n"
    + json.dumps(SEARCH)
    + "\n"
    + json.dumps(CALC)
    + "\n</tools>\n\nTo call a function, write a JSON object with its name and arguments inside "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)
ASSISTANT_SPANS = [
    "Let me check.\n"
    + format_tool_call("search", {"query": "Dune author"})
    + "\n"
    + format_tool_call("calc", {"x": 42})
    + "<|im_end|>",
    format_tool_call("search", {"query": "Frank Herbert born"}) + "<|im_end|>",
    "<think>\nenough\n</think>\n\nFrank Herbert; 42.<|im_end|>",
]
EXPECTED = (
    SYSTEM_TURN
    + "<|im_start|>user\nWho wrote Dune, and what is 6*7?<|im_end|>\n"
    + "<|im_start|>assistant\n" + ASSISTANT_SPANS[0] + "\n"
    + "<|im_start|>user\n<tool_response>\nDune is a novel by Frank Herbert.\n</tool_response>\n"
    + "<tool_response>\n42\n</tool_response><|im_end|>\n"
    + "<|im_start|>assistant\n" + ASSISTANT_SPANS[1] + "\n"
    + "<|im_start|>user\n<tool_response>\nFrank Herbert was born in 1920.\n</tool_response><|im_end|>\n"
    + "<|im_start|>assistant\n" + ASSISTANT_SPANS[2] + "\n"
)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(placeholder_corpus(300, seed=0), 384)


def test_renders_exactly_the_expected_text(tok):
    assert tok.apply_chat_template(MESSAGES, tools=TOOLS, tokenize=False) == EXPECTED
    assert render_chat(MESSAGES, tools=TOOLS) == EXPECTED  # the tokenizer-free renderer agrees


def test_system_turn_variants(tok):
    user = [{"role": "user", "content": "hi"}]
    assert tok.apply_chat_template(user, tokenize=False) == "<|im_start|>user\nhi<|im_end|>\n"
    sys_user = [{"role": "system", "content": "Be brief."}, *user]
    assert tok.apply_chat_template(sys_user, tokenize=False).startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    tools_only = tok.apply_chat_template(user, tools=[SEARCH], tokenize=False)
    assert tools_only.startswith("<|im_start|>system\n# Tools\n\n") and json.dumps(SEARCH) + "\n</tools>" in tools_only
    prompt = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_unknown_role_is_an_error(tok):
    with pytest.raises(TemplateError, match="unknown chat role"):
        tok.apply_chat_template([{"role": "narrator", "content": "x"}], tokenize=False)


def test_encode_decode_and_parse_round_trip(tok):
    ids = tok.apply_chat_template(MESSAGES, tools=TOOLS, tokenize=True, return_dict=False)
    assert tok.decode(ids) == EXPECTED
    spans = re.findall(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", EXPECTED, flags=re.S)
    assert len(spans) == 3
    for span, message in zip(spans, [m for m in MESSAGES if m["role"] == "assistant"]):
        parsed = parse_assistant(span)
        want = [
            ToolCall(c["function"]["name"], c["function"]["arguments"] if isinstance(c["function"]["arguments"], dict)
                     else json.loads(c["function"]["arguments"]))
            for c in message.get("tool_calls", [])
        ]
        assert parsed.calls == want
    assert parse_assistant(spans[2]).content == "Frank Herbert; 42."  # think block stripped by the parser


def test_assistant_mask_covers_exactly_the_assistant_tokens(tok):
    out = tok.apply_chat_template(
        MESSAGES, tools=TOOLS, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = out["input_ids"], out["assistant_masks"]
    pieces = [tok.decode([i]) for i in ids]
    assert "".join(pieces) == EXPECTED  # ASCII text: token pieces tile the text exactly
    # Character intervals of the assistant spans (content, calls, <|im_end|>; not the header or the "\n").
    intervals, pos = [], 0
    for span in ASSISTANT_SPANS:
        start = EXPECTED.index("<|im_start|>assistant\n" + span, pos) + len("<|im_start|>assistant\n")
        intervals.append((start, start + len(span)))
        pos = start + len(span)
    offset = 0
    for piece, m in zip(pieces, mask):
        inside = any(a <= offset and offset + len(piece) <= b for a, b in intervals)
        straddles = any(a < offset + len(piece) and offset < b for a, b in intervals) and not inside
        assert not straddles, f"token {piece!r} crosses an assistant boundary"
        assert m == int(inside), f"token {piece!r} at {offset}: mask {m}, inside assistant span {inside}"
        offset += len(piece)
    masked_text = "".join(p for p, m in zip(pieces, mask) if m)
    assert masked_text == "".join(ASSISTANT_SPANS)
    for other in ("desk agent", "Who wrote", "<tool_response>", "Frank Herbert was born", "<|im_start|>"):
        assert other not in masked_text


def test_prefix_preserving(tok):
    # Every prefix of the conversation renders as a prefix of the longer one, except that a tool result
    # followed by another tool result shares its user turn (so the first one's <|im_end|> moves).
    for k in range(1, len(MESSAGES)):
        shorter = tok.apply_chat_template(MESSAGES[:k], tools=TOOLS, tokenize=False)
        longer = tok.apply_chat_template(MESSAGES[: k + 1], tools=TOOLS, tokenize=False)
        if MESSAGES[k - 1]["role"] == "tool" and MESSAGES[k]["role"] == "tool":
            assert longer.startswith(shorter.removesuffix("<|im_end|>\n"))
        else:
            assert longer.startswith(shorter)
        if MESSAGES[k]["role"] == "assistant":  # the generation prompt is what the assistant turn starts with
            prompt = tok.apply_chat_template(MESSAGES[:k], tools=TOOLS, tokenize=False, add_generation_prompt=True)
            assert longer.startswith(prompt)


def test_trl_accepts_the_template(tok):
    assert supports_tool_calling(tok)
    assert is_chat_template_prefix_preserving(tok)
    assert is_chat_template_stop_token_trained(tok)
    assert get_training_chat_template(tok) is None  # nothing for TRL to patch


def test_generated_tool_call_parses_with_both_parsers(tok):
    prompt_ids = tok.apply_chat_template(MESSAGES[:2], tools=TOOLS, add_generation_prompt=True, return_dict=False)
    generated = "Looking it up.\n" + format_tool_call("search", {"query": "Dune author"}) + "<|im_end|>"
    gen_ids = tok(generated)["input_ids"]
    trl_parsed = parse_response(tok, gen_ids, prefix=prompt_ids, tools=TOOLS)
    assert trl_parsed["content"] == "Looking it up."
    assert trl_parsed["tool_calls"] == [
        {"type": "function", "function": {"name": "search", "arguments": {"query": "Dune author"}}}
    ]
    ours = parse_assistant(tok.decode(gen_ids, skip_special_tokens=True))
    assert ours.content == "Looking it up." and ours.calls == [ToolCall("search", {"query": "Dune author"})]
    # Plain text (no call) is content only.
    plain = parse_response(tok, tok("Answer: 42<|im_end|>")["input_ids"], prefix=prompt_ids)
    assert plain["content"] == "Answer: 42" and not plain.get("tool_calls")


def test_malformed_tool_call_is_a_value_not_an_exception(tok):
    bad = '<tool_call>\n{"name": "search", "arguments": {"query": "x"}\n</tool_call><|im_end|>'  # one brace short
    ids = tok(bad)["input_ids"]
    ours = parse_assistant(tok.decode(ids, skip_special_tokens=True))
    assert len(ours.calls) == 1 and isinstance(ours.calls[0], ToolCallError)
    assert "malformed JSON" in ours.calls[0].reason
    # TRL falls back to plain content: no tool is run (the environment must penalise it).
    trl_parsed = parse_response(tok, ids, prefix=[])
    assert "tool_calls" not in trl_parsed and trl_parsed["content"].startswith("<tool_call>")


_names = st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True)
_values = st.one_of(st.integers(-10**6, 10**6), st.booleans(), st.text(st.characters(codec="ascii"), max_size=12),
                    st.sampled_from(["\x7f", "caf\u00e9", "\u65e5\u672c", "<tag>&"]))  # what once broke the round trip


@settings(max_examples=60, deadline=None)
@given(name=_names, args=st.dictionaries(_names, _values, max_size=4), as_string=st.booleans())
def test_any_rendered_call_parses_back(tok, name, args, as_string):
    call = _call(name, json.dumps(args, ensure_ascii=False) if as_string else args)
    message = {"role": "assistant", "content": "", "tool_calls": [call]}
    text = tok.apply_chat_template([{"role": "user", "content": "go"}, message], tokenize=False)
    span = text.split("<|im_start|>assistant\n", 1)[1]
    assert span == format_tool_call(name, args) + "<|im_end|>\n"
    assert parse_assistant(span).calls == [ToolCall(name, args)]
    ids = tok(span.removesuffix("\n"))["input_ids"]
    trl_parsed = parse_response(tok, ids, prefix=[])
    assert trl_parsed["tool_calls"] == [{"type": "function", "function": {"name": name, "arguments": args}}]
