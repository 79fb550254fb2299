"""Rootless sandboxes (bwrap, Singularity, local) with a fast in-sandbox tool server."""
from __future__ import annotations

from sandbox.errors import (
    ProtocolError,
    SandboxError,
    SandboxGone,
    SandboxStartError,
    SandboxTimeout,
    ToolUsageError,
    UnknownRuntime,
)
from sandbox.spec import Bind, SandboxLimits, SandboxOptions, SandboxSpec

__all__ = [
    "Bind",
    "ProtocolError",
    "SandboxError",
    "SandboxGone",
    "SandboxLimits",
    "SandboxOptions",
    "SandboxSpec",
    "SandboxStartError",
    "SandboxTimeout",
    "ToolUsageError",
    "UnknownRuntime",
]
