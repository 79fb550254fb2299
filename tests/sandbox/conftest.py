"""Fixtures: real sandboxes (bwrap and local) in a private state dir, always stopped."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from sandbox import (
    Sandbox,
    SandboxLimits,
    SandboxOptions,
    SandboxSettings,
    SandboxSpec,
    get_runtime,
    list_sandboxes,
    stop_handle,
)
from sandbox.bwrap import unprivileged_uid
from sandbox.handles import give_workspace
from sandbox.overlay import fork_folder
from sandbox.pool import POOLABLE, WarmPool
from sandbox.spec import Overlay


@pytest.fixture
def state_dir(tmp_path_factory) -> str:
    """A private node state dir so tests never see each other's (or production) sandboxes."""
    return str(tmp_path_factory.mktemp("state"))


@pytest.fixture
def workspace(tmp_path) -> str:
    """The only writable host directory of the sandbox under test."""
    path = tmp_path / "ws"
    path.mkdir()
    return str(path)


def pytest_generate_tests(metafunc) -> None:
    """The attack tests run on cold sandboxes, on sandboxes claimed from a warm pool, on
    forks of a prepared layer (copy-on-write workspaces) and on fork slots claimed over one
    (started before the layer, mounted at the claim): isolation must hold for all alike."""
    if metafunc.module.__name__.endswith("test_security") and "start" in metafunc.fixturenames:
        metafunc.parametrize("start_mode", ["cold", "pooled", "forked", "slot"])


@pytest.fixture
def start_mode() -> str:
    """How `start` makes sandboxes: "cold" (a runtime's start), "pooled" (a claim),
    "forked" (a bwrap sandbox whose workspace is a copy-on-write layer over a prepared one)
    or "slot" (a fork slot claimed from a warm pool over that layer)."""
    return "cold"


@pytest.fixture
def start(state_dir, workspace, start_mode, tmp_path) -> Iterator:
    """start(runtime, **spec fields) -> a started Sandbox; everything is stopped at teardown.

    Pooled: the sandbox is claimed from a warm pool (its workspace is then the pool's slot
    folder, not `workspace`) unless the test names a workspace of its own."""
    pools: list[WarmPool] = []
    forks: list[str] = []

    def _start(runtime: str = "bwrap", label: str = "test:0", **fields) -> Sandbox:
        if "limits" in fields and isinstance(fields["limits"], dict):
            fields["limits"] = SandboxLimits(**fields["limits"])
        if start_mode == "pooled" and "workspace" not in fields and runtime in POOLABLE:
            options = SandboxOptions(**fields)
            pools.append(WarmPool(SandboxSettings(state_dir=state_dir), tmp_path / "slots", 1))
            assert pools[-1].wait_ready(options, runtime, timeout=60), "no warm sandbox"
            sandbox = pools[-1].claim(options, runtime, label)
            assert sandbox is not None and sandbox.label == label
            return sandbox
        if start_mode == "slot" and "workspace" not in fields and runtime == "bwrap":
            return claim_slot(pools, SandboxOptions(**fields), state_dir, tmp_path, label)
        if start_mode == "forked" and "workspace" not in fields and runtime == "bwrap":
            fields.update(fork_fields(tmp_path / f"fork-{len(forks)}", shared_lower(tmp_path)))
            forks.append(fields["workspace"])
        fields.setdefault("workspace", workspace)
        return get_runtime(runtime, state_dir=state_dir).start(SandboxSpec(**fields), label=label)

    yield _start
    for pool in pools:
        pool.close()
    for handle in list_sandboxes(state_dir, include_dead=True):
        stop_handle(handle)


def claim_slot(pools: list[WarmPool], options: SandboxOptions, state_dir: str, tmp_path, label: str) -> Sandbox:
    """A fork slot over `shared_lower`, started by a warm pool before the claim names it."""
    lower = shared_lower(tmp_path)
    pools.append(WarmPool(SandboxSettings(state_dir=state_dir), tmp_path / "slots", 1))
    pools[-1].want(options, "bwrap", os.path.dirname(lower))
    end = time.monotonic() + 60
    while pools[-1].stats()["ready"] < 1 and time.monotonic() < end:
        time.sleep(0.05)
    sandbox = pools[-1].claim(options, "bwrap", label, lower=lower)
    assert sandbox is not None and sandbox.label == label and "fork_slot" not in sandbox.handle
    assert sandbox.handle["overlay"]["lower"] == lower
    return sandbox


def shared_lower(tmp_path) -> str:
    """A prepared lower layer (made once per test): a few files and folders, owned by the
    uid sandboxes run as, as a group's preparer leaves it."""
    lower = tmp_path / "lower"
    if not lower.exists():
        (lower / "pkg").mkdir(parents=True)
        (lower / "pkg" / "mod.py").write_text("VALUE = 1\n")
        (lower / "README").write_text("shared\n")
        uid = unprivileged_uid(SandboxSettings())
        if uid is not None:
            give_workspace(str(lower), uid)
    return str(lower)


def fork_fields(folder, lower: str) -> dict:
    """SandboxSpec fields of a fork of `lower` in a fresh fork folder."""
    ws, work = fork_folder(folder)
    return {"workspace": ws, "overlay": Overlay(lower=lower, work=work)}


@pytest.fixture(params=["bwrap", "local"])
def sb(request, start) -> Sandbox:
    """One sandbox per runtime that must support the whole API here."""
    return start(request.param)


def host_processes_matching(text: str) -> list[int]:
    """Host pids whose command line contains `text`."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as handle:
                    if text.encode() in handle.read():
                        found.append(int(name))
            except OSError:
                pass
    return found
