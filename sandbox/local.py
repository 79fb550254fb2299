"""LocalRuntime: the tool server as a plain host process; no isolation, for development only."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Literal

from pydantic import Field

from sandbox import limits
from sandbox.abstract import Runtime, RuntimeConfig, pin_server, server_ready, shutdown_quietly
from sandbox.client import Sandbox
from sandbox.environments import resolve_env
from sandbox.errors import SandboxStartError
from sandbox.handles import Handle, gated_popen, kill_pid, pid_alive, remove_state, wait_gone
from sandbox.inside import (
    SERVER_MODULE,
    SYSTEM_PYTHON,
    TOOLSERVER_DIR,
    endpoint_paths,
    sandbox_env,
    server_argv,
    tool_python,
)
from sandbox.registry import register
from sandbox.spec import SandboxSpec

log = logging.getLogger(__name__)
PACKAGE_DIR = str(Path(TOOLSERVER_DIR).parent)


class LocalConfig(RuntimeConfig):
    """Chooses the local runtime: no isolation (tests, trusted code)."""

    type: Literal["local"] = Field("local", description="The runtime's registered name")


@register(LocalConfig)
class LocalRuntime(Runtime):
    """Runs tools directly on the host: every file the user can reach is reachable."""

    def start(self, spec: SandboxSpec, label: str = "") -> Sandbox:
        """Spawn the tool server in its own session; it adopts orphans so stop finds them."""
        log.warning("local sandbox runtime: NO isolation for %s (development only)", label or "sandbox")
        if spec.inner_workspace != spec.workspace:  # no mount namespace to show it elsewhere
            raise SandboxStartError(
                f"the local runtime cannot show workspace {spec.workspace} at {spec.inner_workspace} "
                "(a branch's sandbox needs bwrap or singularity)"
            )
        handle = self.new_handle(spec, label)
        if spec.model_endpoint:  # no namespaces: the harness sees host paths as they are
            handle.update(endpoint_paths(TOOLSERVER_DIR, handle["endpoint_dir"]))
        env_dir = resolve_env(spec.python_env, self.settings.envs_root)
        python = tool_python(env_dir, SYSTEM_PYTHON if os.path.exists(SYSTEM_PYTHON) else sys.executable)
        env = sandbox_env(spec, env_dir) | {"PYTHONPATH": PACKAGE_DIR}
        ready_r, ready_w = os.pipe()
        argv = server_argv(
            (sys.executable, *SERVER_MODULE),
            spec,
            python,
            socket=handle["socket"],
            ready_fd=ready_w,
            flags=limits.server_flags(spec.limits, [], userns=False, isolated=False),
        )
        try:
            with open(handle["log_file"], "ab") as log_file:  # gated: its pid is on disk first
                proc = gated_popen(
                    argv,
                    handle,
                    env=env,
                    cwd=spec.workspace,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    pass_fds=(ready_w,),
                    start_new_session=True,
                )
        except BaseException:
            os.close(ready_w)
            os.close(ready_r)
            remove_state(handle)
            raise
        os.close(ready_w)
        try:
            server_ready(proc.poll, ready_r, self.start_timeout, handle["log_file"])
            pin_server(handle)
        except BaseException:
            self.kill(handle)
            remove_state(handle)
            raise
        finally:
            os.close(ready_r)
        return self.save(handle)

    @classmethod
    def kill(cls, handle: Handle) -> None:
        """Ask the server to stop its sessions, then kill its whole process tree."""
        if pid_alive(handle.get("pid"), handle.get("pid_start")):
            shutdown_quietly(handle, timeout=1.0)
        kill_pid(handle.get("pid"), handle.get("pid_start"), tree=True)
        wait_gone(handle.get("pid"), handle.get("pid_start"))

    @classmethod
    def alive(cls, handle: Handle) -> bool:
        """True while the server process runs."""
        return pid_alive(handle.get("pid"), handle.get("pid_start"))
