"""Bounded output capture: keep the head and the tail, count what was elided, strip ANSI."""

from __future__ import annotations

import io
import re

_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI sequences (colours, cursor moves)
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC sequences (titles, hyperlinks)
    r"|\x1b[@-Z\\-_]"  # two-byte escapes
)


def strip_ansi(text: str) -> str:
    """Text without terminal escape sequences and with CRLF as LF."""
    return _ANSI.sub("", text).replace("\r\n", "\n")


class CappedBuffer:
    """Keeps the first and last `limit // 2` bytes written and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.half = max(limit // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def write(self, data: bytes) -> None:
        """Append bytes, discarding the middle once over the limit."""
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.half:  # trim lazily to keep writes cheap
                del self.tail[: len(self.tail) - self.half]

    @property
    def elided(self) -> int:
        """Bytes dropped from the middle."""
        return max(0, self.total - len(self.head) - min(len(self.tail), self.half))

    def text(self) -> str:
        """Head + elision note + tail, decoded and cleaned for the model."""
        tail = bytes(self.tail[-self.half :]) if self.tail else b""
        head = self.head.decode("utf-8", "replace")
        if not self.elided:
            return strip_ansi(head + tail.decode("utf-8", "replace"))
        note = f"\n[... {self.elided} bytes of output elided ...]\n"
        return strip_ansi(head + note + tail.decode("utf-8", "replace"))


class CappedText:
    """A text stream (for sys.stdout) that keeps head and tail like `CappedBuffer`."""

    def __init__(self, limit: int) -> None:
        self.buffer_ = CappedBuffer(limit)

    def write(self, text: str) -> int:
        """Capture text written by user code."""
        self.buffer_.write(text.encode("utf-8", "replace"))
        return len(text)

    def flush(self) -> None:
        """Nothing to flush; present for file-like compatibility."""

    def fileno(self) -> int:
        """No descriptor: output is captured in memory."""
        raise io.UnsupportedOperation("fileno")

    def isatty(self) -> bool:
        """Never a terminal (keeps libraries from emitting colours)."""
        return False

    def text(self) -> str:
        """Captured text, capped."""
        return self.buffer_.text()
