"""LLM simulator (a fake, named as such): a scripted server speaking vLLM's token-id subset.

For tests and benchmarks where no real model can run. It answers
`POST /v1/completions` (prompt = token ids, `return_token_ids`, `logprobs`; `stream: true`
streams it as vLLM does, `fakellm.stream`, one chunk per token over the reply's latency; with a
capacity model they start once its engine has decoded the whole reply), SGLang's
`POST /generate`, a minimal `POST /v1/chat/completions`, `GET /v1/models`, `GET /health`, and
`GET /sim/stats` (request counts, for balancing tests; `started` counts requests as they
arrive, `requests` as they are answered, `turn:<instance key>:<turn>` answers per turn: a
count above 1 is a re-generated turn, which the fault benchmark reports; `last_stream_first_ms`
the milliseconds from the last streamed request's handling to its first chunk written, which
a time-to-first-token benchmark subtracts to leave out the pacing's sleep), and with a capacity
model `GET /metrics` (Prometheus text with vLLM's metric names).

The replies come from a script (`fakellm.script`: its format, which reply answers which
prompt, wrong-reply draws, logprobs).

`raas llm-sim` with no arguments serves the bundled SmolLM2 tokenizer (`BUNDLED_TOKENIZER`)
with the `demo-math` policy (`fakellm/demo_policy.py`), which solves `examples/math.jsonl`
through the python tool: the no-GPU demo of the README's quick start.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from fakellm.capacity import CapacityModel, Engine, render_metrics
from fakellm.stream import stream_events
from fakellm.script import Script

log = logging.getLogger(__name__)

BUNDLED_TOKENIZER = Path(__file__).resolve().parent / "data" / "smollm2-tokenizer"
DEFAULT_SCRIPT: dict[str, Any] = {"policy": "demo-math"}


class SimulatorServer(ThreadingHTTPServer):
    """The HTTP server holding a Script, a max context length and request counters."""

    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], script: Script, max_model_len: int | None, report_max_model_len: bool = True
    ):
        super().__init__(address, _Handler)
        self.engine = Engine(script.capacity) if script.capacity is not None else None
        self.script = script
        self.max_model_len = max_model_len
        self.report_max_model_len = report_max_model_len
        self.stats: Counter[str] = Counter()
        self.stats_lock = threading.Lock()
        self._open: set[socket.socket] = set()  # keep-alive connections being served

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.stats_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.stats_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def server_close(self) -> None:
        """Close the socket, cut the open keep-alive connections (a stopped server is gone
        for its clients too, as a killed process would be) and stop the engine thread."""
        super().server_close()
        with self.stats_lock:
            open_connections = list(self._open)
        for sock in open_connections:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # closed meanwhile
                pass
        if self.engine is not None:
            self.engine.stop()

    @property
    def url(self) -> str:
        """Base URL clients use."""
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


class _Handler(BaseHTTPRequestHandler):
    server: SimulatorServer
    protocol_version = "HTTP/1.1"  # keep-alive, as vLLM's server: clients reuse connections
    # TCP_NODELAY, as uvicorn sets it for vLLM: headers and body go out in two writes, and
    # with Nagle the body waited for the client's delayed ACK (~40 ms on every answer).
    disable_nagle_algorithm = True

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet: tests start many of them
        log.debug("llm-sim: " + fmt, *args)

    def _send(self, status: int, body: dict[str, Any]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        try:
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (cancel, kill)
            self.close_connection = True

    def _client_gone(self) -> bool:
        """True once the client closed its side (the request body was already read)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def do_GET(self) -> None:
        script = self.server.script
        if self.path == "/health":
            self._send(200, {})
        elif self.path == "/v1/models":
            self._send(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": script.model,
                            "object": "model",
                            "root": script.model,
                            "max_model_len": self.server.max_model_len if self.server.report_max_model_len else None,
                        }
                    ],
                },
            )
        elif self.path == "/sim/stats":
            with self.server.stats_lock:
                stats: dict[str, Any] = dict(self.server.stats)
            if self.server.engine is not None:
                stats["engine"] = self.server.engine.snapshot()
            stats["weights"] = script.weights.snapshot()
            self._send(200, stats)
        elif self.path == "/metrics" and self.server.engine is not None:
            text = render_metrics(self.server.engine.snapshot(), script.model).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)
        else:
            self._send(404, {"error": f"no route {self.path}"})

    def do_POST(self) -> None:
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        except ValueError:
            self._send(400, {"error": "body is not JSON"})
            return
        routes = {"/v1/completions": self._completions, "/generate": self._generate, "/v1/chat/completions": self._chat}
        route = routes.get(self.path)
        weights = None if route else self.server.script.weights.handle(self.path, body)
        if route is None and weights is None:
            self._send(404, {"error": f"no route {self.path}"})
            return
        if route == self._completions and body.get("stream"):
            self._stream_completion(body)
            return
        status, answer = route(body) if route else weights
        if status == 499:  # aborted: the client is gone, there is no one to answer
            self.close_connection = True
            return
        self._send(status, answer)

    def _run(
        self,
        prompt: Any,
        max_tokens: int,
        seed: Any = None,
        model: str | None = None,
        stop: Any = None,
        include_stop: bool = False,
        paced: bool = False,
    ) -> tuple[int, dict[str, Any]]:
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            return 400, {"error": "the simulator only accepts a prompt of token ids"}
        limit = self.server.max_model_len
        if limit is not None and len(prompt) + max_tokens > limit:
            # vLLM's wording, which clients match on.
            return 400, {
                "error": f"This model's maximum context length is {limit} tokens. "
                f"However, you requested {len(prompt) + max_tokens} tokens "
                f"({len(prompt)} in the messages, {max_tokens} in the "
                "completion)."
            }
        with self.server.stats_lock:
            self.server.stats["started"] += 1
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        result = self.server.script.complete(
            prompt, max_tokens, self._client_gone, self.server.engine, seed, model, stops, include_stop, paced
        )
        if result is None:
            with self.server.stats_lock:
                self.server.stats["aborted"] += 1
            return 499, {"error": "client disconnected"}
        with self.server.stats_lock:
            self.server.stats["requests"] += 1
            self.server.stats[f"instance:{result['instance']}"] += 1
            self.server.stats[f"turn:{result['instance']}:{result['turn']}"] += 1
        return 200, result

    def _stream_completion(self, body: dict[str, Any]) -> None:
        """`stream: true`: the answer as vLLM streams it (`fakellm.stream`), the reply's
        latency spread evenly over its tokens."""
        handled = time.monotonic()
        status, r = self._run(
            body.get("prompt"),
            int(body.get("max_tokens") or 16),
            body.get("seed"),
            body.get("model"),
            body.get("stop"),
            bool(body.get("include_stop_str_in_output")),
            paced=True,
        )
        if status == 499:
            self.close_connection = True
            return
        if status != 200:
            self._send(status, r)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for k, event in enumerate(stream_events(self.server.script, body, r)):
                data = event.encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
                if k == 0:
                    with self.server.stats_lock:
                        self.server.stats["last_stream_first_ms"] = (time.monotonic() - handled) * 1000
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):  # the client gave up: vLLM aborts
            self.close_connection = True
            with self.server.stats_lock:
                self.server.stats["aborted"] += 1

    def _completions(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        status, r = self._run(
            body.get("prompt"),
            int(body.get("max_tokens") or 16),
            body.get("seed"),
            body.get("model"),
            body.get("stop"),
            bool(body.get("include_stop_str_in_output")),
        )
        if status != 200:
            return status, r
        choice = {
            "index": 0,
            "text": r["text"],
            "finish_reason": r["finish_reason"],
            "stop_reason": r["stop_reason"],
            "token_ids": r["ids"],
            "prompt_token_ids": body["prompt"],
            "logprobs": {
                "token_logprobs": r["logprobs"],
                "tokens": [self.server.script.tok.id_to_token(t) for t in r["ids"]],
            },
        }
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(r["ids"])}
        return 200, {
            "id": "cmpl-sim",
            "object": "text_completion",
            "model": self.server.script.model,
            "choices": [choice],
            "usage": usage,
        }

    def _generate(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        params = body.get("sampling_params") or {}
        status, r = self._run(
            body.get("input_ids"),
            int(params.get("max_new_tokens") or 16),
            params.get("sampling_seed"),
            stop=params.get("stop"),
        )
        if status != 200:
            return status, r
        finish: dict[str, Any] = {"type": r["finish_reason"]}
        if r["stop_reason"] is not None:
            finish["matched"] = r["stop_reason"]  # SGLang names the stop string it matched
        meta = {
            "finish_reason": finish,
            "output_token_logprobs": [[lp, t, None] for lp, t in zip(r["logprobs"], r["ids"])],
            "prompt_tokens": len(body["input_ids"]),
            "completion_tokens": len(r["ids"]),
        }
        return 200, {"text": r["text"], "output_ids": r["ids"], "meta_info": meta}

    def _chat(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        script = self.server.script
        messages = body.get("messages") or []
        text = "\n".join(str(m.get("content") or "") for m in messages)
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        key, reply = script.select(text, turn)
        ids, _ = script.reply_ids(reply)
        with self.server.stats_lock:
            self.server.stats["requests"] += 1
            self.server.stats[f"instance:{key}"] += 1
        content = script.tok.decode(ids, skip_special_tokens=True)
        return 200, {
            "id": "chat-sim",
            "object": "chat.completion",
            "model": script.model,
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
        }


def _load_script(script: dict[str, Any] | str | Path) -> dict[str, Any]:
    return script if isinstance(script, dict) else json.loads(Path(script).read_text())


def make_server(
    tokenizer_dir: str,
    script: dict[str, Any] | str | Path,
    port: int = 0,
    host: str = "127.0.0.1",
    max_model_len: int | None = None,
    latency: float | None = None,
    report_max_model_len: bool = True,
    capacity: CapacityModel | dict[str, Any] | None = None,
    wrong_rate: float | None = None,
    seed: int | None = None,
    latency_dist: dict[str, Any] | None = None,
) -> SimulatorServer:
    """A bound (not yet serving) simulator server; port 0 picks a free one.

    `max_model_len` makes it reject, like vLLM, a request whose prompt + max_tokens exceeds it
    (HTTP 400) and report it in GET /v1/models unless `report_max_model_len` is false.
    `capacity` (overriding the script's) gives it a capacity model (`sim_capacity`).
    """
    data = dict(_load_script(script))
    if latency is not None:
        data["latency"] = latency
    if capacity is not None:
        data["capacity"] = capacity
    if wrong_rate is not None:
        data["wrong_rate"] = wrong_rate
    if seed is not None:
        data["seed"] = seed
    if latency_dist is not None:
        data["latency_dist"] = latency_dist
    return SimulatorServer((host, port), Script(tokenizer_dir, data), max_model_len, report_max_model_len)


def start_simulator(
    tokenizer_dir: str,
    script: dict[str, Any] | str | Path,
    max_model_len: int | None = None,
    latency: float | None = None,
    report_max_model_len: bool = True,
    capacity: CapacityModel | dict[str, Any] | None = None,
) -> tuple[str, Callable[[], None]]:
    """Serve a simulator in a daemon thread on a free port; returns (url, stop)."""
    server = make_server(
        tokenizer_dir,
        script,
        max_model_len=max_model_len,
        latency=latency,
        report_max_model_len=report_max_model_len,
        capacity=capacity,
    )
    # a short poll: `stop()` waits for the loop to notice the shutdown (0.5 s by default)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="llm-sim", daemon=True)
    thread.start()

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)

    return server.url, stop


def start_simulator_process(
    tokenizer_dir: str,
    script_file: str | Path,
    port: int,
    max_model_len: int | None = None,
    ready_timeout: float = 30.0,
    capacity: CapacityModel | dict[str, Any] | None = None,
) -> tuple[str, Callable[[], None]]:
    """Run `raas llm-sim` as a subprocess (killable like a real server); returns (url, stop)."""
    cmd = [
        sys.executable,
        "-m",
        "fakellm.cli",
        "--tokenizer",
        str(tokenizer_dir),
        "--script",
        str(script_file),
        "--port",
        str(port),
    ]
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    if capacity is not None:
        cmd += ["--capacity", CapacityModel.parse(capacity).model_dump_json()]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{url}/health", timeout=1).is_success:
                break
        except httpx.HTTPError:
            time.sleep(0.1)

    def stop() -> None:
        proc.kill()
        proc.wait(timeout=10)

    return url, stop
