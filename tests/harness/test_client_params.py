"""What real clients send, taken as the real APIs take it (issue 36), through the official
`openai` and `anthropic` SDKs over real HTTP; the LLM simulator (a named fake of vLLM's token-id
API, which honours `stop` as vLLM does) behind a real `LLMSession`, the real SmolLM2 tokenizer.

- `tool_choice` required / a named function / `any` / `tool` is accepted, the policy sampled as
  it is (stored logprobs are the simulator's own), a reply without the call answered as the
  API would and counted `tool_choice_unmet`;
- `stop` / `stop_sequences` reach the server, which stops there: the reply's text ends before
  the stop string, the recorded ids are exactly the ids the server returned (the token that
  completed the stop string included, no end token), and the next call still merges;
- `response_format`, `logprobs`, `parallel_tool_calls`, `thinking`, `cache_control`,
  `metadata`, `anthropic-beta` and `count_tokens` are answered; refusals name their field.
"""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from fakellm.script import fake_logprob
from tests.harness.conftest import BASH_TOOL, SMOLLM2, anthropic_client, ids_of, openai_client, recorded

END = 2
CALL_LS = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>'
START = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Task i-1: fix it."}]
REACT = "Thought: I will list.\nObservation: a.txt b.txt"
SMOL_STOP = ["Observation:", "Calling tools:"]  # what smolagents sends by default
ANTHROPIC_TOOLS = [
    {
        "name": "bash",
        "description": "Run a shell command",
        "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    }
]


def ids_through_stop(text: str, stop: str) -> list[int]:
    """vLLM's ids for a reply a stop string ends: every token up to the one whose text
    completes the stop string (vLLM cuts only the text)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(f"{SMOLLM2}/tokenizer.json")
    ids = ids_of(text)
    return next(ids[:n] for n in range(1, len(ids) + 1) if stop in tok.decode(ids[:n]))


def sampled_logprobs(turn: dict) -> list[float]:
    """The simulator's logprob of each token it sampled for `turn` (no forcing: these)."""
    base = len(turn["extra"].get("prompt_ids") or [])
    return [fake_logprob(t, base + i) for i, t in enumerate(turn["generated_ids"])]


# -- tool_choice -------------------------------------------------------------------------------
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "bash"}}])
def test_openai_required_or_named_tool_choice_is_sampled_as_is(endpoint, choice) -> None:
    ep = endpoint({"by_instance": {"i-1": [CALL_LS, "I am done, no more tools."]}})
    client = openai_client(ep)
    first = client.chat.completions.create(model="p", messages=START, tools=[BASH_TOOL], tool_choice=choice)
    assert first.choices[0].finish_reason == "tool_calls" and ep.counters.tool_choice_unmet == 0
    call = first.choices[0].message.tool_calls[0]
    messages = [
        *START,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "a.txt"},
    ]
    second = client.chat.completions.create(model="p", messages=messages, tools=[BASH_TOOL], tool_choice=choice)
    # What the real API would have returned for a reply without a call: plain text, "stop".
    assert second.choices[0].finish_reason == "stop" and not second.choices[0].message.tool_calls
    assert second.choices[0].message.content == "I am done, no more tools."
    counters = ep.counters
    assert (counters.tool_choice_unmet, counters.failed_calls, counters.merges) == (1, 0, 1)
    turns = recorded(ep)
    assert turns[1]["generated_ids"] == ids_of("I am done, no more tools.") + [END]
    assert turns[0]["logprobs"] == sampled_logprobs(turns[0])  # the distribution sampled
    assert turns[1]["extra"]["tool_choice"] == ("required" if choice == "required" else "bash")


def test_openai_named_tool_choice_met_by_another_tool_is_unmet(endpoint) -> None:
    ep = endpoint({"default": [CALL_LS]})
    choice = {"type": "function", "function": {"name": "submit"}}
    reply = openai_client(ep).chat.completions.create(model="p", messages=START, tools=[BASH_TOOL], tool_choice=choice)
    assert reply.choices[0].message.tool_calls[0].function.name == "bash"  # what the policy did
    assert ep.counters.tool_choice_unmet == 1


def test_openai_tool_choice_none_still_returns_the_markup_as_text(endpoint) -> None:
    ep = endpoint({"default": [CALL_LS]})
    reply = openai_client(ep).chat.completions.create(model="p", messages=START, tools=[BASH_TOOL], tool_choice="none")
    assert reply.choices[0].message.content == CALL_LS and not reply.choices[0].message.tool_calls
    assert ep.counters.tool_choice_unmet == 0


@pytest.mark.parametrize("choice", [{"type": "any"}, {"type": "tool", "name": "bash"}])
def test_anthropic_any_or_tool_choice_is_sampled_as_is(endpoint, choice) -> None:
    ep = endpoint({"by_instance": {"i-1": [CALL_LS, "Nothing left to run."]}})
    client = anthropic_client(ep)
    first_user = {"role": "user", "content": "Task i-1: fix it."}
    kwargs = {"model": "p", "max_tokens": 200, "tools": ANTHROPIC_TOOLS, "tool_choice": choice}
    first = client.messages.create(messages=[first_user], **kwargs)
    assert first.stop_reason == "tool_use" and first.content[0].input == {"cmd": "ls"}
    messages = [
        first_user,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": first.content[0].id, "content": "a"}]},
    ]
    second = client.messages.create(messages=messages, **kwargs)
    assert second.stop_reason == "end_turn" and [b.type for b in second.content] == ["text"]
    assert (ep.counters.tool_choice_unmet, ep.counters.merges) == (1, 1)


# -- stop --------------------------------------------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_openai_stop_is_honoured_and_the_ids_are_the_servers(endpoint, stream) -> None:
    ep = endpoint({"by_instance": {"i-1": [REACT, "Thought: done."]}})
    client = openai_client(ep)
    if stream:
        chunks = list(client.chat.completions.create(model="p", messages=START, stop=SMOL_STOP, stream=True))
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finish == ["stop"]
    else:
        reply = client.chat.completions.create(model="p", messages=START, stop=SMOL_STOP)
        content, finish = reply.choices[0].message.content, reply.choices[0].finish_reason
        assert finish == "stop" and reply.usage.completion_tokens == len(ids_through_stop(REACT, "Observation:"))
    assert content == "Thought: I will list.\n"  # the stop string is not in the text
    [turn] = recorded(ep)
    # Exactly the server's ids: through the token completing "Observation:", no end token.
    assert turn["generated_ids"] == ids_through_stop(REACT, "Observation:")
    assert turn["logprobs"] == sampled_logprobs(turn)
    assert turn["finish_reason"] == "stop" and turn["extra"]["stop_sequence"] == "Observation:"
    assert ep.counters.ignored_params == {}  # honoured, not ignored

    # The harness echoes the cut text and adds its observation: a merge, the template's
    # close of the unfinished turn (`<|im_end|>`) heads the delta (mask 0).
    messages = [*START, {"role": "assistant", "content": content}, {"role": "user", "content": "Observation: a b"}]
    client.chat.completions.create(model="p", messages=messages, stop=SMOL_STOP)
    second = recorded(ep)[1]
    assert second["extra"]["merged"] and second["extra"]["delta_ids"][0] == END
    result = ep.result("completed", "stop")
    response = result.response_ids
    assert response[: len(turn["generated_ids"])] == turn["generated_ids"]
    assert response[-len(second["generated_ids"]) :] == second["generated_ids"]
    assert result.metrics["retokenization_drift"] == 0


def test_anthropic_stop_sequences_answer_stop_sequence(endpoint) -> None:
    ep = endpoint({"default": [REACT]})
    for stream in (False, True):
        kwargs = {"model": "p", "max_tokens": 100, "stop_sequences": ["Observation:"]}
        kwargs["messages"] = [{"role": "user", "content": f"Task {stream}"}]
        if stream:
            with anthropic_client(ep).messages.stream(**kwargs) as events:
                reply = events.get_final_message()
        else:
            reply = anthropic_client(ep).messages.create(**kwargs)
        assert (reply.stop_reason, reply.stop_sequence) == ("stop_sequence", "Observation:")
        assert reply.content[0].text == "Thought: I will list.\n"
    assert [t["generated_ids"] for t in recorded(ep)] == [ids_through_stop(REACT, "Observation:")] * 2


def test_a_stop_string_never_generated_changes_nothing(endpoint) -> None:
    ep = endpoint({"default": ["All good."]})
    reply = openai_client(ep).chat.completions.create(model="p", messages=START, stop="Observation:")
    assert reply.choices[0].message.content == "All good." and reply.choices[0].finish_reason == "stop"
    assert recorded(ep)[0]["generated_ids"] == ids_of("All good.") + [END]


def test_the_simulator_stops_like_vllm(endpoint) -> None:
    """The fake's own contract (it stands in for vLLM): text cut before the match (or kept with
    `include_stop_str_in_output`), ids kept through the completing token, `stop_reason`."""
    from fakellm.server import start_simulator

    url, stop = start_simulator(SMOLLM2, {"default": [REACT]})
    try:
        body = {"prompt": [1, 2, 3], "max_tokens": 100, "stop": ["Calling tools:", "Observation:"]}
        choice = httpx.post(f"{url}/v1/completions", json=body).json()["choices"][0]
        assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", "Observation:")
        assert choice["text"] == "Thought: I will list.\n"
        assert choice["token_ids"] == ids_through_stop(REACT, "Observation:")
        kept = httpx.post(f"{url}/v1/completions", json={**body, "include_stop_str_in_output": True}).json()
        assert kept["choices"][0]["text"] == "Thought: I will list.\nObservation:"
        plain = httpx.post(f"{url}/v1/completions", json={**body, "stop": ["never"]}).json()["choices"][0]
        assert plain["stop_reason"] is None and plain["token_ids"] == ids_of(REACT) + [END]
    finally:
        stop()


# -- other fields real clients send -------------------------------------------------------------
def test_openai_fields_accepted_and_answered(endpoint) -> None:
    ep = endpoint({"default": ["Fine."]})
    client = openai_client(ep)
    raw = client.chat.completions.with_raw_response.create(
        model="p",
        messages=START,
        tools=[BASH_TOOL],
        parallel_tool_calls=False,
        response_format={"type": "json_object"},
        logprobs=True,
        top_logprobs=2,
        user="u-1",
        metadata={"k": "v"},
        store=False,
        service_tier="auto",
        reasoning_effort="low",
        logit_bias={"42": 5},
    )
    assert raw.headers["x-raas-unenforced-params"] == "response_format,top_logprobs"
    reply = raw.parse()
    [turn] = recorded(ep)
    tokens = reply.choices[0].logprobs.content
    assert [t.logprob for t in tokens] == turn["logprobs"]  # the sampled tokens' own
    assert "".join(t.token for t in tokens).startswith("Fine.")
    assert ep.counters.unenforced_params == {"response_format": 1, "top_logprobs": 1}
    assert ep.counters.ignored_params == {"logit_bias": 1} and ep.counters.refusals == {}
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    chunks = list(
        client.chat.completions.create(
            model="p", messages=START, response_format=schema, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].usage.completion_tokens == len(ids_of("Fine.")) + 1
    assert ep.counters.unenforced_params["response_format"] == 2


def test_openai_parallel_tool_calls_false_is_counted_when_the_policy_makes_two(endpoint) -> None:
    ep = endpoint({"default": [CALL_LS + CALL_LS]})
    reply = openai_client(ep).chat.completions.create(
        model="p", messages=START, tools=[BASH_TOOL], parallel_tool_calls=False
    )
    assert len(reply.choices[0].message.tool_calls) == 2  # sampled as it is
    assert ep.counters.unenforced_params == {"parallel_tool_calls": 1}


def test_anthropic_claude_code_shaped_request(endpoint) -> None:
    """System blocks with cache_control, metadata, an anthropic-beta header, thinking, a
    tool with cache_control: accepted; the `<think>` block comes back as a thinking block."""
    ep = endpoint({"default": ["<think>Check the files.</think>Listing now." + CALL_LS]})
    system = [
        {"type": "text", "text": "You are Claude Code."},
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
    ]
    tools = [{**ANTHROPIC_TOOLS[0], "cache_control": {"type": "ephemeral"}}]
    user = {"role": "user", "content": [{"type": "text", "text": "fix", "cache_control": {"type": "ephemeral"}}]}
    kwargs = {
        "model": "p",
        "max_tokens": 300,
        "system": system,
        "tools": tools,
        "messages": [user],
        "metadata": {"user_id": "u"},
        "thinking": {"type": "enabled", "budget_tokens": 100},
        "extra_headers": {"anthropic-beta": "interleaved-thinking-2025-05-14"},
    }
    client = anthropic_client(ep)
    reply = client.messages.create(**kwargs)
    assert [b.type for b in reply.content] == ["thinking", "text", "tool_use"]
    assert reply.content[0].thinking == "Check the files." and reply.content[1].text == "Listing now."
    with client.messages.stream(**kwargs) as events:
        streamed = events.get_final_message()
    assert [b.type for b in streamed.content] == ["thinking", "text", "tool_use"]
    assert streamed.content[0].thinking == "Check the files."
    # The next call echoes the thinking block (dropped: not part of the text) and merges.
    echo = {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": reply.content[2].id, "content": "a"}]}
    client.messages.create(**{**kwargs, "messages": [user, echo, result]})
    assert recorded(ep)[2]["extra"]["merged"] and ep.counters.refusals == {}
    # Without `thinking` (or without a <think> block) no thinking block comes back.
    plain = client.messages.create(**{**kwargs, "thinking": {"type": "disabled"}})
    assert [b.type for b in plain.content] == ["text", "tool_use"]
    assert plain.content[0].text.startswith("<think>")


def test_count_tokens_is_the_real_render(endpoint) -> None:
    ep = endpoint({"default": ["Fine."]})
    client = anthropic_client(ep)
    kwargs = {"model": "p", "system": "You fix bugs.", "tools": ANTHROPIC_TOOLS}
    messages = [{"role": "user", "content": "Task: fix it."}]
    counted = client.messages.count_tokens(messages=messages, **kwargs)
    assert ep.counters.calls == 0  # not a model call
    client.messages.create(messages=messages, max_tokens=20, **kwargs)
    assert counted.input_tokens == len(recorded(ep)[0]["extra"]["prompt_ids"]) > 20


def test_refusals_name_their_field(endpoint) -> None:
    ep = endpoint({"default": ["Fine."]})
    client = anthropic_client(ep)
    with pytest.raises(anthropic.BadRequestError, match="tool_choice"):
        client.messages.create(
            model="p", max_tokens=10, messages=[{"role": "user", "content": "x"}], tool_choice={"type": "tool"}
        )
    with pytest.raises(anthropic.BadRequestError, match="thinking"):
        client.messages.create(
            model="p", max_tokens=10, messages=[{"role": "user", "content": "x"}], thinking={"type": "psychic"}
        )
    with pytest.raises(openai.BadRequestError, match="stop"):
        openai_client(ep).chat.completions.create(model="p", messages=START, stop=[""])
    assert ep.counters.refusals == {"tool_choice": 1, "thinking": 1, "stop": 1}
    assert json.loads(json.dumps(ep.counters.metrics()))["refusals"]["stop"] == 1


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_a_sessions_stop_strings_reach_either_backend(backend) -> None:
    """`LLMSession.generate(stop=...)` sends the call's stop strings with the job's (vLLM's
    `stop`, SGLang's `sampling_params.stop`); the ids are the server's, the match is named."""
    import time

    from agents.llm import LLMSession
    from fakellm.server import start_simulator

    url, stop = start_simulator(SMOLLM2, {"default": [REACT]})
    spec = {"backend": backend, "servers": [{"url": url}], "tokenizer": SMOLLM2, "max_model_len": 4096}
    try:
        with LLMSession.open(spec, {"max_tokens": 100, "stop": ["never said"]}, "rollout-s") as session:
            session.start([{"role": "user", "content": "go"}])
            gen = session.generate(time.monotonic() + 30, stop=["Calling tools:", "Observation:"])
    finally:
        stop()
    assert gen.token_ids == ids_through_stop(REACT, "Observation:") and gen.stop_reason == "Observation:"
    assert gen.finish_reason == "stop" and session.trajectory().response_ids == gen.token_ids
