"""SingularityRuntime: Apptainer/Singularity instances driven through spython's command builder.

spython is used to build command lines only: its runner has no timeouts, may use sudo and
`sys.exit`s on a missing bind path, so commands run here with timeouts, never with sudo, and
bind paths are checked first with a typed error.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import time
from typing import Literal

from pydantic import Field

from sandbox import limits
from sandbox.abstract import Runtime, RuntimeConfig, pin_server
from sandbox.client import Sandbox, ToolClient
from sandbox.environments import interpreter_binds, resolve_env
from sandbox.errors import SandboxGone, SandboxStartError, SandboxTimeout
from sandbox.handles import Handle, kill_pid, pid_alive, remove_state, wait_gone, write_handle
from sandbox.inside import (
    ENDPOINT_DIR,
    INSIDE_PYTHONPATH,
    OPT,
    PTYPROCESS_DIR,
    SERVER_MODULE,
    SOCKET_DIR,
    SYSTEM_PYTHON,
    TOOLSERVER_DIR,
    endpoint_paths,
    sandbox_env,
    server_argv,
    tool_python,
)
from sandbox.registry import register
from sandbox.spec import SandboxSpec
from sandbox.toolserver.procs import start_time

PULL_TIMEOUT = 1800.0
STOP_TIMEOUT = 30.0


def singularity_binary() -> str | None:
    """apptainer (preferred) or singularity from PATH."""
    return shutil.which("apptainer") or shutil.which("singularity")


class SingularityCommands:
    """Builds command lines with spython and runs them with timeouts (the real boundary)."""

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary or singularity_binary() or "singularity"

    def prefix(self, action: list[str]) -> list[str]:
        """`<binary> <action...>` as spython composes it (quiet/debug flags included)."""
        from spython.main import Client

        command = Client._init_command(action)
        return [self.binary, *command[1:]]

    def run(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        """Run to completion or raise SandboxTimeout."""
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise SandboxTimeout(f"{' '.join(argv[:3])} did not finish in {timeout:g}s") from exc

    def spawn(self, argv: list[str], env: dict[str, str], log_file: str) -> subprocess.Popen:
        """Start a long-running command in its own session."""
        with open(log_file, "ab") as log:
            return subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd="/",
            )


def _bind(host: str, target: str, read_only: bool) -> list[str]:
    if not os.path.exists(host):  # spython would sys.exit here
        raise SandboxStartError(f"bind source {host} does not exist on this node")
    return ["--bind", f"{host}:{target}" + (":ro" if read_only else "")]


class SingularityConfig(RuntimeConfig):
    """Chooses the singularity runtime: Singularity/Apptainer containers."""

    type: Literal["singularity"] = Field("singularity", description="The runtime's registered name")


@register(SingularityConfig)
class SingularityRuntime(Runtime):
    """One Singularity instance per sandbox; the tool server runs in it via `exec instance://`."""

    def __init__(self, *args, commands: SingularityCommands | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.commands = commands or SingularityCommands()
        self.image_cache = self.settings.images

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None when apptainer or singularity is on PATH."""
        return None if singularity_binary() else "neither apptainer nor singularity is on PATH"

    def resolve_image(self, image: str | None) -> str:
        """A local .sif path; `docker://` (or other URI) images are pulled once into the cache."""
        if not image:
            raise SandboxStartError("the singularity runtime needs an image (.sif path or docker:// ref)")
        if "://" not in image:
            if not os.path.exists(image):
                raise SandboxStartError(f"image {image} does not exist")
            return os.path.abspath(image)
        self.image_cache.mkdir(parents=True, exist_ok=True)
        target = self.image_cache / (re.sub(r"[^A-Za-z0-9._-]+", "_", image) + ".sif")
        with open(f"{target}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # one pull per image per node
            if not target.exists():
                done = self.commands.run(self.pull_argv(image, str(target)), PULL_TIMEOUT)
                if done.returncode:
                    raise SandboxStartError(f"pull of {image} failed: {done.stderr[-2000:]}")
        return str(target)

    def pull_argv(self, image: str, target: str) -> list[str]:
        """`pull TARGET.sif URI` (never a build, so never sudo)."""
        return self.commands.prefix(["pull"]) + [target, image]

    def start_argv(self, spec: SandboxSpec, handle: Handle, image: str, env_dir: str | None) -> list[str]:
        """`instance start` with containment, optional no-network and fakeroot, and the binds."""
        argv = self.commands.prefix(["instance", "start"])
        argv += ["--containall", "--writable-tmpfs", "--no-mount", "home,cwd"]
        if not spec.network:
            argv += ["--net", "--network", "none"]
        if spec.fakeroot:
            argv += ["--fakeroot"]
        argv += _bind(spec.workspace, spec.inner_workspace, False)
        argv += _bind(handle["socket_dir"], SOCKET_DIR, False)
        argv += _bind(TOOLSERVER_DIR, f"{OPT}/toolserver", True)
        argv += _bind(PTYPROCESS_DIR, f"{OPT}/lib/ptyprocess", True)
        if spec.model_endpoint:
            argv += _bind(handle["endpoint_dir"], ENDPOINT_DIR, True)
        if env_dir:
            argv += _bind(env_dir, env_dir, True)
            for base in interpreter_binds(env_dir):  # its python's install (pyenv's), as under bwrap
                argv += _bind(base, base, True)
        for bind in spec.binds:
            argv += _bind(bind.host, bind.target, bind.read_only)
        return argv + [image, handle["instance"]]

    def exec_argv(self, spec: SandboxSpec, handle: Handle, env_dir: str | None) -> list[str]:
        """`exec instance://NAME python3 -m toolserver ...` with a clean, explicit environment."""
        env = sandbox_env(spec, env_dir) | {"PYTHONPATH": INSIDE_PYTHONPATH}
        argv = self.commands.prefix(["exec"]) + ["--cleanenv", "--pwd", "/"]
        for key, value in sorted(env.items()):
            argv += ["--env", f"{key}={value}"]
        argv += [f"instance://{handle['instance']}"]
        return argv + server_argv(
            (SYSTEM_PYTHON, *SERVER_MODULE),
            spec,
            tool_python(env_dir),
            socket=f"{SOCKET_DIR}/tool.sock",
            flags=limits.server_flags(spec.limits, [], userns=spec.fakeroot),
        )

    def start(self, spec: SandboxSpec, label: str = "") -> Sandbox:
        """Start the instance, then the tool server inside it; stop the instance on any failure."""
        handle = self.new_handle(spec, label)
        handle.update(instance=f"raas-{handle['id']}", binary=self.commands.binary)
        if spec.model_endpoint:
            handle.update(endpoint_paths(f"{OPT}/toolserver", ENDPOINT_DIR))
        write_handle(handle)  # the intent names the instance: a reaper can stop it
        try:
            env_dir = resolve_env(spec.python_env, self.settings.envs_root)
            image = self.resolve_image(spec.image)
            done = self.commands.run(self.start_argv(spec, handle, image, env_dir), self.start_timeout)
            if done.returncode:
                raise SandboxStartError(f"instance start failed: {done.stderr[-2000:]}")
            proc = self.commands.spawn(self.exec_argv(spec, handle, env_dir), {"PATH": os.defpath}, handle["log_file"])
            handle.update(pid=proc.pid, pid_start=start_time(proc.pid))
            self._wait_ready(handle, proc)
        except BaseException:
            self.kill(handle, self.commands)
            remove_state(handle)
            raise
        return self.save(handle)

    def _wait_ready(self, handle: Handle, proc: subprocess.Popen) -> None:
        end = time.monotonic() + self.start_timeout
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise SandboxStartError(f"tool server exited in the instance (see {handle['log_file']})")
            if os.path.exists(handle["socket"]):
                try:
                    ToolClient(handle["socket"]).call("ping", {}, 2.0)
                    pin_server(handle)  # the socket dir is bound in: later swaps are caught
                    return
                except (SandboxGone, SandboxTimeout):
                    pass
            time.sleep(0.02)
        raise SandboxStartError(f"tool server not ready after {self.start_timeout:g}s")

    @classmethod
    def kill(cls, handle: Handle, commands: SingularityCommands | None = None) -> None:
        """`instance stop --force`, then kill the exec process tree."""
        commands = commands or SingularityCommands(handle.get("binary"))
        if handle.get("instance"):
            try:
                commands.run(commands.prefix(["instance", "stop"]) + ["--force", handle["instance"]], STOP_TIMEOUT)
            except (OSError, SandboxTimeout):
                pass
        kill_pid(handle.get("pid"), handle.get("pid_start"), tree=True)
        wait_gone(handle.get("pid"), handle.get("pid_start"))

    @classmethod
    def alive(cls, handle: Handle) -> bool:
        """True while the tool server's exec process runs."""
        return pid_alive(handle.get("pid"), handle.get("pid_start"))
