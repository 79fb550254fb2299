"""Fixtures: real sandboxes (bwrap and local) in a private state dir, always stopped."""
from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from sandbox import Sandbox, SandboxLimits, SandboxSpec, get_runtime, list_sandboxes, stop_handle


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


@pytest.fixture
def start(state_dir, workspace) -> Iterator:
    """start(runtime, **spec fields) -> a started Sandbox; everything is stopped at teardown."""

    def _start(runtime: str = "bwrap", label: str = "test:0", **fields) -> Sandbox:
        fields.setdefault("workspace", workspace)
        if "limits" in fields and isinstance(fields["limits"], dict):
            fields["limits"] = SandboxLimits(**fields["limits"])
        return get_runtime(runtime, state_dir=state_dir).start(SandboxSpec(**fields), label=label)

    yield _start
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
