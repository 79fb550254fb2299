"""What a sandbox is made of: the options a job may set and the full spec a runtime starts."""

from __future__ import annotations

import os
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from sandbox.registry import check_runtime_name, runtime_config


def _chosen_runtime(value: Any) -> Any:
    """A runtime chosen as its config (`{"type": "bwrap"}`, validated against the union the
    registry builds) is stored by its name, as a name given on the wire always was."""
    return runtime_config(value).type if isinstance(value, dict) else value


# A registered runtime, "auto" or "none" (checked against the registry, not restated here),
# given as a name or as the runtime's config model.
RuntimeName = Annotated[str, BeforeValidator(_chosen_runtime), AfterValidator(check_runtime_name)]


class SandboxLimits(BaseModel):
    """Resource ceilings applied to everything the sandbox runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    call_timeout: float = Field(60.0, gt=0, description="Default wall seconds per tool call")
    memory_mb: int = Field(4096, gt=0, description="Memory per sandbox (cgroup) / per process (rlimit)")
    max_procs: int = Field(512, ge=8, description="Most processes alive at once in the sandbox")
    output_bytes: int = Field(64 * 1024, ge=256, description="Output kept for the model per call")
    file_size_mb: int = Field(1024, gt=0, description="Largest file a sandboxed process may write")
    disk_mb: int = Field(
        10240,
        gt=0,
        description="Most the workspace may hold; past it a watchdog stops the sandbox (agent_error disk_quota)",
    )
    tmp_mb: int | None = Field(
        None, gt=0, description="Size of the sandbox's /tmp and /run tmpfs (bwrap); default a quarter of memory_mb"
    )

    @property
    def tmp_bytes(self) -> int:
        """/tmp size in bytes: tmpfs pages count against memory, so a full /tmp must not OOM."""
        return (self.tmp_mb or max(16, self.memory_mb // 4)) * 1024 * 1024


class Bind(BaseModel):
    """A host path made visible inside the sandbox."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(description="Absolute host path")
    sandbox: str | None = Field(None, description="Absolute path inside; default same as host")
    read_only: bool = Field(True, description="Mount read-only (the default)")

    @field_validator("host", "sandbox")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not os.path.isabs(value):
            raise ValueError(f"bind path {value!r} must be absolute")
        return value

    @property
    def target(self) -> str:
        """The path inside the sandbox."""
        return self.sandbox or self.host


class SandboxOptions(BaseModel):
    """The sandbox settings a job may choose over the REST API."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    runtime: RuntimeName | None = Field(None, description="Runtime; None = the node default")
    image: str | None = Field(None, description="Rootfs directory (bwrap), .sif path or docker:// ref (singularity)")
    python_env: str | None = Field(None, description="Named environment under <RAAS home>/envs, or an absolute path")
    binds: list[Bind] = Field(default_factory=list, description="Extra host paths to mount")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment variables")
    network: bool = Field(False, description="Share the host network (off = no network at all)")
    workdir: str | None = Field(None, description="Initial directory inside; default workspace")
    limits: SandboxLimits = Field(default_factory=SandboxLimits, description="Resource limits")
    fakeroot: bool = Field(False, description="Singularity --fakeroot (root inside, not outside)")
    group_fork: bool | None = Field(
        None,
        description="Prepare each GRPO group's workspace once per node and start its samples on "
        "copy-on-write forks of it; None = where the agent declares its INIT forkable",
    )

    @field_validator("workdir")
    @classmethod
    def _workdir_absolute(cls, value: str | None) -> str | None:
        if value is not None and not os.path.isabs(value):
            raise ValueError(f"workdir {value!r} must be an absolute path inside the sandbox")
        return value


def _absolute_host_dir(value: str) -> str:
    if not os.path.isabs(value):
        raise ValueError(f"host path {value!r} must be absolute")
    return os.path.normpath(value)


# A host folder the service names for a sandbox (an overlay's layers, a fork slot's folders).
HostDir = Annotated[str, AfterValidator(_absolute_host_dir)]


class Overlay(BaseModel):
    """A copy-on-write workspace (`sandbox.overlay`): the workspace is the private upper layer
    over `lower`, a prepared folder the sandbox reads but never changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lower: HostDir = Field(description="Absolute host dir: the shared, read-only lower layer")
    work: HostDir = Field(description="Absolute host dir: overlayfs' work dir, beside the workspace in its fork folder")


class ForkSlot(BaseModel):
    """A fork started before its layer is known (`sandbox/toolserver/attach.py`): the node's
    layers folder and the slot's fork folder are staged inside, and the workspace becomes a
    copy-on-write fork of one folder of `layers` when the sandbox is claimed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layers: HostDir = Field(description="Absolute host dir whose folders are prepared layers")
    work: HostDir = Field(description="Absolute host dir: overlayfs' work dir, beside the workspace in its fork folder")


class SandboxSpec(SandboxOptions):
    """Everything a runtime needs to start one sandbox (never chosen by a job as a whole:
    the fields below SandboxOptions' are the service's)."""

    workspace: str = Field(description="Absolute host dir, the only writable host path; same path inside")
    workspace_inside: str | None = Field(
        None,
        description="Where the workspace appears inside when not at its host path: a branch's "
        "sandbox shows its own workspace at its parent's path, the one the parent's prompt and "
        "tool outputs name (bwrap and singularity; the local runtime refuses it)",
    )
    model_endpoint: bool = Field(
        False,
        description="Make a per-sandbox folder for a model endpoint's Unix socket, "
        "bound read-only inside (`sandbox.bridge`)",
    )
    overlay: Overlay | None = Field(
        None,
        description="Make the workspace a private copy-on-write layer over a prepared folder "
        "(runtimes whose `overlay_unavailable_reason` is None)",
    )

    fork_slot: ForkSlot | None = Field(
        None,
        description="Start as a fork slot: the workspace is a fork of a layer named at the claim "
        "(bwrap with isolated tools: `Runtime.fork_slots_unavailable_reason`)",
    )

    @property
    def inner_workspace(self) -> str:
        """The workspace's path inside the sandbox."""
        return self.workspace_inside or self.workspace

    @field_validator("workspace_inside")
    @classmethod
    def _inside_absolute(cls, value: str | None) -> str | None:
        if value is not None and not os.path.isabs(value):
            raise ValueError(f"workspace_inside {value!r} must be an absolute path")
        return value

    @field_validator("workspace")
    @classmethod
    def _workspace_absolute(cls, value: str) -> str:
        if not os.path.isabs(value):
            raise ValueError(f"workspace {value!r} must be an absolute path")
        return os.path.normpath(value)
