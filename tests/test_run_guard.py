"""RUN's guard: whose fault a broken sandbox is, and the rootless workspace quota.

The pipeline battery (tests/agents/test_reward_attacks.py) drives the real cases (a killed
tool server, a workspace over quota); here the diagnosis table and the watchdog alone,
including the OOM case, which a test cannot provoke without starving the shared machine.
"""

from __future__ import annotations

from pathlib import Path

from raas_client.models import Trajectory

from sandbox import SandboxGone, SandboxOptions, SandboxTimeout
from sandbox.quota import DiskWatch
from tasks.sandboxing.run_guard import RunGuard


def test_a_vanished_server_is_the_agents_doing_a_slow_one_is_not(tmp_path: Path) -> None:
    cgroup = tmp_path / "raas-x"
    cgroup.mkdir()
    (cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n")
    guard = RunGuard({"workspace": str(tmp_path), "cgroups": [str(cgroup)]}, SandboxOptions())
    assert guard.diagnose(SandboxGone("closed")) == "tool_server_died"
    assert guard.diagnose(SandboxTimeout("slow")) is None  # an overloaded node looks the same
    assert guard.diagnose(RuntimeError("bug")) is None
    (cgroup / "memory.events").write_text("oom 2\noom_kill 1\n")
    assert guard.diagnose(SandboxGone("closed")) == "oom"
    (cgroup / "memory.events").unlink()  # cgroup v1 spells it in memory.oom_control
    (cgroup / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n")
    assert guard.diagnose(SandboxGone("closed")) == "oom"


def test_the_watchdog_stops_the_sandbox_past_the_quota(tmp_path: Path) -> None:
    stopped = []
    watch = DiskWatch(str(tmp_path), 2 * 2**20, lambda: stopped.append(True), interval=0.05)
    (tmp_path / "small").write_bytes(b"x" * 2**20)
    assert watch.check() is None and not stopped
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "big").write_bytes(b"x" * 3 * 2**20)
    (tmp_path / "link").symlink_to("/usr")  # never followed, never counted as /usr's size
    assert "quota 2 MB" in watch.check() and stopped == [True]
    guard = RunGuard({"workspace": str(tmp_path), "runtime": "local"}, SandboxOptions(limits={"disk_mb": 2}))
    with guard.watching():
        import time

        deadline = time.monotonic() + 10
        while guard.watch.exceeded is None and time.monotonic() < deadline:
            time.sleep(0.05)
    assert guard.diagnose(SandboxGone("closed")) == "disk_quota"


def test_a_workspace_filled_just_before_submitting_is_over_quota_all_the_same(tmp_path: Path) -> None:
    """The agent fills its disk and submits within one watch interval: the watch measures once
    more as the RUN ends, and the episode is the agent's failure (not graded), not a sample."""
    guard = RunGuard({"workspace": str(tmp_path), "runtime": "local"}, SandboxOptions(limits={"disk_mb": 2}))
    guard.watch.interval = 3600  # the thread never gets to measure: only the last check can
    stopped = []
    guard.watch.on_exceed = lambda: stopped.append(True)
    submitted = Trajectory(outcome="completed", finish_reason="finish", metrics={"turns": 2})
    with guard.watching():
        (tmp_path / "big").write_bytes(b"x" * 3 * 2**20)
    assert stopped == [True]
    ended = guard.over_quota(submitted)
    assert (ended.outcome, ended.finish_reason) == ("agent_error", "disk_quota")
    assert ended.metrics == {"turns": 2, "disk_quota": "workspace holds 3 MB, quota 2 MB"}
    assert submitted.outcome == "completed"  # the loop's own record is not edited
    # Within the quota, or already ended by a reason of the agent's making: left as it is.
    within = RunGuard({"workspace": str(tmp_path / "empty")}, SandboxOptions(limits={"disk_mb": 2}))
    (tmp_path / "empty").mkdir()
    with within.watching():
        pass
    assert within.over_quota(submitted) is submitted
    oom = Trajectory(outcome="agent_error", finish_reason="oom")
    assert guard.over_quota(oom) is oom


def test_an_infrastructure_kill_is_never_the_agents_failure(tmp_path: Path) -> None:
    """A signal from outside the sandbox's pid namespace (recorded by the server), the worker's
    own shutdown, or a server the agent's isolated tools cannot name: SandboxGone is retried."""
    import threading

    records = tmp_path / "x.signals"
    shutting_down = threading.Event()  # the worker's (`ProcessParts.shutting_down`)
    guard = RunGuard({"workspace": str(tmp_path), "signal_file": str(records)}, SandboxOptions(), shutting_down)
    assert guard.diagnose(SandboxGone("closed")) == "tool_server_died"  # not isolated
    records.write_text('{"signal": 15, "name": "SIGTERM", "sender_pid": 7, "outside": false}\n')
    assert guard.diagnose(SandboxGone("closed")) == "tool_server_died"  # the agent's SIGTERM
    records.write_text(records.read_text() + '{"signal": 15, "name": "SIGTERM", "sender_pid": 0, "outside": true}\n')
    assert guard.diagnose(SandboxGone("closed")) is None  # Slurm's scancel, say
    records.unlink()
    shutting_down.set()
    assert guard.diagnose(SandboxGone("closed")) is None
    isolated = RunGuard({"workspace": str(tmp_path), "isolated": True}, SandboxOptions())
    assert isolated.diagnose(SandboxGone("closed")) is None


def test_a_stopped_or_starved_server_is_the_agents_doing(tmp_path: Path) -> None:
    import signal
    import subprocess

    from sandbox.toolserver.procs import start_time

    proc = subprocess.Popen(["sleep", "60"])
    try:
        handle = {
            "workspace": str(tmp_path),
            "server_pid": proc.pid,
            "server_start": start_time(proc.pid),
            "isolated": True,
        }
        guard = RunGuard(handle, SandboxOptions())
        assert guard.diagnose(SandboxTimeout("slow")) is None  # running: maybe a slow node
        proc.send_signal(signal.SIGSTOP)
        deadline = __import__("time").monotonic() + 5
        while run_guard_state(handle) != "T" and __import__("time").monotonic() < deadline:
            pass
        assert guard.diagnose(SandboxTimeout("slow")) == "tool_server_unresponsive"
    finally:
        proc.kill()
        proc.wait()
    cgroup = tmp_path / "raas-y"
    cgroup.mkdir()
    (cgroup / "pids.events").write_text("max 12\n")
    starved = RunGuard({"workspace": str(tmp_path), "cgroups": [str(cgroup)]}, SandboxOptions())
    assert starved.diagnose(SandboxTimeout("slow")) == "tool_server_unresponsive"
    (cgroup / "pids.events").write_text("max 0\n")
    assert starved.diagnose(SandboxTimeout("slow")) is None


def run_guard_state(handle: dict) -> str | None:
    from tasks.sandboxing.run_guard import server_state

    return server_state(handle)[0]
