"""The endpoint through the official `anthropic` SDK over real HTTP on its Unix socket (the
LLM simulator, a named fake, as the inference server; the real SmolLM2 tokenizer)."""

from __future__ import annotations

import anthropic
import pytest

from tests.harness.conftest import anthropic_client, ids_of, recorded

END = 2
CALL_LS = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>'
CALL_CAT = 'Reading it.<tool_call>\n{"name": "bash", "arguments": {"cmd": "cat a.txt"}}\n</tool_call>'
SCRIPT = {"by_instance": {"i-1": [CALL_LS, CALL_CAT, "The bug is fixed."]}}
TOOLS = [
    {
        "name": "bash",
        "description": "Run a shell command",
        "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    }
]
SYSTEM = "You fix bugs."
FIRST = {"role": "user", "content": "Task i-1: fix it."}


def converse(client, stream: bool) -> list:
    """A 3-call tool-use conversation, the way an anthropic-SDK agent writes it."""
    messages, replies = [FIRST], []
    for _ in range(3):
        kwargs = {"model": "policy", "max_tokens": 200, "system": SYSTEM, "tools": TOOLS, "messages": messages}
        if stream:
            with client.messages.stream(**kwargs) as events:
                reply = events.get_final_message()
        else:
            reply = client.messages.create(**kwargs)
        replies.append(reply)
        messages = messages + [
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}
        ]
        results = [
            {"type": "tool_result", "tool_use_id": b.id, "content": f"ran {b.input['cmd']}"}
            for b in reply.content
            if b.type == "tool_use"
        ]
        if not results:
            break
        messages.append({"role": "user", "content": results})
    return replies


@pytest.mark.parametrize("stream", [False, True])
def test_tool_use_round_trip_and_one_sample(endpoint, stream) -> None:
    ep = endpoint(SCRIPT)
    first, second, third = converse(anthropic_client(ep), stream)
    assert first.stop_reason == second.stop_reason == "tool_use"
    assert [b.type for b in first.content] == ["tool_use"]
    assert first.content[0].name == "bash" and first.content[0].input == {"cmd": "ls"}
    assert first.content[0].id.startswith("toolu_")
    assert [b.type for b in second.content] == ["text", "tool_use"]
    assert second.content[0].text == "Reading it."
    assert third.stop_reason == "end_turn" and third.content[0].text == "The bug is fixed."
    assert first.usage.output_tokens == len(ids_of(CALL_LS)) + 1

    turns = recorded(ep)
    assert [t["extra"]["api"] for t in turns] == ["anthropic"] * 3
    assert [t["extra"]["merged"] for t in turns] == [False, True, True]
    result = ep.result("completed", None)
    gen = [t["generated_ids"] for t in turns]
    deltas = [t["extra"]["delta_ids"] for t in turns[1:]]
    assert result.response_ids == gen[0] + deltas[0] + gen[1] + deltas[1] + gen[2]
    assert sum(result.loss_mask) == sum(map(len, gen))
    assert result.metrics["samples"] == 1 and result.metrics["retokenization_drift"] == 0


def test_streaming_events_are_the_api_s(endpoint) -> None:
    ep = endpoint(SCRIPT)
    events = list(
        anthropic_client(ep).messages.create(
            model="policy", max_tokens=200, system=SYSTEM, tools=TOOLS, messages=[FIRST], stream=True
        )
    )
    # (the SDK drops the `ping` the endpoint sends after message_start, as the API's)
    assert [e.type for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[2].delta.type == "input_json_delta"
    assert events[4].delta.stop_reason == "tool_use"


def test_errors_in_the_api_s_shape(endpoint) -> None:
    ep = endpoint(SCRIPT, max_model_len=256)
    with pytest.raises(anthropic.AuthenticationError) as caught:
        anthropic_client(ep, token="wrong-token").messages.create(model="policy", max_tokens=10, messages=[FIRST])
    assert caught.value.body["error"]["type"] == "authentication_error"
    client = anthropic_client(ep)
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(
            model="policy",
            max_tokens=10,
            messages=[{"role": "user", "content": "Task i-1: " + "very long text " * 200}],
        )
    error = caught.value.body["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith("prompt is too long:") and "> 256 maximum" in error["message"]
    with pytest.raises(anthropic.BadRequestError, match="image"):
        client.messages.create(
            model="policy",
            max_tokens=10,
            messages=[
                {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x/y.png"}}]}
            ],
        )


def test_system_blocks_and_error_results_render_as_the_template_sees_them(endpoint) -> None:
    """`system` as text blocks and an `is_error` tool result go through the same merge."""
    ep = endpoint(SCRIPT)
    client = anthropic_client(ep)
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    first = client.messages.create(model="policy", max_tokens=200, system=system, tools=TOOLS, messages=[FIRST])
    messages = [
        FIRST,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": first.content[0].id,
                    "content": [{"type": "text", "text": "ls: not found"}],
                    "is_error": True,
                },
                {"type": "text", "text": "Try again."},
            ],
        },
    ]
    client.messages.create(model="policy", max_tokens=200, system=system, tools=TOOLS, messages=messages)
    turns = recorded(ep)
    assert turns[1]["extra"]["merged"] is True
    delta_text = ep.runner.tracker.current.builder.tok.decode(turns[1]["extra"]["delta_ids"])
    assert "Error: ls: not found" in delta_text and "Try again." in delta_text
    assert delta_text.index("Error: ls") < delta_text.index("Try again.")
