"""The infrastructure's SIGTERM of a rollout's sandbox mid-RUN, as Slurm's scancel sends it:
the helpers of `test_reward_attacks.py`'s "an infrastructure kill is never the agent's
failure" cases (issue 27)."""

from __future__ import annotations

from typing import Any


def sigterm_in_background(service, llm, instance: dict[str, Any]) -> dict[str, Any]:
    """Submit the `infra-sigterm` rollout; a thread SIGTERMs its sandbox once the agent's
    `sleep 6` runs ({"job", "thread", "pids"}: pids filled in by the thread)."""
    import threading

    job = service.client.submit("code", [instance], limits={"max_turns": 4}, llm=llm)
    out: dict[str, Any] = {"job": job, "pids": []}

    def kill() -> None:
        out["pids"] = sigterm_sandbox_mid_run(service, job.rollout_ids[0])

    out["thread"] = threading.Thread(target=kill, daemon=True)
    out["thread"].start()
    return out


def sigterm_sandbox_mid_run(service, rollout_id: str) -> list[int]:
    """SIGTERM every process of the rollout's sandbox from outside, as Slurm's scancel does
    (it signals every process of the job), once the agent's first command is running."""
    import os
    import signal
    import time

    from core.db import session_scope
    from core.models import Rollout
    from sandbox.toolserver.procs import descendants

    deadline = time.monotonic() + 180
    handle: dict = {}
    while not _agent_sleeping(handle):  # the agent's `sleep 6` runs in the sandbox
        assert time.monotonic() < deadline, service.log_tail()
        time.sleep(0.05)
        with session_scope(service.settings.db_url) as s:
            row = s.get(Rollout, rollout_id)
            handle = dict(row.sandbox or {}) if row.status == "run" else {}
    pids = [handle["pid"], *descendants(handle["pid"])]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    return pids


def _agent_sleeping(handle: dict) -> bool:
    from sandbox.toolserver.procs import descendants

    if not handle.get("pid"):
        return False
    for pid in descendants(handle["pid"]):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if cmdline.read() == b"sleep\x006\x00":
                    return True
        except OSError:
            continue
    return False
