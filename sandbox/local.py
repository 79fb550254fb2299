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
from sandbox.handles import Handle, gated_popen, kill_pid, pid_alive, remove_state, wait_gone
from sandbox.inside import ENDPOINT_SOCKET, sandbox_env
from sandbox.registry import register
from sandbox.spec import SandboxSpec

log = logging.getLogger(__name__)
PACKAGE_DIR = str(Path(__file__).resolve().parent)


class LocalConfig(RuntimeConfig):
    """Chooses the local runtime: no isolation (tests, trusted code)."""

    type: Literal["local"] = Field("local", description="The runtime's registered name")


@register(LocalConfig)
class LocalRuntime(Runtime):
    """Runs tools directly on the host: every file the user can reach is reachable."""

    def start(self, spec: SandboxSpec, label: str = "") -> Sandbox:
        """Spawn the tool server in its own session; it adopts orphans so stop finds them."""
        log.warning("local sandbox runtime: NO isolation for %s (development only)", label or "sandbox")
        handle = self.new_handle(spec, label)
        if spec.model_endpoint:  # no namespaces: the harness sees host paths as they are
            tools = os.path.join(PACKAGE_DIR, "toolserver")
            handle.update(
                endpoint_inside=os.path.join(handle["endpoint_dir"], ENDPOINT_SOCKET),
                relay=os.path.join(tools, "relay.py"),
                detach=os.path.join(tools, "detach.py"),
            )
        env_dir = resolve_env(spec.python_env, self.settings.envs_root)
        python = (
            f"{env_dir}/bin/python3"
            if env_dir
            else ("/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable)
        )
        env = sandbox_env(spec, env_dir) | {"PYTHONPATH": PACKAGE_DIR}
        ready_r, ready_w = os.pipe()
        argv = [
            sys.executable,
            "-s",
            "-B",
            "-m",
            "toolserver",
            "--socket",
            handle["socket"],
            "--workspace",
            spec.workspace,
            "--workdir",
            spec.workdir or spec.workspace,
            "--python",
            python,
            "--ready-fd",
            str(ready_w),
            *limits.server_flags(spec.limits, [], userns=False, isolated=False),
        ]
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
