"""Intent records: a sandbox is on disk before it starts, so a starter killed at any point
leaves nothing a reaper cannot find and stop (real bwrap and local sandboxes, real kills)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox import list_sandboxes
from sandbox.handles import STARTING, gated_popen, orphaned, pid_alive, read_handles, write_intent
from sandbox.toolserver.procs import descendants, start_time

PY = sys.executable
# A starter that launches a sandbox whose tool server never reports ready (it hangs in
# `server_ready`), then waits to be killed: the moment an INIT worker dies mid-start.
HUNG_STARTER = """
import sys, time
import sandbox.abstract, sandbox.bwrap, sandbox.local
from sandbox import SandboxSpec, get_runtime
def hang(*args, **kwargs):
    print("launched", flush=True)
    time.sleep(600)
sandbox.bwrap.server_ready = sandbox.local.server_ready = hang
get_runtime(sys.argv[1], state_dir=sys.argv[2]).start(SandboxSpec(workspace=sys.argv[3]),
                                                      label="r:1")
"""


def _gone(pids: list[int], starts: dict[int, int | None], timeout: float = 5) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not any(pid_alive(pid, starts[pid]) for pid in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("runtime", ["bwrap", "local"])
def test_a_start_killed_midway_is_found_and_stopped(runtime, state_dir, workspace):
    starter = subprocess.Popen(
        [PY, "-c", HUNG_STARTER, runtime, state_dir, workspace], stdout=subprocess.PIPE, text=True
    )
    try:
        assert starter.stdout.readline().strip() == "launched"
        [handle] = read_handles(Path(state_dir))
        assert handle["state"] == STARTING and handle["owner_pid"] == starter.pid
        assert handle["label"] == "r:1" and handle["workspace"] == workspace
        launcher = handle["pid"]
        # while its starter lives, the start is left alone (it may still finish)
        assert not orphaned(handle)
        assert [h["id"] for h in list_sandboxes(state_dir)] == [handle["id"]]
        # bwrap: the launcher, the namespace's init and the tool server; local: the server
        want = 3 if runtime == "bwrap" else 1
        end = time.monotonic() + 10
        while len(tree := [launcher, *descendants(launcher)]) < want and time.monotonic() < end:
            time.sleep(0.02)
        assert len(tree) >= want
        starts = {pid: start_time(pid) for pid in tree}
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait(10)
    # the starter is dead: the sandbox runs on, and only the intent record knows it
    assert any(pid_alive(pid, starts[pid]) for pid in tree)
    [handle] = read_handles(Path(state_dir))
    assert orphaned(handle)
    assert [h["id"] for h in list_sandboxes(state_dir, include_dead=True)] == [handle["id"]]
    assert list_sandboxes(state_dir) == []  # the listing stops orphaned starts on the way
    assert _gone(tree, starts), [p for p in tree if pid_alive(p, starts[p])]
    assert os.listdir(state_dir) == []  # handle file, log and socket folder removed
    assert all(not os.path.exists(path) for path in handle.get("cgroups") or [])


def test_the_gate_runs_nothing_unless_the_pid_is_recorded(tmp_path):
    marker = tmp_path / "ran"
    handle = {"handle_file": str(tmp_path / "h.json")}
    proc = gated_popen(["/bin/touch", str(marker)], handle)
    assert proc.wait(10) == 0 and marker.exists()
    assert json.loads(Path(handle["handle_file"]).read_text())["pid"] == proc.pid

    marker.unlink()
    unwritable = {"handle_file": str(tmp_path / "missing-dir" / "h.json")}
    with pytest.raises(OSError):  # the starter fails (or dies) before the pid is on disk
        gated_popen(["/bin/touch", str(marker)], unwritable)
    time.sleep(0.5)
    assert not marker.exists()


def test_an_intent_without_a_launch_is_removed_once_its_starter_is_dead(state_dir):
    sleeper = subprocess.Popen(["sleep", "30"])
    dead_owner = (sleeper.pid, start_time(sleeper.pid))
    sleeper.kill()
    sleeper.wait()
    handles = []
    for name, owner in (("mine", None), ("theirs", dead_owner)):
        socket_dir = Path(state_dir) / name
        handle = {
            "runtime": "bwrap",
            "id": name,
            "label": f"{name}:1",
            "workspace": "/nowhere",
            "socket_dir": str(socket_dir),
            "socket": str(socket_dir / "tool.sock"),
            "handle_file": str(Path(state_dir) / f"{name}.json"),
            "log_file": str(Path(state_dir) / f"{name}.log"),
        }
        write_intent(handle)  # this process is the starter...
        if owner:  # ...except for the one a dead process was starting
            handle["owner_pid"], handle["owner_start"] = owner
            Path(handle["handle_file"]).write_text(json.dumps(handle))
        socket_dir.mkdir()
        handles.append(handle)
    assert [h["id"] for h in list_sandboxes(state_dir)] == ["mine"]
    assert sorted(os.listdir(state_dir)) == ["mine", "mine.json"]
