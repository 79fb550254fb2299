"""Google's generateContent routes through the official `google-genai` SDK over real HTTP on the
endpoint's Unix socket (the LLM simulator, a named fake, as the inference server; the real
SmolLM2 tokenizer). Every reply is also validated against `google.genai.types`, whose models
forbid unknown fields."""

# No `from __future__ import annotations`: older google-genai releases read a tool function's
# annotations as types (automatic function calling).
import json
import os
import subprocess
from pathlib import Path

import pytest
from google import genai
from google.genai import errors, types

from tests.harness.conftest import ids_of, loopback_relay, npm_install, recorded, uds_client

END = 2
CALL_LS = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>'
CALL_CAT = 'Reading it.<tool_call>\n{"name": "bash", "arguments": {"cmd": "cat a.txt"}}\n</tool_call>'
THINK_LS = "<think>\nI should list the files.\n</think>\n\n" + CALL_LS
SCRIPT = {"by_instance": {"i-1": [CALL_LS, CALL_CAT, "The bug is fixed."]}}
BASH = types.FunctionDeclaration(
    name="bash",
    description="Run a shell command",
    parameters=types.Schema(
        type=types.Type.OBJECT, properties={"cmd": types.Schema(type=types.Type.STRING)}, required=["cmd"]
    ),
)
SYSTEM = "You fix bugs."
TASK = types.Content(role="user", parts=[types.Part(text="Task i-1: fix it.")])


def google_client(ep, token: str | None = None, **http: object) -> genai.Client:
    """The official google-genai client, its base URL on the endpoint's socket."""
    options = types.HttpOptions(base_url="http://rollout", httpx_client=uds_client(ep), **http)
    return genai.Client(api_key=token or ep.token, http_options=options)


def config(**fields: object) -> types.GenerateContentConfig:
    """The call's config as the Gemini CLI sets it (declared tools, no automatic calling)."""
    return types.GenerateContentConfig(
        system_instruction=SYSTEM,
        tools=[types.Tool(function_declarations=[BASH])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True),
        **fields,
    )


def coalesce(parts: list) -> list:
    """Streamed parts with consecutive answer-text pieces joined, as a client accumulates them
    (the text streams live: a chunk per piece)."""
    out: list = []
    for part in parts:
        if out and part.text is not None and not part.thought and out[-1].text is not None and not out[-1].thought:
            out[-1] = types.Part(text=out[-1].text + part.text)
        else:
            out.append(part)
    return out


def tool_loop(client, stream: bool, cfg: types.GenerateContentConfig | None = None) -> list:
    """A tool loop the way the Gemini CLI writes it: the whole `contents` each call, the
    model's turn echoed (without thoughts), one `functionResponse` per call."""
    contents, replies = [TASK], []
    for _ in range(3):
        if stream:
            chunks = list(
                client.models.generate_content_stream(model="gemini-x", contents=contents, config=cfg or config())
            )
            parts = coalesce([p for c in chunks for p in c.candidates[0].content.parts])
            reply = (parts, chunks[-1].candidates[0].finish_reason, chunks[-1].usage_metadata)
        else:
            response = client.models.generate_content(model="gemini-x", contents=contents, config=cfg or config())
            candidate = response.candidates[0]
            reply = (candidate.content.parts, candidate.finish_reason, response.usage_metadata)
        replies.append(reply)
        parts = [p for p in reply[0] if not p.thought]
        contents = contents + [types.Content(role="model", parts=parts)]
        calls = [p.function_call for p in parts if p.function_call]
        if not calls:
            break
        results = [
            types.Part(
                function_response=types.FunctionResponse(
                    id=c.id, name=c.name, response={"output": f"ran {c.args['cmd']}"}
                )
            )
            for c in calls
        ]
        contents.append(types.Content(role="user", parts=results))
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
    assert result.response_ids == expected and sum(result.loss_mask) == sum(map(len, gen))
    assert result.metrics["samples"] == 1 and result.metrics["merges"] == calls - 1
    assert result.metrics["retokenization_drift"] == 0


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_loop_is_one_merged_sample(endpoint, stream) -> None:
    ep = endpoint(SCRIPT)
    (first, f1, u1), (second, f2, _), (third, f3, _) = tool_loop(google_client(ep), stream)
    assert f1 == f2 == f3 == types.FinishReason.STOP
    assert [p.function_call.name for p in first] == ["bash"] and first[0].function_call.args == {"cmd": "ls"}
    assert second[0].text == "Reading it." and second[1].function_call.args == {"cmd": "cat a.txt"}
    assert [p.text for p in third] == ["The bug is fixed."]
    assert u1.candidates_token_count == len(ids_of(CALL_LS)) + 1
    assert u1.prompt_token_count == len(recorded(ep)[0]["extra"]["prompt_ids"])
    assert u1.total_token_count == u1.prompt_token_count + u1.candidates_token_count
    assert [t["extra"]["api"] for t in recorded(ep)] == ["google"] * 3
    assert [t["extra"]["stream"] for t in recorded(ep)] == [stream] * 3
    assert_one_sample(ep, 3)


def test_the_gemini_cli_s_recorded_first_request_parses() -> None:
    """The request the Gemini CLI really sends (tests/fixtures/harness-requests, recorded)."""
    from agents.harness.google_wire import GoogleWire

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "harness-requests" / "gemini-cli.json"
    request = json.loads(fixture.read_text())
    route = GoogleWire().route(request["path"])
    call = route.parse_request(request["body"])
    assert route.model == "raas" and call.stream and call.messages[0]["role"] == "system"
    assert "run_shell_command" in {t["function"]["name"] for t in call.tools}
    assert "Fix the bug in intervals/core.py." in call.messages[-1]["content"]


def test_automatic_function_calling_merges_too(endpoint) -> None:
    """The SDK's own loop: a Python function as the tool, history built by the SDK."""
    ep = endpoint(SCRIPT)
    ran = []

    def bash(cmd: str) -> str:
        """Run a shell command."""
        ran.append(cmd)
        return f"ran {cmd}"

    client = google_client(ep)  # held: a collected client closes its httpx client
    chat = client.chats.create(
        model="gemini-x", config=types.GenerateContentConfig(system_instruction=SYSTEM, tools=[bash])
    )
    reply = chat.send_message("Task i-1: fix it.")
    assert reply.text == "The bug is fixed." and ran == ["ls", "cat a.txt"]
    assert_one_sample(ep, 3)


@pytest.mark.parametrize("include_thoughts", [True, False])
def test_thoughts_are_parts_when_asked_and_the_echo_merges(endpoint, include_thoughts) -> None:
    ep = endpoint({"by_instance": {"i-1": [THINK_LS, "Done.", "Done."]}})
    thinking = types.ThinkingConfig(include_thoughts=include_thoughts, thinking_budget=-1)
    replies = tool_loop(google_client(ep), stream=False, cfg=config(thinking_config=thinking))
    first = replies[0][0]
    expected = ["thought", "function_call"] if include_thoughts else ["function_call"]
    assert [("thought" if p.thought else "function_call") for p in first] == expected
    if include_thoughts:
        assert first[0].text == "I should list the files."
    assert replies[1][0][0].text == "Done."
    assert recorded(ep)[0]["generated_ids"] == ids_of(THINK_LS) + [END]
    assert ep.counters.ignored_params == {"thinkingConfig": 2}
    assert_one_sample(ep, 2)


def test_the_replies_are_google_s_types(endpoint) -> None:
    ep = endpoint(SCRIPT)
    http = uds_client(ep)
    body = {
        "contents": [TASK.model_dump(mode="json", by_alias=True, exclude_none=True)],
        "systemInstruction": {"parts": [{"text": SYSTEM}]},
        "tools": [{"functionDeclarations": [BASH.model_dump(mode="json", by_alias=True, exclude_none=True)]}],
    }
    url = "http://rollout/v1beta/models/gemini-x:generateContent"
    whole = http.post(url, json=body, headers={"x-goog-api-key": ep.token})
    assert whole.status_code == 200
    parsed = types.GenerateContentResponse.model_validate(whole.json())  # unknown fields fail here
    assert parsed.model_version == "gemini-x" and parsed.candidates[0].finish_reason == "STOP"
    streamed = http.post(url.replace(":generate", ":streamGenerate") + f"?alt=sse&key={ep.token}", json=body)
    assert streamed.headers["content-type"] == "text/event-stream"
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: ")]
    assert [types.GenerateContentResponse.model_validate(c).candidates[0].content.role for c in chunks] == ["model"]
    array = http.post(url.replace(":generate", ":streamGenerate"), json=body, headers={"x-goog-api-key": ep.token})
    assert [types.GenerateContentResponse.model_validate(c).model_version for c in array.json()] == ["gemini-x"]


@pytest.mark.parametrize(
    "http", [{}, {"api_version": "v1"}, {"base_url": "http://rollout/v1beta/"}, {"base_url": "http://rollout/api/"}]
)
def test_the_routes_a_base_url_makes_and_both_auths(endpoint, http) -> None:
    ep = endpoint({"default": ["Hello."]})
    options = {"base_url": "http://rollout", "httpx_client": uds_client(ep), **http}
    client = genai.Client(api_key=ep.token, http_options=types.HttpOptions(**options))
    assert client.models.generate_content(model="gemini-x", contents="hi").text == "Hello."
    with pytest.raises(errors.ClientError) as caught:
        stranger = google_client(ep, token="not-the-token")
        stranger.models.generate_content(model="gemini-x", contents="hi")
    assert caught.value.code == 401 and caught.value.status == "UNAUTHENTICATED"
    keyed = uds_client(ep).post(
        f"http://rollout/v1beta/models/gemini-x:generateContent?key={ep.token}",
        json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
    )
    assert keyed.status_code == 200 and keyed.json()["candidates"][0]["content"]["parts"] == [{"text": "Hello."}]


def test_tool_config_is_accepted_never_forced_and_counted(endpoint) -> None:
    ep = endpoint({"default": ["No tool needed.", CALL_LS, CALL_LS]})
    client = google_client(ep)
    contents = [types.Content(role="user", parts=[types.Part(text="Task: hi")])]
    modes = [("ANY", None), ("ANY", ["bash"]), ("NONE", None)]
    replies = []
    for mode, allowed in modes:
        calling = types.FunctionCallingConfig(mode=mode, allowed_function_names=allowed)
        response = client.models.generate_content(
            model="gemini-x",
            contents=contents,
            config=config(tool_config=types.ToolConfig(function_calling_config=calling)),
        )
        replies.append(response)
        contents = contents + [
            response.candidates[0].content,
            types.Content(role="user", parts=[types.Part(text="again")]),
        ]
        if response.function_calls:
            call = response.function_calls[0]
            contents[-1] = types.Content(
                role="user",
                parts=[types.Part(function_response=types.FunctionResponse(name=call.name, response={"output": "a"}))],
            )
    assert replies[0].text == "No tool needed."  # as sampled: ANY is not forced
    assert replies[1].function_calls[0].name == "bash"
    assert replies[2].text == CALL_LS and not replies[2].function_calls  # NONE: markup is text
    assert ep.counters.tool_choice_unmet == 1 and ep.counters.tool_calls == 1 and ep.counters.merges == 2


def test_generation_config_max_tokens_cuts_and_sampling_is_ignored(endpoint) -> None:
    ep = endpoint({"default": ["one two three four five six seven eight"]})
    client = google_client(ep)
    response = client.models.generate_content(
        model="gemini-x",
        contents="Task: count",
        config=types.GenerateContentConfig(
            max_output_tokens=3, temperature=0.2, top_p=0.9, top_k=5, seed=1, stop_sequences=["\n\n"]
        ),
    )
    assert response.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS
    assert response.usage_metadata.candidates_token_count == 3
    assert recorded(ep)[0]["finish_reason"] == "turn_length"
    assert ep.counters.ignored_params == {"temperature": 1, "topP": 1, "topK": 1, "seed": 1}


def test_stop_sequences_are_honoured(endpoint) -> None:
    ep = endpoint({"default": ["one two. three four"]})
    client = google_client(ep)
    response = client.models.generate_content(
        model="gemini-x", contents="Task: count", config=types.GenerateContentConfig(stop_sequences=["."])
    )
    assert response.text == "one two" and response.candidates[0].finish_reason == types.FinishReason.STOP
    assert recorded(ep)[0]["extra"]["stop_sequence"] == "."


def test_refusals_name_the_field_in_google_s_error_shape(endpoint) -> None:
    ep = endpoint(SCRIPT, max_model_len=256)
    client = google_client(ep)
    image = types.Part(inline_data=types.Blob(mime_type="image/png", data=b"\x89PNG"))
    with pytest.raises(errors.ClientError, match="inlineData") as caught:
        client.models.generate_content(model="gemini-x", contents=[types.Content(role="user", parts=[image])])
    assert caught.value.code == 400 and caught.value.status == "INVALID_ARGUMENT"
    with pytest.raises(errors.ClientError, match="candidateCount"):
        client.models.generate_content(
            model="gemini-x", contents="hi", config=types.GenerateContentConfig(candidate_count=2)
        )
    with pytest.raises(
        errors.ClientError, match=r"The input token count \(\d+\) exceeds the maximum number of tokens allowed \(256\)"
    ):
        client.models.generate_content(model="gemini-x", contents="Task i-1: " + "very long text " * 200)
    assert ep.counters.errors == {"invalid_request": 2, "context_length_exceeded": 1}


def test_google_s_own_tools_are_left_out_and_counted(endpoint) -> None:
    ep = endpoint({"default": ["Hello."]})
    tools = [types.Tool(google_search=types.GoogleSearch()), types.Tool(function_declarations=[BASH])]
    client = google_client(ep)
    response = client.models.generate_content(
        model="gemini-x", contents="hi", config=types.GenerateContentConfig(tools=tools)
    )
    assert response.text == "Hello." and ep.counters.ignored_params == {"tools.googleSearch": 1}
    assert [t["function"]["name"] for t in ep.result("completed", None).extra["tools"]] == ["bash"]


@pytest.fixture(scope="session")
def gemini_cli(tmp_path_factory) -> Path:
    """The Gemini CLI from npm (`@google/gemini-cli`)."""
    return npm_install(tmp_path_factory.mktemp("gemini"), "@google/gemini-cli", "gemini")


@pytest.mark.slow
def test_the_gemini_cli_runs_a_tool_loop_as_one_sample(endpoint, gemini_cli, tmp_path) -> None:
    """`gemini -p`, unmodified, its base URL on the endpoint: it streams (`?alt=sse`), asks for
    thoughts and keeps none in its history; the turn is made whole again and merges."""
    think = "<think>\nLet me look.\n</think>\n\n"
    call = '<tool_call>\n{"name": "run_shell_command", "arguments": {"command": "cat a.txt"}}\n</tool_call>'
    ep = endpoint({"default": [think + call, "The file says hello."]}, max_model_len=32768)
    settings = {
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
        "privacy": {"usageStatisticsEnabled": False},
        "general": {"disableAutoUpdate": True},
    }
    (tmp_path / ".gemini").mkdir()
    (tmp_path / ".gemini" / "settings.json").write_text(json.dumps(settings))
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("hello\n")
    with loopback_relay(ep.socket_path) as port:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(tmp_path),
            "GEMINI_API_KEY": ep.token,
            "GOOGLE_GEMINI_BASE_URL": f"http://127.0.0.1:{port}",
        }
        args = [str(gemini_cli), "-p", "Task i-1: what does a.txt say?", "--yolo", "-m", "gemini-2.5-flash"]
        done = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("The file says hello.")
    counters = ep.counters
    assert counters.calls == 2 and counters.tool_calls == 1 and counters.failed_calls == 0
    turns = recorded(ep)
    assert [t["extra"]["api"] for t in turns] == ["google"] * 2 and all(t["extra"]["stream"] for t in turns)
    assert turns[0]["text"].startswith(think)
    assert_one_sample(ep, 2)
