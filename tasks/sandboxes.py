"""The pipeline's use of sandboxes: start one per rollout attempt, re-attach, always release.

Sandboxes belong to the node: INIT starts one and stores its handle on the rollout; RUN and
EVAL (other processes) re-attach from the handle; whoever ends the rollout stops it. Runtime
"none" means the handler needs no sandbox.
"""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from core.settings import Settings
from sandbox import SandboxSettings

log = logging.getLogger(__name__)


def sandbox_settings(settings: Settings) -> SandboxSettings:
    """The sandbox package's settings, from the service's (it reads no environment itself)."""
    return SandboxSettings(state_dir=settings.sandbox_dir, node=settings.node,
                           envs_root=settings.envs_root, image_cache=settings.image_cache,
                           cgroup_parent=settings.sandbox_cgroup_parent)


def merged_options(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Job sandbox options with a handler's overrides (env and limits merge key by key)."""
    out = dict(base)
    for key, value in overrides.items():
        if key in ("env", "limits") and isinstance(value, dict):
            out[key] = {**(out.get(key) or {}), **value}
        else:
            out[key] = value
    return out


def wanted_runtime(settings: Settings, options: dict[str, Any], needs_sandbox: bool) -> str:
    """The runtime for a rollout: the job's choice, else the node default; "none" if unneeded."""
    if not needs_sandbox:
        return "none"
    return options.get("runtime") or settings.sandbox_runtime


def workspace_for(settings: Settings, rollout_id: str, attempt: int) -> Path:
    """A fresh host directory that becomes the sandbox's only writable path."""
    path = settings.workspaces / f"{rollout_id}-{attempt}"
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def ensure_declared_environment(settings: Settings, name: str | None) -> None:
    """Build a named environment a handler declares if this node has not built it yet.

    Undeclared names and paths are left to the runtime, which says how to build them.
    """
    if not name or os.path.isabs(name):
        return
    from agents.registry import declared_environments
    from sandbox.environments import ensure_environment

    packages = declared_environments().get(name)
    if packages is not None:
        ensure_environment(name, packages, settings.envs_root)


def start(settings: Settings, options: dict[str, Any], rollout_id: str, attempt: int,
          runtime: str, workspace: Path | None = None,
          state_dir: str | None = None) -> tuple[Any, dict[str, Any]]:
    """Start the rollout's sandbox (building its declared environment on first use) on a
    fresh workspace unless one is given; returns (client, handle)."""
    from sandbox import SandboxSpec, UnknownRuntime, get_runtime

    ensure_declared_environment(settings, options.get("python_env"))
    workspace = workspace or workspace_for(settings, rollout_id, attempt)
    fields = {k: v for k, v in options.items() if k != "runtime" and v is not None}
    spec = SandboxSpec(workspace=str(workspace), **fields)
    kwargs = {"state_dir": state_dir} if state_dir else {}
    try:
        chosen = get_runtime(runtime, sandbox_settings(settings), **kwargs)
    except UnknownRuntime as exc:  # a configuration mistake: retrying cannot help
        raise ConfigError(str(exc), runtime=runtime) from exc
    sb = chosen.start(spec, label=f"{rollout_id}:{attempt}")
    return sb, sb.handle


def stop(handle: dict[str, Any] | None) -> None:
    """Kill everything the sandbox runs but keep its workspace (RUN's end, before the artifact)."""
    if not handle:
        return
    from sandbox import stop_handle

    stop_handle(handle)


def attach(settings: Settings, handle: dict[str, Any] | None) -> Any:
    """A client for the sandbox behind `handle` (None when the rollout has none)."""
    if not handle:
        return None
    from sandbox import attach as attach_handle

    return attach_handle(handle, settings.node)


def release(handle: dict[str, Any] | None) -> None:
    """Stop the sandbox behind `handle` and delete its workspace; never raises."""
    if not handle:
        return
    try:
        from sandbox import stop_handle

        stop_handle(handle)
    except Exception:
        log.exception("stopping sandbox %s failed", handle.get("label"))
    workspace = handle.get("workspace")
    if workspace:
        shutil.rmtree(workspace, ignore_errors=True)
