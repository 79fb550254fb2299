"""The Responses route (`POST /v1/responses`) through the official `openai` SDK and the OpenAI
Agents SDK over real HTTP on the endpoint's Unix socket (the LLM simulator, a named fake, as
the inference server; the real SmolLM2 tokenizer)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import openai
import pytest
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseReasoningItem

from tests.harness.conftest import ids_of, loopback_relay, npm_install, openai_client, recorded

END = 2
CALL_LS = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>'
CALL_CAT = 'Reading it.<tool_call>\n{"name": "bash", "arguments": {"cmd": "cat a.txt"}}\n</tool_call>'
THINK_LS = "<think>\nI should list the files.\n</think>\n\n" + CALL_LS
SCRIPT = {"by_instance": {"i-1": [CALL_LS, CALL_CAT, "The bug is fixed."]}}
TOOLS = [
    {
        "type": "function",
        "name": "bash",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        "strict": False,
    }
]
INSTRUCTIONS = "You fix bugs."
TASK = {"role": "user", "content": [{"type": "input_text", "text": "Task i-1: fix it."}]}


def tool_loop(client, stream: bool, calls: int = 3, **kwargs) -> list:
    """A tool loop the way Codex and the Agents SDK write it: the whole input every call
    (`store: false`), the reply's output items echoed, one `function_call_output` per call."""
    items, replies = [TASK], []
    for _ in range(calls):
        args = {"model": "policy", "instructions": INSTRUCTIONS, "input": items, "tools": TOOLS, "store": False}
        if stream:
            with client.responses.stream(**args, **kwargs) as events:
                reply = events.get_final_response()
        else:
            reply = client.responses.create(**args, **kwargs)
        replies.append(reply)
        items = items + [item.model_dump(exclude_unset=True) for item in reply.output]
        outputs = [
            {"type": "function_call_output", "call_id": o.call_id, "output": f"ran {json.loads(o.arguments)['cmd']}"}
            for o in reply.output
            if o.type == "function_call"
        ]
        if not outputs:
            break
        items += outputs
    return replies


def assert_one_sample(ep, calls: int) -> None:
    """Every call after the first merged: one token-exact sample."""
    turns = recorded(ep)
    assert [t["extra"]["merged"] for t in turns] == [False] + [True] * (calls - 1)
    result = ep.result("completed", None)
    gen = [t["generated_ids"] for t in turns]
    expected = gen[0]
    for turn, ids in zip(turns[1:], gen[1:]):
        expected = expected + turn["extra"]["delta_ids"] + ids
    assert result.prompt_ids == turns[0]["extra"]["prompt_ids"]
    assert result.response_ids == expected and sum(result.loss_mask) == sum(map(len, gen))
    assert result.metrics["samples"] == 1 and result.metrics["merges"] == calls - 1
    assert result.metrics["splits"] == 0 and result.metrics["retokenization_drift"] == 0


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_loop_is_one_merged_sample(endpoint, stream) -> None:
    ep = endpoint(SCRIPT)
    first, second, third = tool_loop(openai_client(ep), stream)
    assert first.status == second.status == third.status == "completed"
    assert [o.type for o in first.output] == ["function_call"] and isinstance(first.output[0], ResponseFunctionToolCall)
    call = first.output[0]
    assert call.name == "bash" and json.loads(call.arguments) == {"cmd": "ls"} and call.call_id.startswith("call_")
    assert [o.type for o in second.output] == ["message", "function_call"]
    assert isinstance(second.output[0], ResponseOutputMessage)
    assert second.output[0].content[0].text == "Reading it."
    assert third.output_text == "The bug is fixed." and [o.type for o in third.output] == ["message"]
    assert first.usage.output_tokens == len(ids_of(CALL_LS)) + 1
    assert first.usage.input_tokens == len(recorded(ep)[0]["extra"]["prompt_ids"])
    assert [t["extra"]["api"] for t in recorded(ep)] == ["responses"] * 3
    assert [t["generated_ids"] for t in recorded(ep)][2] == ids_of("The bug is fixed.") + [END]
    assert [t["extra"]["stream"] for t in recorded(ep)] == [stream] * 3
    assert_one_sample(ep, 3)


def test_codex_s_recorded_first_request_parses() -> None:
    """The request Codex really sends (tests/fixtures/harness-requests, recorded from the CLI)."""
    from agents.harness.responses_wire import ResponsesWire

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "harness-requests" / "codex.json"
    request = json.loads(fixture.read_text())
    call = ResponsesWire().parse_request(request["body"])
    assert call.stream and "exec_command" in {t["function"]["name"] for t in call.tools}
    assert call.ignored == ["reasoning", "tools.web_search"]
    assert call.messages[-1] == {"role": "user", "content": "Fix the bug in intervals/core.py."}


def test_the_stream_is_the_api_s_event_sequence(endpoint) -> None:
    ep = endpoint({"by_instance": {"i-1": [CALL_CAT]}})
    events = list(
        openai_client(ep).responses.create(
            model="policy", instructions=INSTRUCTIONS, input=[TASK], tools=TOOLS, stream=True
        )
    )
    # The text streams live (a delta per piece, `tests/harness/test_streaming.py`): one here.
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert "".join(e.delta for e in deltas) == "Reading it." and len(deltas) > 1
    events = events[:4] + [deltas[0].model_copy(update={"delta": "Reading it."})] + events[4 + len(deltas) :]
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    numbers = [e.sequence_number for e in events]
    assert numbers[:5] == list(range(5)) and numbers[5:] == list(range(4 + len(deltas), 4 + len(deltas) + 8))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert events[2].item.id == events[7].item.id == events[-1].response.output[0].id
    assert events[4].delta == "Reading it." and events[8].item.arguments == ""
    assert json.loads(events[10].arguments) == {"cmd": "cat a.txt"}
    done = events[-1].response
    assert done.id == events[0].response.id and [o.type for o in done.output] == ["message", "function_call"]
    assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens


@pytest.mark.parametrize(("echo_reasoning", "stream"), [(True, False), (False, False), (True, True)])
def test_reasoning_is_an_item_and_the_echo_still_merges(endpoint, echo_reasoning, stream) -> None:
    ep = endpoint({"by_instance": {"i-1": [THINK_LS, "Done."]}})
    client = openai_client(ep)
    args = {"model": "policy", "input": [TASK], "tools": TOOLS, "include": ["reasoning.encrypted_content"]}
    if stream:
        with client.responses.stream(**args) as events:
            kinds = [e.type for e in events]
            first = events.get_final_response()
        assert kinds[2:6] == [
            "response.output_item.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.output_item.done",
        ]
    else:
        first = client.responses.create(**args)
    reasoning, call = first.output
    assert isinstance(reasoning, ResponseReasoningItem) and isinstance(call, ResponseFunctionToolCall)
    assert reasoning.content[0].text == "I should list the files."
    echoed = [o.model_dump(exclude_unset=True) for o in first.output if echo_reasoning or o.type != "reasoning"]
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "a.txt"}
    second = client.responses.create(model="policy", input=[TASK, *echoed, output], tools=TOOLS)
    assert second.output_text == "Done."
    assert recorded(ep)[0]["generated_ids"] == ids_of(THINK_LS) + [END]
    assert_one_sample(ep, 2)


def test_previous_response_id_extends_the_conversation(endpoint) -> None:
    ep = endpoint(SCRIPT)
    client = openai_client(ep)
    first = client.responses.create(model="policy", instructions=INSTRUCTIONS, input=[TASK], tools=TOOLS)
    output = {"type": "function_call_output", "call_id": first.output[0].call_id, "output": "ran ls"}
    second = client.responses.create(
        model="policy", instructions=INSTRUCTIONS, previous_response_id=first.id, input=[output], tools=TOOLS
    )
    assert second.previous_response_id == first.id and second.output[0].content[0].text == "Reading it."
    assert_one_sample(ep, 2)
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model="policy", previous_response_id="resp_unknown", input="hi")


def test_tool_choice_is_accepted_never_forced_and_counted(endpoint) -> None:
    ep = endpoint({"default": ["No tool needed.", CALL_LS, CALL_LS, CALL_LS]})
    client = openai_client(ep)
    named = {"type": "function", "name": "bash"}
    choices = ["required", named, {"type": "allowed_tools", "mode": "required", "tools": [named]}, "none"]
    items, replies = [{"role": "user", "content": "Task: hi"}], []
    for choice in choices:
        reply = client.responses.create(model="policy", input=items, tools=TOOLS, tool_choice=choice)
        replies.append(reply)
        items = items + [o.model_dump(exclude_unset=True) for o in reply.output]
        calls = [o for o in reply.output if o.type == "function_call"]
        items += [{"type": "function_call_output", "call_id": c.call_id, "output": "a.txt"} for c in calls]
        items += [] if calls else [{"role": "user", "content": "again"}]
    # returned as sampled, as the real API would: no call although one was required ...
    assert replies[0].output_text == "No tool needed." and replies[0].tool_choice == "required"
    assert [o.type for o in replies[1].output] == [o.type for o in replies[2].output] == ["function_call"]
    assert replies[3].output_text == CALL_LS  # ... and with "none" the markup is only text
    assert ep.counters.tool_choice_unmet == 1 and ep.counters.tool_calls == 2
    assert ep.counters.failed_calls == 0 and ep.counters.merges == 3


def test_hosted_tools_are_left_out_and_namespaced_functions_offered(endpoint) -> None:
    """As Codex sends them: `web_search` (the policy cannot call it here: left out, counted) and
    a `namespace` tool whose functions are offered and whose calls name the namespace."""
    ep = endpoint({"default": [CALL_LS]})
    spaced = {"type": "namespace", "name": "shell_tools", "description": "Shell.", "tools": [{**TOOLS[0]}]}
    raw = openai_client(ep).responses.with_raw_response.create(
        model="policy", input="hi", tools=[spaced, {"type": "web_search"}, {"type": "file_search"}]
    )
    assert raw.headers["x-raas-ignored-params"] == "tools.file_search,tools.web_search"
    call = raw.parse().output[0]
    assert call.type == "function_call" and call.name == "bash" and call.namespace == "shell_tools"
    assert ep.result("completed", None).extra["tools"] == [
        {"type": "function", "function": {k: TOOLS[0][k] for k in ("name", "description", "parameters")}}
    ]


def test_stored_state_and_images_are_refused_by_name(endpoint) -> None:
    ep = endpoint(SCRIPT)
    client = openai_client(ep)
    with pytest.raises(openai.BadRequestError, match="item_reference"):
        client.responses.create(model="policy", input=[TASK, {"type": "item_reference", "id": "msg_1"}])
    with pytest.raises(openai.BadRequestError, match="conversation"):
        client.responses.create(model="policy", input="hi", conversation="conv_1")
    with pytest.raises(openai.BadRequestError, match="input_image"):
        client.responses.create(
            model="policy",
            input=[{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}],
        )
    assert ep.counters.calls == 3 and ep.counters.errors == {"invalid_request": 3}


def test_sampling_fields_are_ignored_and_max_output_tokens_cuts(endpoint) -> None:
    ep = endpoint({"default": ["one two three four five six seven eight"]})
    raw = openai_client(ep).responses.with_raw_response.create(
        model="policy",
        input="Task: count",
        max_output_tokens=3,
        temperature=0.2,
        top_p=0.9,
        reasoning={"effort": "low"},
        text={"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"}}},
        metadata={"k": "v"},
        parallel_tool_calls=False,
        include=["reasoning.encrypted_content"],
        store=False,
        truncation="disabled",
    )
    assert raw.headers["x-raas-ignored-params"] == "temperature,top_p,reasoning"
    assert raw.headers["x-raas-unenforced-params"] == "text.format"  # answered as sampled
    reply = raw.parse()
    assert reply.status == "incomplete" and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage.output_tokens == 3 and reply.metadata == {"k": "v"} and reply.parallel_tool_calls is False
    assert recorded(ep)[0]["finish_reason"] == "turn_length"
    odd = openai_client(ep).responses.create(model="policy", input="Task: count", metadata={"k": 1})
    assert odd.status == "completed" and odd.metadata is None  # an echo its type refuses is left out


def test_context_overflow_is_the_api_s_error(endpoint) -> None:
    ep = endpoint(SCRIPT, max_model_len=256)
    with pytest.raises(openai.BadRequestError) as caught:
        openai_client(ep).responses.create(model="policy", input="Task i-1: " + "very long text " * 200)
    assert caught.value.code == "context_length_exceeded"
    assert "maximum context length is 256 tokens" in caught.value.message


@pytest.fixture(scope="session")
def agents_sdk_env(tmp_path_factory) -> Path:
    """A harness environment with the OpenAI Agents SDK from PyPI, built the way raas builds
    one (`sandbox.environments`, the system interpreter); apart from raas's own venv, since
    the SDK's import name `agents` is also raas's."""
    from sandbox.environments import build_environment

    return build_environment("openai-agents", ["openai-agents>=0.24"], root=tmp_path_factory.mktemp("envs"))


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True])
def test_an_openai_agents_sdk_agent_runs_its_tool_loop_as_one_sample(
    endpoint, agents_sdk_env, tmp_path, stream
) -> None:
    """The Agents SDK's default model (`OpenAIResponsesModel`) and its runner, unmodified."""
    ep = endpoint(SCRIPT)
    env = {"PATH": "/usr/bin:/bin", "RAAS_SOCKET": ep.socket_path, "RAAS_TOKEN": ep.token}
    env.update({"RAAS_STREAM": "1"} if stream else {})
    done = subprocess.run(
        [str(agents_sdk_env / "bin" / "python3"), str(Path(__file__).with_name("agents_sdk_loop.py"))],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"final_output": "The bug is fixed.", "ran": ["ls", "cat a.txt"]}
    assert ep.counters.tool_calls == 2 and ep.counters.failed_calls == 0
    assert [t["extra"]["stream"] for t in recorded(ep)] == [stream] * 3
    assert_one_sample(ep, 3)


@pytest.fixture(scope="session")
def codex_cli(tmp_path_factory) -> Path:
    """Codex CLI from npm (`@openai/codex`: its Rust binary inside the package)."""
    return npm_install(tmp_path_factory.mktemp("codex"), "@openai/codex", "codex")


@pytest.mark.slow
def test_codex_cli_runs_a_tool_loop_as_one_sample(endpoint, codex_cli, tmp_path) -> None:
    """`codex exec`, unmodified, with a model provider on the endpoint (wire_api responses):
    its streamed requests, its default tools (`web_search` and a `namespace` tool among them)."""
    call = '<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "cat a.txt"}}\n</tool_call>'
    ep = endpoint({"default": [call, "The file says hello."]}, max_model_len=32768)
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (work / "a.txt").write_text("hello\n")
    with loopback_relay(ep.socket_path) as port:
        (home / "config.toml").write_text(
            'model = "raas-policy"\nmodel_provider = "raas"\n[model_providers.raas]\nname = "raas"\n'
            f'base_url = "http://127.0.0.1:{port}/v1"\nenv_key = "RAAS_KEY"\nwire_api = "responses"\n'
        )
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "CODEX_HOME": str(home), "RAAS_KEY": ep.token}
        prompt = "Task i-1: what does a.txt say?"
        args = [str(codex_cli), "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", prompt]
        done = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("The file says hello.")
    counters = ep.counters
    assert counters.calls == 2 and counters.tool_calls == 1 and counters.failed_calls == 0
    assert counters.ignored_params.get("tools.web_search") == 2
    turns = recorded(ep)
    assert [t["extra"]["api"] for t in turns] == ["responses"] * 2 and all(t["extra"]["stream"] for t in turns)
    assert_one_sample(ep, 2)
