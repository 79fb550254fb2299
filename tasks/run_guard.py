"""RUN's guard over the agent's sandbox: the workspace quota and whose fault a failure is.

The agent holds a root shell in its sandbox for the whole RUN, so what breaks in there is its
doing: a workspace over `limits.disk_mb` (a watchdog stops the sandbox), an OOM kill in the
sandbox's memory cgroup, or a tool server that vanished (only the agent's processes share the
sandbox). Those end the rollout as `agent_error` with reward 0 and a finish reason that says
which, never `infra_error` (which the trainer filters out, so a policy could learn to hide a
bad episode behind it). A tool call that only timed out stays infrastructure: an overloaded
node looks the same.
"""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

from agents.finish_reasons import FinishReason
from sandbox import SandboxGone, SandboxOptions
from sandbox.cgroups import oom_kills
from sandbox.quota import DiskWatch
from tasks import sandboxes


class RunGuard:
    """One RUN's quota watchdog and failure diagnosis for the sandbox behind `handle`."""

    def __init__(self, handle: dict[str, Any] | None, job_sandbox: dict[str, Any]) -> None:
        self.handle = handle or {}
        self.watch: DiskWatch | None = None
        if self.handle.get("workspace"):
            limits = SandboxOptions.model_validate(
                {"limits": (job_sandbox or {}).get("limits") or {}}).limits
            self.watch = DiskWatch(self.handle["workspace"], limits.disk_mb * 2**20,
                                   lambda: sandboxes.stop(self.handle))

    def watching(self) -> AbstractContextManager:
        """The quota watchdog while the agent runs (nothing to watch without a sandbox)."""
        return self.watch if self.watch is not None else nullcontext()

    def diagnose(self, exc: BaseException) -> str | None:
        """The finish reason when the agent broke its sandbox, else None (infrastructure)."""
        if self.watch is not None and self.watch.exceeded:
            return FinishReason.DISK_QUOTA.value
        if not isinstance(exc, SandboxGone):
            return None
        if oom_kills(self.handle.get("cgroups") or []):
            return FinishReason.OOM.value
        return FinishReason.TOOL_SERVER_DIED.value
