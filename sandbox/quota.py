"""A per-workspace disk quota without root: a watchdog that measures and stops the sandbox.

Rootless bwrap cannot give a host directory a size limit, and a size-limited tmpfs workspace
would vanish with the sandbox before its artifact is read. So a host thread measures the
workspace (allocated blocks, never following links) every `interval` seconds and, once it holds
more than the quota or more than `max_entries` files, calls `on_exceed` (the pipeline stops the
sandbox) and records why. Single files are also capped by RLIMIT_FSIZE (`file_size_mb`).
"""

from __future__ import annotations

import logging
import threading

from sandbox.workspace import disk_usage

log = logging.getLogger(__name__)


class DiskWatch:
    """Watches one workspace; `exceeded` says why it fired (None while within the quota)."""

    def __init__(
        self, workspace: str, limit_bytes: int, on_exceed, interval: float = 0.5, max_entries: int = 1_000_000
    ) -> None:
        self.workspace, self.limit, self.on_exceed = workspace, limit_bytes, on_exceed
        self.interval, self.max_entries = interval, max_entries
        self.exceeded: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="raas-disk-watch")

    def __enter__(self) -> DiskWatch:
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if exc_type is None and self.exceeded is None:
            # Once more as the agent stops: a workspace filled within the last interval and
            # then submitted is over its quota all the same (else a policy learns to fill
            # its disk just before it submits).
            try:
                self.check()
            except Exception:  # a failed measurement must not kill the stage
                log.exception("disk watch of %s failed", self.workspace)

    def check(self) -> str | None:
        """Measure once; fire and return the reason when over the quota."""
        used, entries = disk_usage(self.workspace, self.max_entries)
        if used > self.limit:
            reason = f"workspace holds {used // 2**20} MB, quota {self.limit // 2**20} MB"
        elif entries > self.max_entries:
            reason = f"workspace holds more than {self.max_entries} files"
        else:
            return None
        self.exceeded = reason
        log.warning("disk quota of %s: %s; stopping the sandbox", self.workspace, reason)
        self.on_exceed()
        return reason

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if self.check():
                    return
            except Exception:  # a failed measurement must not kill the stage
                log.exception("disk watch of %s failed", self.workspace)
