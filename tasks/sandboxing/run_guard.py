"""RUN's guard over the agent's sandbox: the workspace quota and whose fault a failure is.

The agent holds a shell in its sandbox for the whole RUN, so what it breaks in there is its
doing: a workspace over `limits.disk_mb` (a watchdog stops the sandbox), an OOM kill in the
sandbox's memory cgroup, a tool server it killed, stopped, traced or starved of processes.
Those end the rollout as `agent_error` with reward 0 and a finish reason that says which,
never `infra_error` (which the trainer filters out, so a policy could learn to hide a bad
episode behind it, or earn a re-roll).

The other direction matters as much: an infrastructure kill is never the agent's failure.
A sandbox that dies while this worker is shutting down, or from a signal sent from outside
its pid namespace (Slurm's `scancel` signals every process of the job, sandboxes included;
the tool server records each signal and whether its sender was outside, see
`sandbox/toolserver/signals.py`), is infrastructure: `SandboxGone` goes on to the retry
(resumed where the sandbox lives, else from INIT). With the tools isolated in a pid namespace
below the server's (`sandbox/toolserver/isolate.py`, bwrap's default) nothing the agent runs
can signal the server at all, so its death without an OOM or a refused fork is not the agent's.
"""

from __future__ import annotations

import logging
import threading
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from raas_client.models import Trajectory

from agents.finish_reasons import SELF_INFLICTED, FinishReason
from core.models import Outcome
from sandbox import SandboxError, SandboxGone, SandboxOptions, SandboxTimeout
from sandbox.cgroups import oom_kills, pids_limit_hits
from sandbox.quota import DiskWatch
from sandbox.toolserver.signals import read_records
from tasks.sandboxing import sandboxes

log = logging.getLogger(__name__)


def server_state(handle: dict[str, Any]) -> tuple[str | None, int]:
    """The tool server's scheduler state letter and its tracer's pid (None when gone)."""
    pid = handle.get("server_pid")
    if not pid:
        return None, 0
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
    except OSError:
        return None, 0
    from sandbox.toolserver.procs import start_time

    if start_time(pid) != handle.get("server_start"):
        return None, 0  # the pid was reused: the server is gone
    return fields.get("State", "").strip()[:1] or None, int(fields.get("TracerPid", "0") or 0)


class RunGuard:
    """One RUN's quota watchdog and failure diagnosis for the sandbox behind `handle`.

    `shutting_down` is set once the worker process starts shutting down (its parts'
    `ProcessParts.shutting_down`, set on Celery's `worker_shutting_down`, which a SIGTERM to
    the pool triggers): sandboxes that die from then on die with the node."""

    def __init__(
        self,
        handle: dict[str, Any] | None,
        job_sandbox: SandboxOptions,
        shutting_down: threading.Event | None = None,
    ) -> None:
        self.handle = handle or {}
        self.shutting_down = shutting_down if shutting_down is not None else threading.Event()
        self.watch: DiskWatch | None = None
        if self.handle.get("workspace"):
            limits = job_sandbox.limits  # the job's, defaults filled in
            self.watch = DiskWatch(
                self.handle["workspace"], limits.disk_mb * 2**20, lambda: sandboxes.stop(self.handle)
            )

    def watching(self) -> AbstractContextManager:
        """The quota watchdog while the agent runs (nothing to watch without a sandbox)."""
        return self.watch if self.watch is not None else nullcontext()

    def over_quota(self, result: Trajectory) -> Trajectory:
        """`result` as the agent's failure (agent_error, `disk_quota`) when the workspace was
        over its quota by the end of the RUN (`DiskWatch` measures once more as the agent
        stops), unless the episode already ended for a reason of its own making."""
        if (
            self.watch is None
            or not self.watch.exceeded
            or result.finish_reason in SELF_INFLICTED
            or result.outcome == Outcome.TIMEOUT.value
        ):
            return result
        return result.model_copy(
            update={
                "outcome": Outcome.AGENT_ERROR.value,
                "finish_reason": FinishReason.DISK_QUOTA.value,
                "metrics": {**result.metrics, "disk_quota": self.watch.exceeded},
            }
        )

    def diagnose(self, exc: BaseException) -> str | None:
        """The finish reason when the agent broke its sandbox, else None (infrastructure)."""
        if self.watch is not None and self.watch.exceeded:
            return FinishReason.DISK_QUOTA.value
        if not isinstance(exc, SandboxError):
            return None
        infra = self.infrastructure_cause()
        if infra:
            log.warning("sandbox %s failed by infrastructure (%s): not the agent's doing", self.handle.get("id"), infra)
            return None
        groups = self.handle.get("cgroups") or []
        if isinstance(exc, SandboxTimeout):
            state, tracer = server_state(self.handle)
            if state in ("T", "t") or tracer:
                return FinishReason.TOOL_SERVER_UNRESPONSIVE.value  # stopped or traced
            if pids_limit_hits(groups):
                return FinishReason.TOOL_SERVER_UNRESPONSIVE.value  # starved of processes
            return None  # a slow or overloaded node looks the same: infrastructure
        if not isinstance(exc, SandboxGone):
            return None
        if oom_kills(groups):
            return FinishReason.OOM.value
        if pids_limit_hits(groups):
            return FinishReason.TOOL_SERVER_UNRESPONSIVE.value
        if self.handle.get("isolated"):
            return None  # nothing the agent runs can name the server: not its doing
        return FinishReason.TOOL_SERVER_DIED.value

    def infrastructure_cause(self) -> str | None:
        """Why a failure of this sandbox is the infrastructure's, or None: the worker is
        shutting down, or the server recorded a signal sent from outside its namespace."""
        if self.shutting_down.is_set():
            return "the worker is shutting down"
        for record in read_records(self.handle.get("signal_file")):
            if record.get("outside"):
                return f"{record.get('name')} from outside the sandbox"
        return None
