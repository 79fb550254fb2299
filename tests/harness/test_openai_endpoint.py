"""The endpoint through the official `openai` SDK over real HTTP on its Unix socket, the LLM
simulator (named fake) as the inference server, the real SmolLM2 tokenizer."""

from __future__ import annotations

import json
import socket
import time

import httpx
import openai
import pytest

from tests.harness.conftest import BASH_TOOL, ids_of, openai_client, recorded, uds_client

END = 2
CALL_LS = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>'
CALL_CAT = 'Reading it.<tool_call>\n{"name": "bash", "arguments": {"cmd": "cat a.txt"}}\n</tool_call>'
SCRIPT = {"by_instance": {"i-1": [CALL_LS, CALL_CAT, "The bug is fixed."]}}
START = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Task i-1: fix it."}]


def run_conversation(client, stream: bool) -> list:
    """A 3-call tool-using conversation, the way an openai-SDK agent writes it."""
    messages, replies = list(START), []
    for _ in range(3):
        if stream:
            reply = _streamed(client, messages)
        else:
            response = client.chat.completions.create(model="policy", messages=messages, tools=[BASH_TOOL])
            reply = response.choices[0]
            reply = (reply.message, reply.finish_reason)
        message, finish = reply
        replies.append((message, finish))
        messages.append(message.model_dump(exclude_none=True) if not stream else message)
        for tool_call in message.tool_calls or []:
            args = json.loads(tool_call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": f"ran {args['cmd']}"})
        if not message.tool_calls:
            break
    return replies


def _streamed(client, messages):
    """Accumulate a streamed answer the way agent code does."""
    from openai.types.chat import ChatCompletionMessage

    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(model="policy", messages=messages, tools=[BASH_TOOL], stream=True):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for tc in choice.delta.tool_calls or []:
            slot = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
            slot["id"] = tc.id or slot["id"]
            slot["name"] = (tc.function.name or slot["name"]) if tc.function else slot["name"]
            slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
        finish = choice.finish_reason or finish
    tool_calls = [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
        for c in calls.values()
    ] or None
    message = ChatCompletionMessage(role="assistant", content=content or None, tool_calls=tool_calls)
    return message, finish


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_round_trip_and_merge_into_one_sample(endpoint, stream) -> None:
    ep = endpoint(SCRIPT)
    replies = run_conversation(openai_client(ep), stream)
    (first, f1), (second, f2), (third, f3) = replies
    assert f1 == f2 == "tool_calls" and f3 == "stop"
    assert first.content is None and first.tool_calls[0].function.name == "bash"
    assert json.loads(first.tool_calls[0].function.arguments) == {"cmd": "ls"}
    assert second.content == "Reading it."
    assert third.content == "The bug is fixed." and not third.tool_calls

    turns = recorded(ep)
    assert [t["generated_ids"] for t in turns] == [
        ids_of(CALL_LS) + [END],
        ids_of(CALL_CAT) + [END],
        ids_of("The bug is fixed.") + [END],
    ]
    assert [t["extra"]["merged"] for t in turns] == [False, True, True]
    assert all(t["extra"]["tool_call_parsed"] for t in turns[:2])
    assert turns[0]["weight_version"] == "v7"
    result = ep.result("completed", "harness_exit")
    gen = [t["generated_ids"] for t in turns]
    deltas = [t["extra"]["delta_ids"] for t in turns[1:]]
    assert result.prompt_ids == turns[0]["extra"]["prompt_ids"]
    assert result.response_ids == gen[0] + deltas[0] + gen[1] + deltas[1] + gen[2]
    assert result.loss_mask == (
        [1] * len(gen[0]) + [0] * len(deltas[0]) + [1] * len(gen[1]) + [0] * len(deltas[1]) + [1] * len(gen[2])
    )
    assert result.response_logprobs[: len(gen[0])] == turns[0]["logprobs"]
    assert "samples" not in result.extra
    assert result.metrics["samples"] == 1 and result.metrics["merges"] == 2
    assert result.metrics["splits"] == 0 and result.metrics["tool_calls"] == 2
    assert result.metrics["retokenization_drift"] == 0
    assert result.policy_versions == ["v7", "v7", "v7"]


def test_a_history_rewrite_splits_into_two_samples(endpoint) -> None:
    ep = endpoint(SCRIPT)
    client = openai_client(ep)
    run_conversation(client, stream=False)
    # The harness summarises its history and goes on: a new sample from a full render.
    summary = [START[0], {"role": "user", "content": "Task i-1: fix it. So far: ran ls."}]
    client.chat.completions.create(model="policy", messages=summary, tools=[BASH_TOOL])
    result = ep.result("completed", None)
    samples = result.extra["samples"]
    assert len(samples) == 2 and [s["calls"] for s in samples] == [3, 1]
    assert samples[1]["split_reason"] == "history_rewritten"
    assert result.metrics["splits"] == 1 and result.metrics["split_reasons"] == {"history_rewritten": 1}
    last_turn = recorded(ep)[-1]
    assert samples[1]["prompt_ids"] == last_turn["extra"]["prompt_ids"] == result.prompt_ids
    assert samples[1]["response_ids"] == last_turn["generated_ids"]
    assert samples[1]["loss_mask"] == [1] * len(last_turn["generated_ids"])
    assert sum(samples[0]["loss_mask"]) == sum(len(t["generated_ids"]) for t in recorded(ep)[:3])


def test_context_overflow_is_context_length_exceeded(endpoint) -> None:
    ep = endpoint(SCRIPT, max_model_len=256)
    client = openai_client(ep)
    long = [START[0], {"role": "user", "content": "Task i-1: " + "very long text " * 200}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="policy", messages=long)
    assert caught.value.code == "context_length_exceeded"
    assert "maximum context length is 256 tokens" in caught.value.message
    assert ep.counters.errors == {"context_length_exceeded": 1}
    assert ep.result("completed", None).prompt_ids is None  # nothing generated: no sample


def test_a_growing_conversation_ends_with_context_length_exceeded(endpoint) -> None:
    ep = endpoint({"default": ["ok " * 20]}, max_model_len=300)
    client = openai_client(ep)
    messages = list(START)
    with pytest.raises(openai.BadRequestError) as caught:
        for _ in range(20):
            reply = client.chat.completions.create(model="policy", messages=messages)
            messages += [
                reply.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": "more " * 30},
            ]
    assert caught.value.code == "context_length_exceeded"
    result = ep.result("completed", "context")
    assert result.metrics["samples"] == 1 and len(result.prompt_ids) + len(result.response_ids) <= 300


def test_token_budget_is_a_clear_error(endpoint) -> None:
    ep = endpoint({"default": ["one two three four five six"]}, limits={"max_tokens": 10})
    client = openai_client(ep)
    messages = list(START)
    reply = client.chat.completions.create(model="policy", messages=messages)
    assert reply.choices[0].finish_reason == "stop"
    messages += [reply.choices[0].message.model_dump(), {"role": "user", "content": "again"}]
    reply = client.chat.completions.create(model="policy", messages=messages)
    assert reply.choices[0].finish_reason == "length"  # cut by what the budget left
    messages += [reply.choices[0].message.model_dump(), {"role": "user", "content": "again"}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="policy", messages=messages)
    assert caught.value.code == "token_budget_exceeded"
    assert sum(ep.result("completed", None).loss_mask) == 10


def test_request_max_tokens_cuts_the_turn(endpoint) -> None:
    ep = endpoint({"default": ["one two three four five six seven eight"]})
    reply = openai_client(ep).chat.completions.create(model="policy", messages=START, max_completion_tokens=3)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 3
    assert recorded(ep)[0]["finish_reason"] == "turn_length"  # not the job's budget
    assert reply.usage.prompt_tokens == len(recorded(ep)[0]["extra"]["prompt_ids"])


def test_refused_and_ignored_parameters(endpoint) -> None:
    ep = endpoint(SCRIPT)
    client = openai_client(ep)
    with pytest.raises(openai.BadRequestError, match="n=1"):
        client.chat.completions.create(model="policy", messages=START, n=2)
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        client.chat.completions.create(model="policy", messages=START, tools=[BASH_TOOL], tool_choice="always")
    with pytest.raises(openai.BadRequestError, match="image_url"):
        client.chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}],
        )
    raw = client.chat.completions.with_raw_response.create(model="policy", messages=START, temperature=0.0, seed=3)
    assert raw.headers["x-raas-ignored-params"] == "temperature,seed"
    assert ep.counters.ignored_params == {"temperature": 1, "seed": 1}
    assert ep.counters.calls == 4 and ep.counters.failed_calls == 3
    assert ep.counters.refusals == {"n": 1, "tool_choice": 1, "messages": 1}  # each names its field


def test_models_and_auth(endpoint) -> None:
    ep = endpoint(SCRIPT)
    assert [m.id for m in openai_client(ep).models.list()] == ["raas-policy"]
    with pytest.raises(openai.AuthenticationError) as caught:
        openai_client(ep, token="not-the-token").chat.completions.create(model="policy", messages=START)
    assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"
    plain = uds_client(ep)
    assert plain.get("http://rollout/v1/models").status_code == 401  # no header at all
    assert plain.get("http://rollout/v1/models", headers={"x-api-key": ep.token}).status_code == 200
    assert ep.counters.unauthorized == 2 and ep.counters.calls == 0
    # A refused POST's unread body does not spoil the connection for the next request.
    refused = plain.post("http://rollout/v1/chat/completions", json={"messages": START})
    assert refused.status_code == 401 and refused.headers["connection"] == "close"
    assert plain.get("http://rollout/v1/models", headers={"x-api-key": ep.token}).status_code == 200


def test_after_exit_the_endpoint_is_gone(endpoint) -> None:
    ep = endpoint(SCRIPT)
    client = openai_client(ep)
    client.models.list()  # a pooled keep-alive connection exists now
    ep.__exit__(None, None, None)
    with pytest.raises(openai.APIConnectionError):
        client.models.list()
    probe = socket.socket(socket.AF_UNIX)
    with pytest.raises((ConnectionRefusedError, FileNotFoundError)):
        probe.connect(ep.socket_path)
    probe.close()
    with pytest.raises(httpx.ConnectError):
        uds_client(ep).get("http://rollout/v1/models")


def test_a_length_cut_reply_continues_token_exact(endpoint) -> None:
    """A turn cut on length has no end token: the next call's delta closes it."""
    ep = endpoint({"default": ["one two three four five six", "fine"]}, sampling={"max_tokens": 3})
    client = openai_client(ep)
    first = client.chat.completions.create(model="policy", messages=START)
    assert first.choices[0].finish_reason == "length"
    messages = START + [first.choices[0].message.model_dump(), {"role": "user", "content": "go on"}]
    client.chat.completions.create(model="policy", messages=messages)
    result = ep.result("completed", None)
    assert result.metrics["merges"] == 1 and result.metrics["retokenization_drift"] == 0


def test_cancel_and_deadline_answer_clearly(endpoint) -> None:
    cancelled = {"now": False}
    ep = endpoint(SCRIPT, cancel_check=lambda: cancelled["now"])
    client = openai_client(ep)
    client.chat.completions.create(model="policy", messages=START)
    cancelled["now"] = True
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="policy", messages=START)
    assert caught.value.code == "cancelled"
    assert type(ep.fatal).__name__ == "RolloutCancelled"  # the handler re-raises it

    late = endpoint(SCRIPT, timeout=0.0)
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client(late).chat.completions.create(model="policy", messages=START)
    assert caught.value.code == "deadline_exceeded" and late.fatal is None


def test_concurrent_calls_are_serialised_into_samples(endpoint) -> None:
    """Two calls at once (a harness sampling in parallel): both answered, one sample each."""
    from concurrent.futures import ThreadPoolExecutor

    ep = endpoint({"default": ["Hello there."]})
    client = openai_client(ep)
    with ThreadPoolExecutor(2) as pool:
        replies = list(pool.map(lambda _: client.chat.completions.create(model="policy", messages=START), range(2)))
    assert [r.choices[0].message.content for r in replies] == ["Hello there."] * 2
    result = ep.result("completed", None)
    assert result.metrics["samples"] == 2 and result.metrics["split_reasons"] == {"history_not_extended": 1}
    assert [len(s["response_ids"]) for s in result.extra["samples"]] == [len(ids_of("Hello there.")) + 1] * 2


def test_stream_usage_and_socket_mode(endpoint) -> None:
    import os
    import stat

    ep = endpoint(SCRIPT)
    assert stat.S_IMODE(os.stat(ep.socket_path).st_mode) == 0o666
    chunks = list(
        openai_client(ep).chat.completions.create(
            model="policy", messages=START, tools=[BASH_TOOL], stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ids_of(CALL_LS)) + 1
    assert chunks[-2].choices[0].finish_reason == "tool_calls"


def test_a_reply_whose_tool_call_does_not_parse_is_text_and_counted(endpoint) -> None:
    broken = '<tool_call>{"name": "bash", "arguments": {"cmd": "ls"</tool_call>'
    ep = endpoint({"default": [broken, "plain words"]})
    client = openai_client(ep)
    reply = client.chat.completions.create(model="policy", messages=START, tools=[BASH_TOOL])
    assert reply.choices[0].message.content == broken and not reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "stop"
    client.chat.completions.create(
        model="policy",
        tools=[BASH_TOOL],
        messages=START + [reply.choices[0].message.model_dump(), {"role": "user", "content": "Use the tool."}],
    )
    turns = recorded(ep)
    assert [t["extra"]["tool_call_parsed"] for t in turns] == [False, False]
    assert "invalid JSON" in turns[0]["extra"]["parse_errors"][0]
    counters = ep.counters
    assert counters.malformed_tool_calls == 1 and counters.replies_without_tool_call == 2
    metrics = ep.result("completed", None).metrics
    assert (metrics["tool_calls"], metrics["malformed_tool_calls"], metrics["turns"]) == (0, 1, 2)
    assert not {"parse_failures", "tool_calls_parsed", "tool_calls_failed"} & set(metrics)  # one name per count


def test_a_turn_that_cannot_be_logged_is_an_infrastructure_failure(endpoint) -> None:
    from core.errors import LeaseLost

    def lost(**turn) -> None:
        raise LeaseLost("the rollout moved on: turn not logged")

    ep = endpoint(SCRIPT, record_turn=lost)
    with pytest.raises(openai.InternalServerError):
        openai_client(ep).chat.completions.create(model="policy", messages=START)
    assert isinstance(ep.fatal, LeaseLost)


def test_same_ids_as_a_raas_handler_loop(endpoint) -> None:
    """The conversation through the endpoint is, token for token, what a raas handler's own
    loop (`LLMSession`: start, generate, append the tool results, generate...) stores."""
    from agents.llm import LLMSession
    from tests.harness.conftest import QWEN_TEMPLATE, SMOLLM2

    ep = endpoint(SCRIPT)
    run_conversation(openai_client(ep), stream=False)
    spec = {
        "servers": [{"url": ep.ctx.llm.spec.servers[0].url, "model": "sim"}],
        "tokenizer": SMOLLM2,
        "max_model_len": 4096,
        "chat_template_text": QWEN_TEMPLATE,
    }
    with LLMSession.open(spec, {"max_tokens": 256}, "loop") as loop:
        loop.start(START, [BASH_TOOL])
        loop.generate(time.monotonic() + 30)
        for result in ("ran ls", "ran cat a.txt"):
            loop.append_messages([{"role": "tool", "content": result}])
            loop.generate(time.monotonic() + 30)
        expected = loop.trajectory()
    got = ep.result("completed", None)
    assert got.prompt_ids == expected.prompt_ids
    assert got.response_ids == expected.response_ids
    assert got.loss_mask == expected.loss_mask


def test_a_paused_pool_makes_the_call_wait_not_fail(endpoint) -> None:
    """A weight push pauses the server: the call waits (the harness sees a slow answer), the
    turn records the new version, and the wait is not charged to the RUN deadline."""
    import dataclasses
    import threading

    ep = endpoint(SCRIPT)
    servers = ep.ctx.llm.pool.servers  # the session's own pool (the job's named server)
    url = next(iter(servers))
    servers[url] = dataclasses.replace(servers[url], paused=True)
    deadline_before = ep.ctx.deadline

    def push() -> None:
        time.sleep(1.0)
        servers[url] = dataclasses.replace(servers[url], weight_version="v8", paused=False)

    threading.Thread(target=push).start()
    started = time.monotonic()
    reply = openai_client(ep).chat.completions.create(model="policy", messages=START)
    assert time.monotonic() - started >= 0.9 and reply.choices[0].finish_reason == "tool_calls"
    assert recorded(ep)[0]["weight_version"] == "v8"
    paused = recorded(ep)[0]["extra"]["paused_seconds"]
    assert paused > 0  # the session waited on the paused server...
    assert ep.ctx.deadline - deadline_before == pytest.approx(paused, abs=1e-3)  # uncharged


# Tool messages carry their index: a delta rendered after the conversation's head alone says
# `#3` where the whole conversation's says `#5` (`TrajectoryBuilder.add_messages(speculate=True)`).
NUMBERED = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}{{ ' #' ~ loop.index0 if m['role'] == 'tool' else '' }}\n"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize("stream", [False, True])
def test_a_delta_rendered_head_only_is_checked_and_redone_before_the_reply(endpoint, stream) -> None:
    import uuid

    ep = endpoint(SCRIPT, template=NUMBERED + "{# " + uuid.uuid4().hex + " #}")  # its own tokenizer
    replies = run_conversation(openai_client(ep), stream)
    assert [finish for _, finish in replies] == ["tool_calls", "tool_calls", "stop"]
    turns = recorded(ep)
    deltas = [t["extra"]["delta_ids"] for t in turns[1:]]
    tok = ep.runner.tracker.current.builder.tok
    # the second merge was rendered after the head (`#3`), found wrong while the server
    # worked, and sent again as the whole render writes it: that is what was logged
    assert " #5" in tok.hf.decode(deltas[1]) and " #3" in tok.hf.decode(deltas[0])
    assert ep.runner.tracker.current.builder.redone_deltas == 1
    result = ep.result("completed", "harness_exit")
    gen = [t["generated_ids"] for t in turns]
    assert result.response_ids == gen[0] + deltas[0] + gen[1] + deltas[1] + gen[2]
    assert result.metrics["retokenization_drift"] == 0 and result.metrics["merges"] == 2
    assert result.metrics["redone_deltas"] == 1
    assert turns[2]["extra"]["prompt_tokens"] == len(result.prompt_ids) + len(gen[0] + deltas[0] + gen[1] + deltas[1])


@pytest.mark.parametrize("speculate", [True, False])
def test_a_template_that_fails_is_refused_the_same_with_or_without_head_only_deltas(endpoint, speculate) -> None:
    import uuid

    # the head-only probe (4 messages) renders; the whole conversation's (6) raises
    template = (
        "{% if messages | length > 5 %}{{ raise_exception('this template takes 5 messages') }}{% endif %}"
        + NUMBERED
        + "{# "
        + uuid.uuid4().hex
        + " #}"
    )
    ep = endpoint(SCRIPT, template=template)
    ep.runner.tracker.speculate = speculate
    client = uds_client(ep)
    headers = {"Authorization": f"Bearer {ep.token}"}
    messages = list(START)
    for n in range(3):
        answers = [
            client.post(
                "http://rollout/v1/chat/completions",
                headers=headers,
                json={"model": "p", "messages": messages, "tools": [BASH_TOOL]},
            )
            for _ in range(2 if n == 2 else 1)  # the failing call, and the harness trying it again
        ]
        if n < 2:
            reply = answers[0].json()["choices"][0]["message"]
            messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "ok"}]
    # the job's template, not the infrastructure: a 400 naming the template's own message,
    # counted as a refusal (the rollout ends `endpoint_refused`, not an infra failure)
    assert [a.status_code for a in answers] == [400, 400]
    for answer in answers:
        error = answer.json()["error"]
        assert error["code"] == "chat_template_error", error
        assert "this template takes 5 messages" in error["message"], error
    assert ep.fatal is None
    assert ep.counters.errors == {"chat_template_error": 2}
    assert ep.counters.refusals == {"chat_template": 2}
    assert len(recorded(ep)) == 2  # nothing generated for the failing call
    assert ep.runner.tracker.current.builder.trajectory().messages[-1]["role"] == "assistant"
