"""What a sandbox runtime needs to know about its node, passed in by whoever starts sandboxes.

The sandbox package reads no environment variables and imports nothing of the service: the
pipeline (`tasks.sandboxing.sandboxes.sandbox_settings`) builds this from the service's Settings, a bare
library user builds it directly (every field has a default that works on a single machine).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_ENVS_ROOT = Path(".raas/envs")  # the service's default home is .raas


class SandboxSettings(BaseModel):
    """Node-level sandbox settings (the operator's, trusted); jobs choose a `SandboxSpec`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    state_dir: Path | None = Field(
        None, description="Per-user 0700 folder for sockets and handle files; default /tmp/raas-sandboxes-<uid>"
    )
    node: str = Field(
        default_factory=socket.gethostname, description="This node's name, recorded in handles (attach checks it)"
    )
    envs_root: Path = Field(DEFAULT_ENVS_ROOT, description="Folder of named Python environments")
    image_cache: Path | None = Field(
        None, description="Where pulled Singularity images are kept; default <envs_root>/../images"
    )
    cgroup_parent: Path | None = Field(
        None, description="cgroup v2 folder to create sandbox cgroups under; default this process's own cgroup"
    )
    isolate_tools: bool = Field(
        True,
        description="bwrap: the agent's tool sessions run in a pid namespace below the "
        "tool server's (they cannot signal, stop or trace it)",
    )
    root_sandbox_uid: int = Field(
        65534,
        ge=1,
        description="bwrap, when this process runs as root: the unprivileged host "
        "uid (and gid) sandboxes run as, so the agent reads only what "
        "that uid may (never root-only host files); default nobody",
    )
    start_timeout: float = Field(30.0, gt=0, description="Seconds a tool server has to start")
    allow_local_fallback: bool = Field(
        False,
        description="Whether `auto` may fall back to the unisolated local runtime when "
        "bwrap is unusable (the operator's decision, never a job's)",
    )

    @property
    def images(self) -> Path:
        """The effective image cache."""
        return Path(self.image_cache or Path(self.envs_root).resolve().parent / "images")

    def with_changes(self, **changes: object) -> SandboxSettings:
        """A validated copy with some fields replaced (None values are ignored)."""
        changes = {k: v for k, v in changes.items() if v is not None}
        if not changes:
            return self
        return SandboxSettings.model_validate({**self.model_dump(), **changes})


def default_state_dir() -> Path:
    """The per-user default state folder."""
    return Path(f"/tmp/raas-sandboxes-{os.getuid()}")
