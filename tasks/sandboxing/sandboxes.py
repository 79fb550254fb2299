"""The pipeline's use of sandboxes: start one per rollout attempt, re-attach, always release.

Sandboxes belong to the node: INIT starts one and stores its handle on the rollout; RUN and
EVAL (other processes) re-attach from the handle; whoever ends the rollout stops it. Runtime
"none" means the handler needs no sandbox. The worker holds the job's sandbox options to its
own operator policy again (the gateway did at submission): names only for environments and
images (resolved here under the operator's roots), limits within the caps, and `auto` falls
back to the unisolated local runtime only when the policy lists `local`.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from core.errors import ConfigError, InvalidRequest
from core.policy import check_sandbox_options, local_fallback_allowed, plain_name
from core.settings import Settings
from sandbox import SandboxSettings
from sandbox.spec import SandboxLimits, SandboxOptions

log = logging.getLogger(__name__)
# `<rollout>-<attempt>` (INIT's), `<rollout>-<attempt>-eval` (grading) and `<rollout>-<attempt>-fork`
# (a group fork's folder: upper layer and overlay work dir) under `workspaces`
ATTEMPT_FOLDER = re.compile(r"^([0-9a-f]{32})-(\d+)(?:-eval|-fork)?$")


def check_node_settings(settings: Settings) -> None:
    """Fail at start-up on a runtime name the sandbox registry does not know (core cannot
    check it: it imports nothing of the sandbox)."""
    from sandbox.registry import check_runtime_name

    try:
        check_runtime_name(settings.sandbox_runtime)
    except ValueError as exc:
        raise ConfigError(f"RAAS_SANDBOX_RUNTIME: {exc}", field="sandbox_runtime") from exc


def sandbox_settings(settings: Settings) -> SandboxSettings:
    """The sandbox package's settings, from the service's (it reads no environment itself)."""
    return SandboxSettings(
        state_dir=settings.sandbox_dir,
        node=settings.node,
        envs_root=settings.envs_root,
        image_cache=settings.image_cache,
        cgroup_parent=settings.sandbox_cgroup_parent,
        isolate_tools=settings.sandbox_isolate_tools,
        allow_local_fallback=local_fallback_allowed(settings.policy.sandbox),
    )


def merged_options(chosen: SandboxOptions, overrides: dict[str, Any]) -> dict[str, Any]:
    """The fields a rollout's sandbox spec is made from: the options the job chose (its set
    fields) with a handler's overrides (env and limits merge key by key)."""
    out = chosen.model_dump(mode="json", exclude_unset=True)
    for key, value in overrides.items():
        if key in ("env", "limits") and isinstance(value, dict):
            out[key] = {**(out.get(key) or {}), **value}
        else:
            out[key] = value
    return out


def wanted_runtime(settings: Settings, chosen: SandboxOptions, needs_sandbox: bool) -> str:
    """The runtime for a rollout: the job's choice, else the node default; "none" if unneeded.

    The job's own options must pass this node's policy (InvalidRequest names the rule)."""
    if not needs_sandbox:
        return "none"
    check_sandbox_options(settings.policy.sandbox, chosen)
    return chosen.runtime or settings.sandbox_runtime


def spec_fields(settings: Settings, options: dict[str, Any], runtime: str) -> dict[str, Any]:
    """SandboxSpec fields from merged job + handler options: names resolved under the
    operator's roots, default limits no higher than the operator's caps."""
    fields = {k: v for k, v in options.items() if k not in ("runtime", "group_fork") and v is not None}
    # A job's own options are names (held to the policy in `wanted_runtime`); an absolute path
    # here is one a handler resolved under an operator root (e.g. a per-instance image).
    if "python_env" in fields and not os.path.isabs(fields["python_env"]):
        plain_name(fields["python_env"], "sandbox.python_env")  # built under <home>/envs
    if "image" in fields and not os.path.isabs(fields["image"]):
        fields["image"] = resolve_image(settings, fields["image"], runtime)
    # Defaults the job left alone come down to the operator's caps; values given were held to
    # the caps already (the job's) or are the service's own (a handler's, EVAL's output room).
    caps = settings.policy.sandbox.max_limits.model_dump()
    defaults = {
        name: value if value is None or name not in caps else min(value, caps[name])
        for name, value in SandboxLimits().model_dump().items()
    }
    fields["limits"] = {**defaults, **(fields.get("limits") or {})}
    return fields


def resolve_image(settings: Settings, name: str, runtime: str) -> str:
    """An image name as its path under `image_root`: `<name>.sif` (singularity) or `<name>/`."""
    plain_name(name, "sandbox.image")
    if settings.image_root is None:
        raise InvalidRequest(f"sandbox.image {name!r}: this node has no image_root", field="image")
    path = settings.image_root.resolve() / (f"{name}.sif" if runtime == "singularity" else name)
    if not path.exists():
        raise InvalidRequest(f"sandbox.image {name!r} is not under this node's image root", field="sandbox.image")
    return str(path)


def workspace_for(settings: Settings, rollout_id: str, attempt: int) -> Path:
    """A fresh host directory that becomes the sandbox's only writable path."""
    path = settings.workspaces / f"{rollout_id}-{attempt}"
    if path.exists():
        shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def attempt_folders(settings: Settings) -> dict[str, str]:
    """This node's workspace folders of rollout attempts, as {path: "<rollout>:<attempt>"}
    (the label their sandboxes carry): cold starts' by their name, claimed pool slots' by
    their claim record, and unclaimed slots of a dead pool as "" (never live); other folders
    (re-evaluations, slots of a live pool) are not listed."""
    from sandbox.pool import slot_folders

    try:
        names = os.listdir(settings.workspaces)
    except FileNotFoundError:
        return {}
    found = {path: label or "" for path, label in slot_folders(settings.workspaces).items()}
    for name in names:
        match = ATTEMPT_FOLDER.match(name)
        if match:
            found[str(settings.workspaces / name)] = f"{match[1]}:{int(match[2])}"
    return found


def ensure_declared_environment(settings: Settings, name: str | None) -> None:
    """Build a named environment a handler (or a registered harness) declares if this node
    has not built it yet.

    Undeclared names and paths are left to the runtime, which says how to build them.
    """
    if not name or os.path.isabs(name):
        return
    from agents.registry import declared_environments
    from sandbox.environments import SYSTEM_PYTHON, ensure_environment

    packages, npm, python = declared_environments().get(name), [], SYSTEM_PYTHON
    if packages is None:  # a registered harness's environment (operator policy)
        from core.harnesses import harness_environments, harness_pythons

        registered = settings.policy.harnesses.registered
        packages, npm = harness_environments(registered).get(name, (None, []))
        python = harness_pythons(registered).get(name, SYSTEM_PYTHON)
    if packages is not None:
        pythons = settings.policy.harnesses.pythons
        ensure_environment(name, packages, settings.envs_root, python=python, npm=npm, pythons=pythons)


def warm_pool(settings: Settings) -> Any:
    """This process's warm pool of sandboxes (`sandbox.pool`), slots under the workspaces."""
    from sandbox.pool import pool_for

    return pool_for(
        sandbox_settings(settings), settings.workspaces, settings.sandbox_pool_size, settings.sandbox_fork_slots
    )


def close_warm_pools() -> None:
    """Stop this process's unclaimed warm sandboxes (a worker that exits; a killed one
    leaves them to the reaper)."""
    from sandbox.pool import close_pools

    try:
        close_pools()
    except Exception:  # the exit must go on; the reaper stops what is left
        log.exception("closing the warm sandbox pools failed")


def claim(
    settings: Settings,
    options: dict[str, Any],
    rollout_id: str,
    attempt: int,
    runtime: str,
    lower: str | None = None,
    group: str | None = None,
) -> tuple[Any, dict[str, Any]] | None:
    """A warm sandbox for the rollout from this process's pool, or None when the pool holds
    none of this shape (the miss teaches the pool the shape). Its slot folder is the
    workspace: whatever the host writes there after the claim needs `hand_over`. A sandbox
    with a model endpoint folder (a harness's RUN) always starts cold: the folder is made per
    sandbox at its start, and a harness rollout runs for minutes, not milliseconds. So does a
    branch's (its workspace shown at its parent's path, `workspace_inside`): the pool's are not."""
    shape = _pool_shape(settings, options, runtime)
    if shape is None:
        return None
    sb = warm_pool(settings).claim(shape, runtime, f"{rollout_id}:{attempt}", lower, group)
    return (sb, sb.handle) if sb is not None else None


def _pool_shape(settings: Settings, options: dict[str, Any], runtime: str) -> Any:
    """The pool's shape (`SandboxOptions`) for these options, its environment built; None for
    a sandbox the pool never holds (no runtime, a model endpoint, a branch's workspace)."""
    from sandbox import SandboxOptions

    if runtime == "none" or options.get("model_endpoint") or options.get("workspace_inside"):
        return None
    ensure_declared_environment(settings, options.get("python_env"))
    return SandboxOptions(**spec_fields(settings, options, runtime))


def want_forks(
    settings: Settings, options: dict[str, Any], runtime: str, layers: Path, group: str, samples: int
) -> None:
    """Ask this process's pool ahead for fork slots of this shape over the node's `layers`
    folder (`WarmPool.want`): a group's sample asks while its layer is prepared or waited
    for, and the group's first ask here counts its `samples` forks to come."""
    shape = _pool_shape(settings, options, runtime)
    if shape is not None:
        warm_pool(settings).want(shape, runtime, str(layers), group, samples)


def start(
    settings: Settings,
    options: dict[str, Any],
    rollout_id: str,
    attempt: int,
    runtime: str,
    workspace: Path | None = None,
    state_dir: str | None = None,
) -> tuple[Any, dict[str, Any]]:
    """The rollout's sandbox (building its declared environment on first use): a warm one
    from this process's pool when it holds one of this shape (`claim`), else started cold on
    a fresh workspace; returns (client, handle). A caller that brings its own workspace or
    state folder always starts cold."""
    from sandbox import SandboxSpec, UnknownRuntime, get_runtime

    if workspace is None and state_dir is None:
        warm = claim(settings, options, rollout_id, attempt, runtime)
        if warm is not None:
            return warm
    ensure_declared_environment(settings, options.get("python_env"))
    fields = spec_fields(settings, options, runtime)
    workspace = workspace or workspace_for(settings, rollout_id, attempt)
    spec = SandboxSpec(workspace=str(workspace), **fields)
    kwargs = {"state_dir": state_dir} if state_dir else {}
    try:
        chosen = get_runtime(runtime, sandbox_settings(settings), **kwargs)
    except UnknownRuntime as exc:  # a configuration mistake: retrying cannot help
        raise ConfigError(str(exc), runtime=runtime) from exc
    sb = chosen.start(spec, label=f"{rollout_id}:{attempt}")
    return sb, sb.handle


def start_fork(
    settings: Settings,
    options: dict[str, Any],
    rollout_id: str,
    attempt: int,
    runtime: str,
    lower: str,
    mode: str,
    group: str | None = None,
) -> tuple[Any, dict[str, Any]]:
    """A group sample's sandbox over its group's prepared `lower` folder: a copy-on-write
    overlay (mode "overlay": its own folder `<rollout>-<attempt>-fork` holds the upper layer
    and the overlay's work dir), or a fresh workspace holding a copy of it ("copy")."""
    from sandbox.overlay import copy_lower, fork_folder

    if mode == "copy":
        workspace = workspace_for(settings, rollout_id, attempt)
        copy_lower(lower, str(workspace))
        return start(settings, options, rollout_id, attempt, runtime, workspace=workspace)
    warm = claim(settings, options, rollout_id, attempt, runtime, lower=lower, group=group)
    if warm is not None:  # a fork slot, or a fork of this layer the pool started ahead
        return warm
    upper, work = fork_folder(settings.workspaces / f"{rollout_id}-{attempt}-fork")
    forked = {**options, "overlay": {"lower": lower, "work": work}}
    return start(settings, forked, rollout_id, attempt, runtime, workspace=Path(upper))


def start_metric(handle: dict[str, Any], seconds: float) -> dict[str, Any]:
    """A rollout's `metrics.sandbox_start`: how INIT got its sandbox ("fork slot": a warm
    fork mounted at the claim, "fork": a fork started cold, "warm": a pooled claim, "cold")
    and the milliseconds it took (a fork's from the moment its group's layer was ready)."""
    forked, claimed = bool(handle.get("overlay")), bool(handle.get("claimed"))
    kind = ("fork slot" if claimed else "fork") if forked else ("warm" if claimed else "cold")
    return {"kind": kind, "ms": round(seconds * 1000, 1)}


def hand_over(handle: dict[str, Any] | None) -> None:
    """Give the host's writes into a running sandbox's workspace to the sandbox's uid."""
    if handle:
        from sandbox.handles import hand_over as give

        give(handle)


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
    if workspace:  # a fork's whole folder (upper layer, work dir), never its group's layer
        remove_workspace(os.path.dirname(workspace) if handle.get("overlay") else workspace)


def remove_workspace(path: str | Path) -> None:
    """Delete a workspace folder (and a pool slot's claim record beside it)."""
    from sandbox.pool import remove_slot

    remove_slot(path)
