"""A job's sandbox variables reach only the inside of a bwrap sandbox, never the host-side
launcher (sh + bwrap) processes; `auto` falls back to `local` only when allowed."""

from __future__ import annotations

import pytest

from sandbox import get_runtime
from sandbox.bwrap import BwrapRuntime
from sandbox.errors import SandboxStartError
from sandbox.settings import SandboxSettings


def _environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as handle:
        pairs = [item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item]
    return {k.decode(): v.decode() for k, v in pairs}


def test_job_variables_are_set_inside_only(start) -> None:
    sb = start("bwrap", env={"MY_FLAG": "inside-only", "LD_PRELOAD": "/nonexistent/evil.so"})
    assert sb.bash("echo $MY_FLAG").output.strip() == "inside-only"
    launcher = _environ(sb.handle["pid"])  # the host-side bwrap process
    assert "MY_FLAG" not in launcher and "LD_PRELOAD" not in launcher
    assert set(launcher) <= {"PATH", "LANG", "PWD"}  # PWD: set by the cgroup-joining sh


def test_auto_falls_back_to_local_only_when_allowed(monkeypatch) -> None:
    # The narrowest fake: bwrap's probe says it is unusable (it is usable on this machine).
    monkeypatch.setattr(BwrapRuntime, "unavailable_reason", classmethod(lambda cls: "probe"))
    with pytest.raises(SandboxStartError, match="not allowed"):
        get_runtime("auto")
    assert get_runtime("auto", SandboxSettings(allow_local_fallback=True)).name == "local"
