"""Fixtures: real sandboxes (bwrap and local) in a private state dir, always stopped."""

from __future__ import annotations

import os
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
from sandbox.pool import POOLABLE, WarmPool


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
    """The attack tests run on cold sandboxes and on sandboxes claimed from a warm pool:
    isolation must hold for both alike."""
    if metafunc.module.__name__.endswith("test_security") and "start" in metafunc.fixturenames:
        metafunc.parametrize("start_mode", ["cold", "pooled"])


@pytest.fixture
def start_mode() -> str:
    """How `start` makes sandboxes: "cold" (a runtime's start) or "pooled" (a claim)."""
    return "cold"


@pytest.fixture
def start(state_dir, workspace, start_mode, tmp_path) -> Iterator:
    """start(runtime, **spec fields) -> a started Sandbox; everything is stopped at teardown.

    Pooled: the sandbox is claimed from a warm pool (its workspace is then the pool's slot
    folder, not `workspace`) unless the test names a workspace of its own."""
    pools: list[WarmPool] = []

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
        fields.setdefault("workspace", workspace)
        return get_runtime(runtime, state_dir=state_dir).start(SandboxSpec(**fields), label=label)

    yield _start
    for pool in pools:
        pool.close()
    for handle in list_sandboxes(state_dir, include_dead=True):
        stop_handle(handle)


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
