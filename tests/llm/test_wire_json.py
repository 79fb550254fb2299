"""The generation call's JSON (`encode_body` / `decode_body`, orjson): what a server receives
and how its answer parses are what the stdlib `json` gave, over a real HTTP server."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from agents.llm.backends.abstract import LOGPROB_FLOOR, GenerateRequest, ServerError, decode_body, encode_body
from agents.llm.backends.sglang import SGLangBackend
from agents.llm.backends.vllm import VLLMBackend


class _Echo(http.server.BaseHTTPRequestHandler):
    """Records each POST body and answers with the class's `answer` bytes."""

    protocol_version = "HTTP/1.1"
    bodies: list = []
    answer = b"{}"

    def do_POST(self):
        type(self).bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.answer)))
        self.end_headers()
        self.wfile.write(self.answer)

    def log_message(self, *args):
        pass


@pytest.fixture
def echo():
    _Echo.bodies = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def test_the_server_receives_what_json_dumps_would_have_sent(echo) -> None:
    body = {"prompt": [1, 2, 3], "logit_bias": {50256: -100.0}, "stop": ["é", "\u2028"], "temperature": 0.7}
    VLLMBackend()._call("POST", f"{echo}/v1/completions", body, 5.0)
    assert json.loads(_Echo.bodies[0]) == json.loads(json.dumps(body))  # int keys as strings
    assert json.loads(_Echo.bodies[0])["logit_bias"] == {"50256": -100.0}


@pytest.mark.parametrize(
    "answer",
    [
        b'{"choices": [{"token_ids": [1, 2], "logprobs": {"token_logprobs": [-0.5, -1e-09]}}]}',
        b'{"logprob": -Infinity, "other": NaN}',  # not JSON, but what json.loads read before
        b'{"lone": "\\ud800"}',  # a lone surrogate: orjson refuses it
    ],
)
def test_an_answer_parses_exactly_as_json_loads_parsed_it(echo, answer) -> None:
    _Echo.answer = answer
    try:
        got = VLLMBackend()._call("POST", f"{echo}/v1/completions", {}, 5.0)
    finally:
        _Echo.answer = b"{}"
    assert repr(got) == repr(json.loads(answer))  # NaN != NaN: compare the reprs


def test_an_integer_past_64_bits_is_the_one_difference_and_reads_as_a_float() -> None:
    """orjson reads it as a float (the stdlib as an int); no field raas reads holds one in a
    real server's answer (token ids are below the vocabulary size)."""
    assert decode_body(b'{"big": 123456789012345678901234567890}') == {"big": 1.2345678901234568e29}
    assert decode_body(b'{"ok": 18446744073709551615}') == {"ok": 2**64 - 1}


def test_an_answer_that_is_not_json_is_a_server_error(echo) -> None:
    _Echo.answer = b"<html>oops</html>"
    try:
        with pytest.raises(ServerError, match="not JSON"):
            VLLMBackend()._call("POST", f"{echo}/v1/completions", {}, 5.0)
    finally:
        _Echo.answer = b"{}"


def test_invalid_utf8_is_refused_by_both_codecs() -> None:
    with pytest.raises(ValueError):
        decode_body(b'{"a": "\xff"}')
    assert encode_body({"a": [1.5, None, True]}) == b'{"a":[1.5,null,true]}'


@pytest.mark.parametrize(
    "backend, answer",
    [
        (
            VLLMBackend,
            b'{"choices": [{"token_ids": [5, 6, 7], "finish_reason": "stop",'
            b' "logprobs": {"token_logprobs": [-0.25, -Infinity, NaN]}}]}',
        ),
        (
            SGLangBackend,
            b'{"meta_info": {"finish_reason": {"type": "stop"},'
            b' "output_token_logprobs": [[-0.25, 5], [-Infinity, 6], [NaN, 7]]}}',
        ),
    ],
)
def test_a_non_finite_logprob_reads_as_vllms_floor(echo, backend, answer) -> None:
    """vLLM answers a -inf logprob as -9999.0; a server that sends -Infinity or NaN is held to
    the same, so the trajectory's logprobs are numbers a trainer and JSONB can take."""
    _Echo.answer = answer
    try:
        gen = backend().generate(echo, GenerateRequest(prompt_ids=[1, 2], max_tokens=3, sampling={}, timeout=5.0))
    finally:
        _Echo.answer = b"{}"
    assert gen.token_ids == [5, 6, 7]
    assert gen.logprobs == [-0.25, LOGPROB_FLOOR, LOGPROB_FLOOR] and LOGPROB_FLOOR == -9999.0
