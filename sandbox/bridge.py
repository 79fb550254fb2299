"""The model-endpoint bridge and detached programs: host-side helpers for harness rollouts.

A sandbox started with `SandboxSpec(model_endpoint=True)` gets a per-sandbox host folder
(`handle["endpoint_dir"]`, 0700, the sandbox user's) bound read-only inside at
`sandbox.inside.ENDPOINT_DIR`. The host serves the rollout's model API on a Unix socket in
that folder (`endpoint_socket`); inside, `start_relay` runs `toolserver/relay.py`, which listens
on 127.0.0.1:PORT of the sandbox's own network namespace and relays to the socket. So, with
the network off, the harness reaches its own endpoint and nothing else: not the host network,
not another sandbox's socket (never mounted here), and it cannot replace its socket (the
mount is read-only). The tool socket keeps its property: its folder is never mounted.

`start_detached` / `detached_status` / `stop_detached` run a long program (the harness) in
the sandbox without holding a tool call for its whole run (`toolserver/detach.py`).
"""

from __future__ import annotations

import base64
import json
import shlex
from dataclasses import dataclass
from typing import Any

from sandbox.errors import SandboxError

SYSTEM_PYTHON = "/usr/bin/python3"
START_TIMEOUT = 30.0


class BridgeError(SandboxError):
    """The sandbox has no model endpoint folder, or a bridge program did not start."""


def _handle(sandbox: Any) -> dict[str, Any]:
    handle = getattr(sandbox, "handle", None) or {}
    if not handle.get("endpoint_dir"):
        raise BridgeError("this sandbox was started without a model endpoint folder (SandboxSpec.model_endpoint)")
    return handle


def endpoint_socket(sandbox: Any) -> str:
    """The host path the rollout's model endpoint binds its Unix socket at."""
    from sandbox.inside import ENDPOINT_SOCKET

    return f"{_handle(sandbox)['endpoint_dir']}/{ENDPOINT_SOCKET}"


def start_relay(sandbox: Any, timeout: float = START_TIMEOUT) -> int:
    """Start the loopback relay in the sandbox; returns its port (127.0.0.1 inside)."""
    handle = _handle(sandbox)
    command = shlex.join([SYSTEM_PYTHON, "-I", "-S", handle["relay"], "--socket", handle["endpoint_inside"]])
    result = sandbox.bash(command, timeout=timeout)
    text = result.output.strip()
    if result.exit_code != 0 or not text.isdigit():
        raise BridgeError(f"the endpoint relay did not start: {text[-500:]!r}")
    return int(text)


def write_text(sandbox: Any, path: str, text: str, timeout: float = START_TIMEOUT) -> None:
    """Write a file anywhere the sandbox's user may (e.g. /tmp), through the shell."""
    data = base64.b64encode(text.encode()).decode()
    result = sandbox.bash(f"printf %s {data} | base64 -d > {shlex.quote(path)}", timeout=timeout)
    if result.exit_code != 0:
        raise BridgeError(f"cannot write {path} in the sandbox: {result.output[-500:]!r}")


@dataclass
class Detached:
    """A program started by `start_detached`: its pid (= its process group) and its files."""

    pid: int
    status_file: str
    log_file: str


def start_detached(
    sandbox: Any,
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    name: str = "raas-harness",
    timeout: float = START_TIMEOUT,
) -> Detached:
    """Start `argv` (no shell) detached in the sandbox with `env` added to the sandbox's."""
    handle = _handle(sandbox)
    status, log = f"/tmp/{name}.status", f"/tmp/{name}.log"
    words = [
        SYSTEM_PYTHON,
        "-I",
        "-S",
        handle["detach"],
        "--status",
        status,
        "--log",
        log,
        "--cwd",
        cwd,
        *(x for k, v in env.items() for x in ("--env", f"{k}={v}")),
        "--",
        *argv,
    ]
    result = sandbox.bash(f"rm -f {status}; " + shlex.join(words), timeout=timeout)
    text = result.output.strip()
    if result.exit_code != 0 or not text.isdigit():
        raise BridgeError(f"{argv[0]!r} did not start: {text[-500:]!r}")
    return Detached(int(text), status, log)


def detached_status(sandbox: Any, program: Detached, timeout: float = START_TIMEOUT) -> int | None:
    """The program's returncode once it ended, else None (negative: killed by a signal)."""
    result = sandbox.bash(f"cat {program.status_file} 2>/dev/null || true", timeout=timeout)
    text = result.output.strip()
    if not text:
        return None
    try:
        return int(json.loads(text)["returncode"])
    except (ValueError, KeyError, TypeError):
        return None  # a half-written or tampered file: ask again (the deadline still holds)


def stop_detached(sandbox: Any, program: Detached, timeout: float = START_TIMEOUT) -> None:
    """TERM, then KILL, the program's process group (what it setsid'd dies with RUN)."""
    sandbox.bash(
        f"kill -TERM -- -{program.pid} 2>/dev/null; sleep 1; kill -KILL -- -{program.pid} 2>/dev/null; true",
        timeout=timeout,
    )


def log_tail(sandbox: Any, program: Detached, size: int = 4000, timeout: float = START_TIMEOUT) -> str:
    """The end of the program's output (for the rollout's record)."""
    result = sandbox.bash(f"tail -c {int(size)} {program.log_file} 2>/dev/null || true", timeout=timeout)
    return result.output
