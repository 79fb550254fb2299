"""A persistent grading process: the grader is imported once, each call has a timeout, a crash
or a timeout kills the process and the next call starts a fresh one.

Why a process: math-verify bounds its work with SIGALRM, which only works in a process's main
thread, and a pathological answer must never wedge a worker thread. Why persistent: starting
Python and importing sympy + math-verify costs seconds per grading, the grading itself tens of
milliseconds. The protocol is one JSON line per request and per answer on stdin/stdout.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import queue
import select
import subprocess
import sys
import threading
import time
from importlib.resources import files
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Where this process imports `agents` from (site-packages, or a checkout run in place): first on
# the child's path, so the child runs the same code.
IMPORT_ROOT = str(Path(str(files("agents"))).parent)
START_TIMEOUT = 120.0  # importing sympy on a loaded 2-core node


class WorkerFailed(RuntimeError):
    """The grading process timed out or died; it has been killed and will be restarted."""


class WarmWorker:
    """One child process that calls `target` ("module:function") on each request."""

    def __init__(self, target: str, warmup: tuple[str, ...] = ()) -> None:
        self.target = target
        self.warmup = warmup
        self.proc: subprocess.Popen | None = None
        self.restarts = -1  # the first start is not a restart

    def _start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [IMPORT_ROOT, env.get("PYTHONPATH")]))
        code = f"from agents.warm_worker import serve; serve({self.target!r}, {self.warmup!r})"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, env=env
        )
        self.restarts += 1
        if self.restarts:
            log.warning("grading process for %s restarted (%s restarts)", self.target, self.restarts)
        self._read_line(START_TIMEOUT)  # the child says "ready" once its imports are done

    def _read_line(self, timeout: float) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else None
        if not line:
            what = "timed out" if not ready else f"died (rc={self.proc.poll()})"
            self.kill()
            raise WorkerFailed(f"grading process {what}")
        return line

    def call(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One request; WorkerFailed after `timeout` seconds or if the process dies."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except OSError as exc:
            self.kill()
            raise WorkerFailed(f"grading process gone: {exc}") from None
        answer = json.loads(self._read_line(timeout))
        if "error" in answer:
            raise WorkerFailed(answer["error"])
        return answer["result"]

    def kill(self) -> None:
        """Stop the process now (it is restarted by the next call)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


class WarmPool:
    """A few warm workers shared by the threads of one worker process."""

    def __init__(self, target: str, size: int = 2, warmup: tuple[str, ...] = ()) -> None:
        # LIFO: the most recently used (warm) worker first; others start only under contention
        self.idle: queue.LifoQueue[WarmWorker] = queue.LifoQueue()
        for _ in range(size):
            self.idle.put(WarmWorker(target, warmup))

    def call(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Run one request on an idle worker (waiting for one if all are busy)."""
        worker = self.idle.get()
        try:
            return worker.call(request, timeout)
        finally:
            self.idle.put(worker)


def serve(target: str, warmup: tuple[str, ...] = ()) -> None:
    """Child-process loop: import `target` once, then answer JSON lines until stdin closes."""
    module, _, name = target.partition(":")
    function = getattr(importlib.import_module(module), name)
    for extra in warmup:
        importlib.import_module(extra)
    out = sys.stdout
    sys.stdout = sys.stderr  # a grader's stray print must not corrupt the protocol
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        started = time.monotonic()
        try:
            request = json.loads(line)
            answer = {"result": function(*request.get("args", []), **request.get("kwargs", {}))}
        except Exception as exc:  # noqa: BLE001 - reported to the caller, the loop goes on
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        answer["seconds"] = round(time.monotonic() - started, 6)
        out.write(json.dumps(answer) + "\n")
        out.flush()


_pools: dict[str, WarmPool] = {}
_pools_lock = threading.Lock()


def warm_pool(target: str, size: int = 2, warmup: tuple[str, ...] = ()) -> WarmPool:
    """The process-wide pool for `target` (created on first use)."""
    with _pools_lock:
        if target not in _pools:
            _pools[target] = WarmPool(target, size, warmup)
        return _pools[target]
