"""Hermes/Qwen tool-call parsing: several calls per turn, malformed ones become error messages."""

from __future__ import annotations

from agents.llm import ToolCall, parse_tool_calls


def test_several_calls_in_order() -> None:
    text = (
        '<think>two steps</think>\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n'
        '</tool_call>\n<tool_call>{"name": "python", "arguments": {"code": "1+1"}}</tool_call>'
    )
    calls, errors = parse_tool_calls(text)
    assert calls == [ToolCall("bash", {"cmd": "ls"}), ToolCall("python", {"code": "1+1"})]
    assert errors == []


def test_no_call_is_no_error() -> None:
    assert parse_tool_calls("The answer is 4.") == ([], [])


def test_arguments_as_json_string_and_missing_arguments() -> None:
    calls, errors = parse_tool_calls(
        '<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call><tool_call>{"name": "b"}</tool_call>'
    )
    assert calls == [ToolCall("a", {"x": 1}), ToolCall("b", {})]
    assert errors == []


def test_malformed_calls_are_reported_and_good_ones_kept() -> None:
    text = (
        '<tool_call>{"name": "bash", "arguments": {"cmd": "ls"</tool_call>'  # bad JSON
        '<tool_call>["bash"]</tool_call>'  # not an object
        '<tool_call>{"arguments": {}}</tool_call>'  # no name
        '<tool_call>{"name": "x", "arguments": [1]}</tool_call>'  # bad arguments
        '<tool_call>{"name": "ok", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "cut", "arguments": {'
    )  # never closed
    calls, errors = parse_tool_calls(text)
    assert calls == [ToolCall("ok", {})]
    assert len(errors) == 5
    assert errors[0].startswith("tool call #1: invalid JSON")
    assert "JSON object" in errors[1] and '"name"' in errors[2]
    assert "\"arguments\" of 'x'" in errors[3] and "missing </tool_call>" in errors[4]


def test_to_dict_round_trip() -> None:
    assert ToolCall("f", {"a": 1}).to_dict() == {"name": "f", "arguments": {"a": 1}}
