"""Streamed generation (`stream: true` on vLLM's /v1/completions) against the LLM simulator
over real HTTP: the text arrives in pieces while decoding, the ids and logprobs are exactly the
non-streamed answer's (stop strings, length cuts), and a cancel mid-stream aborts it."""

from __future__ import annotations

import threading
import time

import pytest

from agents.llm import LLMSession
from agents.llm.backends import GenerateRequest, get_backend_class
from core.errors import RolloutCancelled
from tests.llm.conftest import TOOLS, deadline
from tests.llm.test_session import ids_of, spec_for

REPLY = 'Let me look. <tool_call>{"name": "bash", "arguments": {"cmd": "ls -la"}}</tool_call> done élan'
PROMPT = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "task-1: look"}]


class Sink:
    """Collects a streamed turn's text with the time each piece arrived."""

    def __init__(self) -> None:
        self.pieces: list[tuple[float, str]] = []
        self.restarts = 0

    def delta(self, text: str) -> None:
        self.pieces.append((time.monotonic(), text))

    def restart(self) -> None:
        self.restarts += 1

    @property
    def text(self) -> str:
        return "".join(text for _, text in self.pieces)


def request(prompt: list[int], on_delta=None, **extra) -> GenerateRequest:
    return GenerateRequest(
        prompt_ids=prompt, max_tokens=200, sampling={}, timeout=10, model="sim", on_delta=on_delta, **extra
    )


@pytest.mark.parametrize("stop", [[], ["ls -la"]])
def test_streamed_generation_equals_the_non_streamed_one(simulators, stop) -> None:
    url, _ = simulators({"default": [REPLY], "latency": 0.3})
    backend = get_backend_class("vllm")()
    prompt = ids_of("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    whole = backend.generate(url, request(prompt, stop=stop))
    sink = Sink()
    started = time.monotonic()
    streamed = backend.generate(url, request(prompt, sink.delta, stop=stop))
    ended = time.monotonic()
    assert streamed.token_ids == whole.token_ids and streamed.logprobs == whole.logprobs
    assert (streamed.finish_reason, streamed.stop_reason) == (whole.finish_reason, whole.stop_reason)
    if stop:
        assert whole.stop_reason == "ls -la" and sink.text == REPLY[: REPLY.index("ls -la")]
    else:
        assert whole.token_ids == ids_of(REPLY) + [2] and sink.text == REPLY
    # Token by token: many pieces, the first well before the last (latency spread over them).
    assert len(sink.pieces) > 10
    assert sink.pieces[0][0] - started < (ended - started) / 3


def test_a_session_streams_and_records_the_same_turn(simulators) -> None:
    url, _ = simulators({"by_instance": {"task-1": [REPLY]}})
    records = []
    for stream in (None, Sink()):
        with LLMSession.open(spec_for(url), {"max_tokens": 200}, "r1") as s:
            s.start(PROMPT, TOOLS)
            gen = s.generate(deadline(), stream=stream)
            records.append((gen.token_ids, gen.logprobs, gen.text, s.trajectory().response_ids))
            if stream is not None:
                assert stream.text == REPLY and stream.restarts == 0
    assert records[0] == records[1]


def test_sglang_does_not_stream_and_the_turn_is_whole(simulators) -> None:
    url, _ = simulators({"by_instance": {"task-1": [REPLY]}})
    sink = Sink()
    with LLMSession.open(spec_for(url, backend="sglang"), {"max_tokens": 200}, "r1") as s:
        s.start(PROMPT, TOOLS)
        gen = s.generate(deadline(), stream=sink)
    assert sink.pieces == [] and gen.token_ids == ids_of(REPLY) + [2]


def test_a_cancel_mid_stream_aborts_the_request(simulators) -> None:
    url, _ = simulators({"by_instance": {"task-1": [REPLY]}, "latency": 5.0})
    sink, cancel = Sink(), threading.Event()
    with LLMSession.open(spec_for(url), {"max_tokens": 200}, "r1") as s:
        s.start(PROMPT, TOOLS)
        threading.Timer(1.0, cancel.set).start()
        started = time.monotonic()
        with pytest.raises(RolloutCancelled):
            s.generate(deadline(), cancelled=cancel.is_set, stream=sink)
    assert time.monotonic() - started < 3.0
    assert 0 < len(sink.pieces) < len(ids_of(REPLY))  # some text came, not all of it


def test_a_server_lost_mid_stream_fails_over_and_restarts_the_text(simulators) -> None:
    # Two servers (the spec's first is picked first); it dies while streaming: the turn is
    # asked again on the other, whose text starts over (`restart`), and the turn recorded is
    # the second server's, whole.
    first, stop_first = simulators({"by_instance": {"task-1": [REPLY]}, "latency": 3.0})
    second, _ = simulators({"by_instance": {"task-1": [REPLY]}})
    spec = spec_for(first)
    spec["servers"].append({"url": second, "weight_version": "step-3"})
    sink = Sink()
    with LLMSession.open(spec, {"max_tokens": 200}, "r1") as s:
        s.start(PROMPT, TOOLS)
        threading.Timer(1.0, stop_first).start()
        gen = s.generate(deadline(), stream=sink)
    assert sink.restarts == 1 and gen.server == second
    assert gen.token_ids == ids_of(REPLY) + [2]
    assert sink.text.startswith(REPLY[:3]) and sink.text.endswith(REPLY)  # a part, then all of it again
