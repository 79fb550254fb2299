"""Sandbox errors: the package's own root, so it depends on nothing of the service.

Each class also derives from the matching built-in so callers can catch either; the pipeline
maps `SandboxError` to a retryable infrastructure failure where it catches it (`tasks.stages`).
"""

from __future__ import annotations

from typing import Any


class SandboxError(Exception):
    """The sandbox infrastructure failed; never the agent's fault."""

    code = "sandbox_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class SandboxStartError(SandboxError):
    """A sandbox could not be started (runtime missing, bad image, server never came up)."""

    code = "sandbox_start_error"


class SandboxTampered(SandboxError):
    """The tool socket is answered by a process other than the server the runtime started.

    Always an error, never a result: nothing said over such a socket may become a reward.
    """

    code = "sandbox_tampered"


class SandboxTimeout(SandboxError, TimeoutError):
    """A tool call got no answer before its deadline: the tool server is hung or overloaded."""

    code = "sandbox_timeout"


class SandboxGone(SandboxError, ConnectionError):
    """The sandbox or its tool server no longer exists."""

    code = "sandbox_gone"


class UnknownRuntime(SandboxError, ValueError):
    """A runtime name that is not registered (the message lists the valid ones)."""

    code = "unknown_runtime"


class ProtocolError(SandboxError):
    """The tool server answered something the client cannot understand."""

    code = "sandbox_protocol_error"


class ToolUsageError(ValueError):
    """The model used a file tool wrongly; the message is written for the model to read.

    Not a `SandboxError`: it is the agent's mistake, shown to it as a tool result.
    """

    code = "tool_usage_error"
