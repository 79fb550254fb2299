"""Rootless sandboxes (bwrap, Singularity, local) with a fast in-sandbox tool server.

rt = get_runtime("bwrap"); sb = rt.start(SandboxSpec(workspace="/abs/dir"), label="r:0")
sb.bash("ls"); sb.python("1+1"); sb.edit("view", "a.py"); sb.stop()
"""

from __future__ import annotations

from sandbox import bwrap, local, singularity  # noqa: F401 - importing them registers them
from sandbox.client import Sandbox
from sandbox.errors import (
    ProtocolError,
    SandboxError,
    SandboxGone,
    SandboxStartError,
    SandboxTimeout,
    ToolUsageError,
    UnknownRuntime,
)
from sandbox.registry import runtime_names
from sandbox.abstract import Runtime
from sandbox.node import attach, get_runtime, list_sandboxes, stop_handle
from sandbox.settings import SandboxSettings
from sandbox.spec import Bind, SandboxLimits, SandboxOptions, SandboxSpec
from sandbox.toolserver.protocol import BashResult, Pong, PythonResult

__all__ = [
    "BashResult",
    "Bind",
    "Pong",
    "ProtocolError",
    "PythonResult",
    "Runtime",
    "Sandbox",
    "SandboxError",
    "SandboxGone",
    "SandboxLimits",
    "SandboxOptions",
    "SandboxSettings",
    "SandboxSpec",
    "SandboxStartError",
    "SandboxTimeout",
    "ToolUsageError",
    "UnknownRuntime",
    "attach",
    "get_runtime",
    "list_sandboxes",
    "runtime_names",
    "stop_handle",
]
