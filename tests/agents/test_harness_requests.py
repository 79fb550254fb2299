"""The first request each preset (npm, aider and OpenHands) really sends (recorded from the CLI itself, issue 36)
parses on its route: the endpoint takes what the real clients send.

The bodies and headers in tests/fixtures/harness-requests/ were captured by running each preset's
command, variables and files against a recording server (paths of the recording host replaced);
they are also the reference for the dialects still to come (Responses: codex, generateContent:
gemini-cli). See docs/harnesses.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "harness-requests"
TASK = "Fix the bug in intervals/core.py."  # what the recordings were given as {task}


def recorded(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


@pytest.mark.parametrize(
    "name, path, tools",
    [
        ("claude-code", "/v1/messages?beta=true", {"Bash", "Read", "Edit", "Write"}),
        ("qwen-code", "/v1/chat/completions", {"run_shell_command", "edit", "read_file"}),
        ("opencode", "/v1/chat/completions", {"bash", "edit", "read"}),
    ],
)
def test_the_recorded_first_request_parses_with_the_harness_tools(name, path, tools) -> None:
    from agents.harness import anthropic_wire, openai_wire

    request = recorded(name)
    assert request["method"] == "POST" and request["path"] == path
    wire = anthropic_wire if path.startswith("/v1/messages") else openai_wire
    call = wire.parse_request(request["body"])
    assert call.stream is True  # every one of them streams
    assert tools <= {t["function"]["name"] for t in call.tools or []}
    # the task came from the CLI's own arguments, as the last user turn
    assert call.messages[-1]["role"] == "user" and TASK in str(call.messages[-1]["content"])


def test_aiders_first_request_offers_no_tools_and_asks_for_search_replace_blocks() -> None:
    """aider (LiteLLM on the `openai` SDK) streams plain chat: its edits are text in the reply."""
    from agents.harness import openai_wire

    request = recorded("aider")
    assert request["path"] == "/v1/chat/completions" and request["headers"]["Authorization"] == "Bearer raas-token"
    call = openai_wire.parse_request(request["body"])
    assert call.stream is True and not call.tools
    # its example exchanges, repo map and file requests come first, as turns of their own
    assert [m["role"] for m in call.messages[:2]] == ["system", "user"] and len(call.messages) == 12
    last = str(call.messages[-1]["content"])
    assert call.messages[-1]["role"] == "user" and last.startswith(TASK) and "<<<<<<< SEARCH" in last


def test_openhands_first_request_offers_its_terminal_and_file_editor_unstreamed() -> None:
    """OpenHands (the SDK's Agent through LiteLLM's `openai` provider, Python 3.12): one plain
    Chat call, not streamed, with its four tools and text parts as content."""
    from agents.harness import openai_wire

    request = recorded("openhands")
    assert request["path"] == "/v1/chat/completions" and request["headers"]["Authorization"] == "Bearer raas-token"
    assert request["headers"]["X-Stainless-Runtime-Version"].startswith("3.12")
    call = openai_wire.parse_request(request["body"])
    assert call.stream is False and request["body"]["reasoning_effort"] == "high"
    tools = {t["function"]["name"]: t["function"]["parameters"] for t in call.tools or []}
    assert set(tools) == {"terminal", "file_editor", "finish", "think"}
    # what the scripted replies of tests/agents/test_harness_openhands.py call them with
    assert tools["terminal"]["required"] == ["command"] and tools["file_editor"]["required"] == ["command", "path"]
    assert "str_replace" in tools["file_editor"]["properties"]["command"]["enum"]
    assert [m["role"] for m in call.messages] == ["system", "user"]
    assert call.messages[-1]["content"] == [{"type": "text", "text": TASK + "\n"}]


@pytest.mark.parametrize(
    "name, path",
    [
        ("codex", "/v1/responses"),
        ("gemini-cli", "/v1beta/models/raas:streamGenerateContent?alt=sse"),
    ],
)
def test_the_dialects_to_come_have_their_reference_requests(name, path) -> None:
    """Codex (Responses) and Gemini CLI (generateContent): what their routes must accept."""
    request = recorded(name)
    assert request["path"] == path
    body = request["body"]
    if name == "codex":
        assert (
            body["stream"] is True
            and body["store"] is False
            and "exec_command" in {t.get("name") for t in body["tools"]}
        )
    else:
        names = {f["name"] for t in body["tools"] for f in t["functionDeclarations"]}
        assert "run_shell_command" in names and body["contents"][0]["role"] == "user"
