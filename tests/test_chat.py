"""The shared tool-call parser: well-formed calls parse, anything else is a value, never an exception."""

from hypothesis import given, settings
from hypothesis import strategies as st

from acl_lib.chat import ToolCall, ToolCallError, format_tool_call, parse_assistant, strip_think


def test_single_call_with_text():
    text = "Let me look.\n" + format_tool_call("search", {"query": "capital of Zorvia"})
    turn = parse_assistant(text)
    assert turn.content == "Let me look."
    assert turn.calls == [ToolCall("search", {"query": "capital of Zorvia"})]


def test_several_calls_and_double_encoded_arguments():
    text = (
        '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>{"name": "b", "arguments": "{\\"y\\": [1, 2]}"}</tool_call>'
    )
    turn = parse_assistant(text)
    assert turn.calls == [ToolCall("a", {"x": 1}), ToolCall("b", {"y": [1, 2]})]
    assert turn.content == ""


def test_malformed_calls_become_error_values():
    cases = {
        "<tool_call>{not json}</tool_call>": "malformed JSON",
        "<tool_call>[1, 2]</tool_call>": "JSON object",
        '<tool_call>{"arguments": {}}</tool_call>': "no 'name'",
        '<tool_call>{"name": "a", "arguments": 3}</tool_call>': "'arguments' must be an object",
        "<tool_call>   </tool_call>": "empty",
        '<tool_call>{"name": "a", "arguments": {"q": "x"': "malformed JSON",  # cut off mid-generation
    }
    for text, reason in cases.items():
        turn = parse_assistant(text)
        assert len(turn.calls) == 1 and isinstance(turn.calls[0], ToolCallError), text
        assert reason in turn.calls[0].reason, (text, turn.calls[0].reason)


def test_think_block_is_dropped_from_content():
    assert strip_think("<think>hmm 2+2</think>\nAnswer: 4") == "Answer: 4"
    assert parse_assistant("<think>x</think>hello").content == "hello"


def test_format_round_trips():
    call = ToolCall("get_order_details", {"order_id": "#W1"})
    assert parse_assistant(format_tool_call(call.name, call.arguments)).calls == [call]


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_random_text_never_raises(text):
    turn = parse_assistant(text)
    assert isinstance(turn.content, str)
    for c in turn.calls:
        assert isinstance(c, (ToolCall, ToolCallError))


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('<>/{}[]":,tool_call namearguments0123\\ '))))
def test_tool_call_shaped_noise_never_raises(text):
    parse_assistant("<tool_call>" + text)
    parse_assistant(text + "</tool_call>")
