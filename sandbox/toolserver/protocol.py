"""The typed wire protocol shared by the tool server and the host client (stdlib only).

A frame is a 4-byte big-endian length followed by UTF-8 JSON. A request is
`{"op": NAME, "args": {...}}`; a response is `{"ok": true, "result": {...}}` or
`{"ok": false, "error": {"type": ERROR_NAME, "message": TEXT}}`.
"""

from __future__ import annotations

import json
import socket
import struct
from dataclasses import asdict, dataclass, fields
from typing import Any

PROTOCOL_VERSION = 1
MAX_FRAME = 512 * 1024 * 1024
_HEADER = struct.Struct(">I")


@dataclass
class BashRequest:
    """Run a command in the persistent shell."""

    command: str
    timeout: float


@dataclass
class BashResult:
    """What the shell printed; exit_code is None when the command timed out."""

    output: str
    exit_code: int | None
    timed_out: bool = False
    elided_bytes: int = 0


@dataclass
class PythonRequest:
    """Run code in the persistent Python session."""

    code: str
    timeout: float


@dataclass
class PythonResult:
    """Captured stdout/stderr plus the repr of the last expression; error is a traceback."""

    output: str
    error: str | None = None
    timed_out: bool = False


@dataclass
class EditRequest:
    """One str_replace_editor command."""

    command: str
    path: str
    file_text: str | None = None
    old_str: str | None = None
    new_str: str | None = None
    insert_line: int | None = None
    view_range: list[int] | None = None


@dataclass
class TextResult:
    """Plain text for the model (editor output) or file content."""

    text: str


@dataclass
class ReadFileRequest:
    """Read a text file inside the workspace."""

    path: str


@dataclass
class WriteFileRequest:
    """Create or overwrite a text file inside the workspace (parents are created)."""

    path: str
    content: str


@dataclass
class AttachRequest:
    """Make a fork slot's workspace a copy-on-write fork of one layer (toolserver/attach.py)."""

    layer: str


@dataclass
class Empty:
    """A request or result without fields."""


@dataclass
class Pong:
    """Liveness answer."""

    version: int
    pid: int
    uptime: float


# op name -> (request type, result type)
OPS: dict[str, tuple[type, type]] = {
    "bash": (BashRequest, BashResult),
    "python": (PythonRequest, PythonResult),
    "edit": (EditRequest, TextResult),
    "read_file": (ReadFileRequest, TextResult),
    "write_file": (WriteFileRequest, Empty),
    "reset": (Empty, Empty),
    "ping": (Empty, Pong),
    "shutdown": (Empty, Empty),
    "attach": (AttachRequest, Empty),
}


class WireError(Exception):
    """An error that crosses the wire by name (`type`) and message."""

    type = "SandboxError"


class ToolUsage(WireError):
    """The model used a tool wrongly; mapped to `ToolUsageError` on the host."""

    type = "ToolUsageError"


class BadRequest(WireError):
    """The request did not match the protocol."""

    type = "ProtocolError"


def decode(cls: type, data: Any) -> Any:
    """Build dataclass `cls` from a JSON object, rejecting unknown or missing fields."""
    if not isinstance(data, dict):
        raise BadRequest(f"{cls.__name__}: expected an object")
    names = {f.name for f in fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise BadRequest(f"{cls.__name__}: unknown fields {sorted(unknown)}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise BadRequest(f"{cls.__name__}: {exc}") from None


def encode(obj: Any) -> dict[str, Any]:
    """A dataclass as a JSON object."""
    return asdict(obj)


def send_frame(sock: socket.socket, message: dict[str, Any]) -> None:
    """Write one length-prefixed JSON frame."""
    body = json.dumps(message, separators=(",", ":")).encode()
    sock.sendall(_HEADER.pack(len(body)) + body)


def _recv_exact(sock: socket.socket, size: int) -> bytes | None:
    chunks, remaining = [], size
    while remaining:
        chunk = sock.recv(min(remaining, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def recv_frame(sock: socket.socket) -> dict[str, Any] | None:
    """Read one frame; None when the peer closed the connection cleanly."""
    header = _recv_exact(sock, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME:
        raise BadRequest(f"frame of {size} bytes exceeds {MAX_FRAME}")
    body = _recv_exact(sock, size)
    if body is None:
        raise ConnectionError("connection closed mid-frame")
    return json.loads(body)
