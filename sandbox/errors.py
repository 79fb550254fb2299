"""Sandbox errors, rooted in the project hierarchy (`app.errors`)."""
from __future__ import annotations

from app.errors import ConfigError, InfraError, RaasError


class SandboxError(InfraError):
    """The sandbox infrastructure failed; never the agent's fault."""

    code = "sandbox_error"


class SandboxStartError(SandboxError):
    """A sandbox could not be started (runtime missing, bad image, server never came up)."""

    code = "sandbox_start_error"


class SandboxTimeout(SandboxError, TimeoutError):
    """A tool call got no answer before its deadline: the tool server is hung or overloaded."""

    code = "sandbox_timeout"


class SandboxGone(SandboxError, ConnectionError):
    """The sandbox or its tool server no longer exists."""

    code = "sandbox_gone"


class UnknownRuntime(ConfigError):
    """A runtime name that is not registered (the message lists the valid ones)."""

    code = "unknown_runtime"


class ToolUsageError(RaasError, ValueError):
    """The model used a file tool wrongly; the message is written for the model to read."""

    http_status = 400
    code = "tool_usage_error"


class ProtocolError(SandboxError):
    """The tool server answered something the client cannot understand."""

    code = "sandbox_protocol_error"
