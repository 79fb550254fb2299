"""Streaming a reply to the harness while the server generates it.

`ReplyStream` is the session's `DeltaSink` for one `stream: true` call: it takes the server's
text as it arrives and passes on only what the final reply is sure to start with, so what the
harness saw is always a prefix of the `Completion`'s content (the rest, the tool calls, the
finish reason and usage go out at the end, as a whole reply's stream has them). Held back:

- everything from the first possible start of a tool-call tag (`<tool_call>`: its markup is
  parsed into tool calls at the end, never shown as text) and of a stop string (the reply is
  cut before it);
- trailing whitespace (a reply with tool calls has its text stripped);
- a whole reply that starts with whitespace (the same stripping);
- when the request returns a `<think>` block as reasoning: a whole reply that opens one (or
  may: a prefix of `<think>`), or whose prompt opened one (the generation prompt of a thinking
  template): its end decides what is text, so it streams at the end.

`LiveSSE` writes one wire's events on the request's connection as they come: the HTTP head as
soon as a server accepted the generation (the harness parses it while the model prefills, off
the first token's path), the wire's opening events with the first text. A call that fails
before a server accepted it (a context overflow, every server down) is answered with the API's
JSON error and status; one that fails after gets the wire's error event, as the real APIs do
once their stream is open.

The record is the session's (ids and logprobs as the server sent them): streaming changes
only when the harness sees the text, never what is stored.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from agents.llm.tool_calls import OPEN_TAG

THINK = "<think>"

log = logging.getLogger(__name__)


class WireStream(Protocol):
    """One wire's live events (`openai_wire.LiveChat`, `anthropic_wire.LiveMessages`)."""

    def head(self, prompt_tokens: int) -> Iterable[str]:
        """The events before the first text (`prompt_tokens`: the call's prompt length)."""

    def text(self, delta: str) -> Iterable[str]:
        """The events of a piece of the reply's text."""

    def tail(self, completion: Any, rest: str) -> Iterable[str]:
        """The events after the streamed text: `rest` (text not yet sent), the tool calls,
        the finish reason, the usage, the end."""

    def error(self, body: dict[str, Any]) -> Iterable[str]:
        """The events of a failure after the stream began (`body`: the wire's error body)."""


class ReplyStream:
    """The text filter between the session's streamed generation and the harness."""

    def __init__(
        self,
        stop: list[str],
        parse_tools: bool,
        thinking: bool,
        emit: Callable[[str, int], None],
        on_open: Callable[[], None] | None = None,
    ) -> None:
        self.stop = [s for s in stop if s]
        self.markers = [*self.stop, OPEN_TAG] if parse_tools else list(self.stop)
        self.thinking = thinking
        self.live = True  # False: nothing streams before the end (the runner: a prompt opened `<think>`)
        self.emit = emit
        self.on_open = on_open
        self.raw = ""  # the server's text of the current request
        self.sent = ""  # what the harness was sent
        self.first_at: float | None = None  # when the first text was written
        self.prompt_tokens = 0  # the call's prompt length (set by the runner; an opening event says it)

    # -- DeltaSink ------------------------------------------------------------------------
    def delta(self, text: str) -> None:
        self.raw += text
        if not self.live:
            return
        safe = self._safe(self.raw)
        if len(safe) > len(self.sent) and safe.startswith(self.sent):
            piece, self.sent = safe[len(self.sent) :], safe
            self.emit(piece, self.prompt_tokens)
            if self.first_at is None:
                self.first_at = time.monotonic()

    def restart(self) -> None:
        """A new request for the turn: its text must repeat what was sent to be passed on."""
        self.raw = ""

    def opened(self) -> None:
        if self.live and self.on_open is not None:
            self.on_open()

    # -- the end ---------------------------------------------------------------------------
    def rest(self, content: str | None) -> tuple[str, bool]:
        """(the final content's text not yet sent, whether the sent text is its prefix). A
        mismatch (a retried request that said something else, a server whose text differs
        from its ids' decoding) cannot be taken back: it is logged and counted by the caller."""
        content = content or ""
        if content.startswith(self.sent):
            return content[len(self.sent) :], True
        log.warning("streamed text %r is not a prefix of the reply %r", self.sent[-80:], content[:80])
        return "", False

    def _safe(self, raw: str) -> str:
        """The longest prefix of `raw` that the final content is sure to start with."""
        if not raw or raw[0].isspace():
            return ""
        if self.thinking and (raw.startswith(THINK) or THINK.startswith(raw)):
            return ""
        end = len(raw)
        for marker in self.markers:
            at = raw.find(marker)
            if at >= 0:
                end = min(end, at)
                continue
            for k in range(min(len(marker) - 1, len(raw)), 0, -1):
                if raw.endswith(marker[:k]):
                    end = min(end, len(raw) - k)
                    break
        return raw[:end].rstrip()


class LiveSSE:
    """A wire's events written on one request's connection as they come (`http_server.Handler.sse_*`).

    A harness that hung up mid-stream does not stop the call: the turn is generated and
    recorded as any other (the harness may ask again), only the writes stop."""

    def __init__(self, req: Any, wire: WireStream) -> None:
        self.req = req
        self.wire = wire
        self.opened = False  # the HTTP head was written
        self.started = False  # the wire's events were (its opening ones, then text)
        self.gone = False

    def open(self) -> None:
        """Write the HTTP head alone (once: a failover's second server opens nothing new)."""
        if not self.opened:
            self.opened = True
            self._write(self.req.sse_open, ())

    def text(self, delta: str, prompt_tokens: int = 0) -> None:
        """Write a piece of text (the wire's opening events first, once)."""
        if not self.started:
            self.started = True
            self._send([*self.wire.head(prompt_tokens), *self.wire.text(delta)])
            return
        self._write(self.req.sse_write, self.wire.text(delta))

    def whole(self, events: Iterable[str]) -> None:
        """A whole reply's events, nothing of it streamed before (a reply of tool calls only)."""
        self._send(events)
        self._write(self.req.sse_close)

    def _send(self, events: Iterable[str]) -> None:
        if self.opened:
            self._write(self.req.sse_write, events)
        else:
            self.opened = True
            self._write(self.req.sse_open, events)

    def finish(self, completion: Any, rest: str) -> None:
        """Write the rest of the reply and end the stream."""
        self._write(self.req.sse_write, self.wire.tail(completion, rest))
        self._write(self.req.sse_close)

    def fail(self, body: dict[str, Any]) -> None:
        """End a started stream with the wire's error event."""
        self._write(self.req.sse_write, self.wire.error(body))
        self._write(self.req.sse_close)

    def _write(self, write: Callable[..., None], *args: Any) -> None:
        if self.gone:
            return
        try:
            write(*args)
        except OSError as exc:  # the harness closed the connection
            log.info("the harness left a streamed reply: %s", exc)
            self.gone = True
            self.req.close_connection = True
