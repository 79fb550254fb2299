"""What every runtime shows inside a sandbox: where the tool server and its socket live, and
the minimal environment (shared by the bwrap, Singularity and local runtimes)."""

from __future__ import annotations

import functools
import logging
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import ptyprocess

from sandbox.spec import SandboxSpec

TOOLSERVER_DIR = str(Path(__file__).resolve().parent / "toolserver")
PTYPROCESS_DIR = str(Path(ptyprocess.__file__).resolve().parent)
OPT = "/opt/raas"
SOCKET_DIR = "/run/raas"
# A model endpoint's folder (`SandboxSpec.model_endpoint`): the host's per-sandbox folder
# holding the endpoint's Unix socket, bound read-only here; `relay.py` bridges a loopback
# port of the sandbox's own network namespace to the socket in it.
ENDPOINT_DIR = "/run/raas-model"
ENDPOINT_SOCKET = "model.sock"
# The programs of an environment's npm packages (`sandbox.environments`), bound with it.
NODE_BIN = "node_modules/.bin"
SYSTEM_PYTHON = "/usr/bin/python3"  # what runs the tool server inside a bwrap sandbox
# Where the server's interpreter imports from inside a container (bwrap, Singularity): the
# read-only /opt/raas holding `toolserver` and `lib/ptyprocess`.
INSIDE_PYTHONPATH = f"{OPT}:{OPT}/lib"
# The interpreter flags and module that start the tool server (-s: no user site, -B: no bytecode).
SERVER_MODULE = ("-s", "-B", "-m", "toolserver")

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=None)
def compile_server(python: str = SYSTEM_PYTHON) -> bool:
    """Compile the tool server and ptyprocess to bytecode beside their sources, once per
    process, with the interpreter that runs them inside (its version tags the files).

    Why: the sandbox sees these folders read-only and the server runs with -B, so without
    bytecode on the host every start compiled them again: most of a cold start's Python time
    (bench/sandbox_start.py). Up-to-date files are left alone; where the folders are not
    writable nothing is written and starts stay correct, only slower."""
    try:
        run = subprocess.run(
            [python, "-I", "-m", "compileall", "-q", TOOLSERVER_DIR, PTYPROCESS_DIR], capture_output=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.info("tool server not precompiled (%s): sandboxes start slower", exc)
        return False
    if run.returncode:
        log.info("tool server not precompiled: %s", run.stderr.decode(errors="replace")[-300:])
    return run.returncode == 0


def sandbox_env(spec: SandboxSpec, env_dir: str | None) -> dict[str, str]:
    """The environment inside: minimal and explicit, so host variables never leak in."""
    path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    env = {
        "PATH": path,
        "HOME": "/tmp",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "PAGER": "cat",
        "GIT_PAGER": "cat",
        "MANPAGER": "cat",
        "NO_COLOR": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PYTHONUNBUFFERED": "1",
        "TMPDIR": "/tmp",
    }
    if env_dir:
        env.update(PATH=f"{env_dir}/bin:{path}", VIRTUAL_ENV=env_dir)
        if os.path.isdir(f"{env_dir}/{NODE_BIN}"):  # an environment with npm packages: theirs first
            env.update(PATH=f"{env_dir}/{NODE_BIN}:{env['PATH']}")
    env.update(spec.env)
    return env


def tool_python(env_dir: str | None, default: str = SYSTEM_PYTHON) -> str:
    """The interpreter the agent's `python` tool runs: the environment's, else `default`."""
    return f"{env_dir}/bin/python3" if env_dir else default


def endpoint_paths(tools_dir: str, endpoint_dir: str) -> dict[str, str]:
    """A handle's model-endpoint fields as the tool server sees them: the socket, and the
    relay and detach programs in the server's folder (`tools_dir`)."""
    return {
        "endpoint_inside": f"{endpoint_dir}/{ENDPOINT_SOCKET}",
        "relay": f"{tools_dir}/relay.py",
        "detach": f"{tools_dir}/detach.py",
    }


def server_argv(
    launch: Sequence[str],
    spec: SandboxSpec,
    python: str,
    *,
    socket: str | None = None,
    listen_fd: int | str | None = None,
    ready_fd: int | str | None = None,
    signal_fd: int | str | None = None,
    flags: Sequence[str] = (),
) -> list[str]:
    """The tool server's command line, the one place its flags are written (the parser is
    `toolserver.server.parse_args`): `launch` is the interpreter and how it finds the server;
    the server listens on a `socket` path it creates or on an inherited `listen_fd`; `flags`
    are the limits (`sandbox.limits.server_flags`) and switches such as --isolate. A runtime
    wraps the result in its own launcher (bwrap, `apptainer exec`, or nothing)."""
    argv = [*launch]
    if socket is not None:
        argv += ["--socket", socket]
    if listen_fd is not None:
        argv += ["--listen-fd", str(listen_fd)]
    inner = spec.inner_workspace
    argv += ["--workspace", inner, "--workdir", spec.workdir or inner, "--python", python]
    if ready_fd is not None:
        argv += ["--ready-fd", str(ready_fd)]
    if signal_fd is not None:
        argv += ["--signal-fd", str(signal_fd)]
    return argv + list(flags)
