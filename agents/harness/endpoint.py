"""`RolloutEndpoint`: one rollout's OpenAI/Anthropic/Google-compatible model API on a Unix socket.

The server (`http_server`) is the standard library's threading HTTP server on a Unix socket: HTTP/1.1 with
keep-alive (the SDKs pool connections), SSE written as chunked transfer. Calls are
serialised by the `CallRunner` (a trajectory is sequential), so threads only wait there.
The capability token is compared in constant time and dies with the endpoint: `__exit__`
closes the listener, every open connection and the socket file, and any request still
arriving on a connection is refused with a 401.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import threading
import urllib.parse
from typing import Any


from agents.abstract import Trajectory
from agents.contexts import RunContext
from agents.counters import EndpointCounters
from agents.harness import anthropic_wire, google_wire, openai_wire, responses_wire
from agents.harness.calls import CallError, CallRunner
from agents.harness.http_server import Handler, Server
from agents.harness.results import run_result
from agents.harness.streaming import LiveSSE, ReplyStream
from core.errors import InvalidRequest

log = logging.getLogger(__name__)

MODEL_NAME = "raas-policy"  # what GET /v1/models lists; a request's own model name is echoed
# How long exit waits for an aborted call to finish (a session looking for a server when all
# are down retries for up to 30 s without a cancel check).
EXIT_WAIT_SECONDS = 35.0


class RolloutEndpoint:
    """One rollout's OpenAI/Anthropic-compatible model API, served on a Unix socket.

    `ctx` is the RUN stage's context (its `llm` session, `record_turn`, deadline, cancel
    check and limits); `token` is the per-attempt capability a call must present
    (`Authorization: Bearer` or `x-api-key`). The socket is bound on `__enter__` (mode 0666
    in a directory the runtime makes) and served by threads; `__exit__` stops serving and
    the token is dead from then on.
    """

    def __init__(self, ctx: RunContext, socket_path: str, token: str) -> None:
        if not token or len(token) < 16:
            raise ValueError("the endpoint's token must be a random string of 16+ characters")
        if ctx.llm is None:
            raise ValueError("the endpoint needs the RUN stage's LLM session (ctx.llm)")
        self.ctx = ctx
        self.socket_path = socket_path
        self.token = token
        self.runner = CallRunner(ctx)
        # route -> the wire that parses its requests and renders its answers (Google's routes
        # carry the model in the path: `google.route` matches them)
        self.routes: dict[str, Any] = {
            "/v1/chat/completions": openai_wire,
            "/v1/messages": anthropic_wire,
            "/v1/responses": responses_wire.ResponsesWire(),
        }
        self.google = google_wire.GoogleWire()
        self._server: Server | None = None
        self._thread: threading.Thread | None = None
        self._live = False
        self._unauthorized = 0

    @staticmethod
    def new_token() -> str:
        """A fresh capability token for one rollout attempt."""
        return secrets.token_urlsafe(32)

    # -- lifetime ------------------------------------------------------------------------
    def __enter__(self) -> RolloutEndpoint:
        os.makedirs(os.path.dirname(self.socket_path) or ".", exist_ok=True)
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)  # a stale socket of an earlier attempt
        self._server = Server(self.socket_path, self)
        os.chmod(self.socket_path, 0o666)  # the sandbox's user is not ours
        self._live = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"endpoint-{self.ctx.rollout_id}",
            daemon=True,
        )
        self._thread.start()
        log.info("rollout %s: model endpoint on %s", self.ctx.rollout_id, self.socket_path)
        return self

    def __exit__(self, *exc: object) -> None:
        self._live = False
        self.runner.closing = True  # an in-flight generation is aborted
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.close_all()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        # The call in flight (aborted by `closing`) finishes writing its turn first.
        if self.runner.lock.acquire(timeout=EXIT_WAIT_SECONDS):
            self.runner.lock.release()
        else:
            log.warning("rollout %s: a model call outlived the endpoint's exit", self.ctx.rollout_id)

    # -- what the handler reads ----------------------------------------------------------
    @property
    def counters(self) -> EndpointCounters:
        """Calls, parse failures, samples, merges and splits so far."""
        counters, tracker = self.runner.stats.snapshot(), self.runner.tracker
        counters.samples = len(tracker.training_samples())
        counters.merges, counters.splits = tracker.merges, tracker.splits
        counters.split_reasons = dict(tracker.split_reasons)
        counters.redone_deltas = sum(s.builder.redone_deltas for s in tracker.samples)
        counters.unauthorized = self._unauthorized
        return counters

    @property
    def calls(self) -> int:
        """Model calls answered (successfully or with an API error)."""
        return self.runner.stats.calls

    @property
    def fatal(self) -> BaseException | None:
        """A cancel or an infrastructure failure a call ran into (the handler re-raises it)."""
        return self.runner.fatal

    def result(self, outcome: str, finish_reason: str | None) -> Trajectory:
        """The rollout's record: the last sample's arrays, every sample in `extra["samples"]` when
        there are several, the counters in `metrics` (and the replay's, `agents.harness.replay`)."""
        metrics = self.counters.metrics()
        if self.runner.replay is not None:  # a new attempt answered from an earlier one's log
            metrics.update(self.runner.replay.metrics())
        return run_result(self.runner, metrics, outcome, finish_reason)

    # -- one request ---------------------------------------------------------------------
    def serve(self, req: Handler) -> None:
        """Answer one HTTP request (called on the connection's thread)."""
        path = req.path.split("?", 1)[0].rstrip("/")
        path = path if path.startswith("/v1/") else "/v1" + path
        route = self.routes.get(path) or self.google.route(req.path)
        wire = route or (anthropic_wire if path.startswith("/v1/messages") else openai_wire)
        try:
            if not self._authorized(req):
                self._unauthorized += 1
                raise CallError("authentication", "invalid or expired API key for this rollout's endpoint", 401)
            if req.command == "GET" and path == "/v1/models":
                return req.send_json(200, openai_wire.models_body(MODEL_NAME))
            if req.command == "POST" and path == "/v1/messages/count_tokens":
                return self._count_tokens(req, self._body(req))
            if req.command != "POST" or route is None:
                raise CallError("not_found", f"no route {req.command} {path}", 404)
            self._complete(req, wire, self._body(req))
        except CallError as exc:
            req.send_json(exc.status, wire.error_body(exc))
        except InvalidRequest as exc:
            req.send_json(400, wire.error_body(CallError("invalid_request", exc.message)))
        except Exception as exc:  # a lost lease, a database outage, a bug
            log.exception("rollout %s: the endpoint failed a call", self.ctx.rollout_id)
            self.runner.fatal = self.runner.fatal or exc  # infrastructure: the handler raises
            req.send_json(
                500, wire.error_body(CallError("unavailable", f"raas failed this call: {type(exc).__name__}", 500))
            )

    def _body(self, req: Handler) -> dict[str, Any]:
        try:
            return req.read_json()
        except CallError as exc:
            self.runner.refused(exc.kind)
            raise

    def _authorized(self, req: Handler) -> bool:
        given = req.headers.get("x-api-key") or req.headers.get("x-goog-api-key") or _query_key(req.path)
        bearer = req.headers.get("authorization") or ""
        if bearer.lower().startswith("bearer "):
            given = given or bearer[7:].strip()
        return self._live and hmac.compare_digest(given.encode(), self.token.encode())

    def _count_tokens(self, req: Handler, body: dict[str, Any]) -> None:
        """Anthropic's `count_tokens`: the prompt's tokens as the job's template renders it."""
        call = anthropic_wire.parse_request(body, count_only=True)
        req.send_json(200, {"input_tokens": self.runner.count_tokens(call)})

    def _complete(self, req: Handler, wire: Any, body: dict[str, Any]) -> None:
        try:
            call = wire.parse_request(body)
        except InvalidRequest as exc:
            self.runner.refused("invalid_request", exc)
            raise
        call.received = req.received
        model = str(body.get("model") or MODEL_NAME)
        if call.ignored:  # the job's sampling wins; say so where a harness author looks
            req.extra_headers["x-raas-ignored-params"] = ",".join(call.ignored)
        if call.unenforced:  # accepted, answered, not enforced (no forced decoding)
            req.extra_headers["x-raas-unenforced-params"] = ",".join(call.unenforced)
        live = _live_wire(wire, call, body, model)
        if live is not None:
            return self._stream(req, wire, call, live, model, body)
        completion = self.runner.complete(call)
        return self._answer_whole(req, wire, call, completion, model, body)

    def _answer_whole(
        self, req: Handler, wire: Any, call: Any, completion: Any, model: str, body: dict, out: LiveSSE | None = None
    ) -> None:
        """The reply once generated: JSON, or its whole event stream (on `out` when a
        streamed call's head went out already)."""
        if not call.stream:
            if wire not in (openai_wire, anthropic_wire):
                return req.send_json(200, wire.answer(call, completion, body, model))
            if wire is anthropic_wire:
                return req.send_json(200, anthropic_wire.message_body(completion, model))
            return req.send_json(200, openai_wire.completion_body(completion, model))
        if wire is anthropic_wire:
            events = anthropic_wire.stream_events(completion, model)
        elif wire is openai_wire:
            events = openai_wire.stream_events(completion, model, _include_usage(body))
        else:
            events = wire.answer(call, completion, body, model)
        return out.whole(events) if out is not None else req.send_sse(events)

    def _stream(self, req: Handler, wire: Any, call: Any, live: Any, model: str, body: dict) -> None:
        """A `stream: true` call whose text goes out as the server generates it
        (`streaming`); a call that fails before a server accepted it is answered as a whole
        one is (the API's JSON error), one that fails after with the wire's error event."""
        out = LiveSSE(req, live)
        sink = ReplyStream(call.stop, call.parse_tools, call.thinking, out.text, out.open)
        try:
            completion = self.runner.complete(call, sink)
        except Exception as exc:
            if not out.opened:
                raise
            if not isinstance(exc, CallError):
                log.exception("rollout %s: the endpoint failed a streamed call", self.ctx.rollout_id)
                self.runner.fatal = self.runner.fatal or exc
                exc = CallError("unavailable", f"raas failed this call: {type(exc).__name__}", 500)
            return out.fail(wire.error_body(exc))
        rest, whole = sink.rest(completion.content)
        if not whole:
            self.runner.stats.stream_mismatches += 1
        if not out.started:
            return self._answer_whole(req, wire, call, completion, model, body, out)
        out.finish(completion, rest)


def _include_usage(body: dict[str, Any]) -> bool:
    return bool((body.get("stream_options") or {}).get("include_usage"))


def _live_wire(wire: Any, call: Any, body: dict[str, Any], model: str) -> Any:
    """The live event stream of a `stream: true` call (`streaming.WireStream`); None for a
    plain JSON answer (Google's stream without SSE is one JSON array)."""
    if not call.stream:
        return None
    if wire is openai_wire:
        return openai_wire.LiveChat(model, _include_usage(body))
    if wire is anthropic_wire:
        return anthropic_wire.LiveMessages(model)
    return wire.live(call, body, model)


def _query_key(path: str) -> str:
    """The `?key=` of a request (Google's clients may authenticate that way)."""
    if "?" not in path:
        return ""  # no query: nothing to parse (every bearer-token call comes here)
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
    return (query.get("key") or [""])[0]
