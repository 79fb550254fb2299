"""The persistent Python session: a worker process per sandbox, interrupted or restarted on timeout."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import threading
import time

from .procs import child_setup, kill_session, set_oom_score
from .protocol import PythonResult

_BOOT = "import sys; sys.path.insert(0, {root!r}); from toolserver.pyworker import main; del sys.path[0]; main()"
_START_WAIT = 60.0
_INTERRUPT_WAIT = 2.0


class PythonSession:
    """Cells share one namespace until a timeout forces a restart."""

    def __init__(
        self,
        python: str,
        env: dict[str, str],
        cwd: str,
        output_bytes: int,
        address_space: int = 0,
        wrap: list[str] | None = None,
    ) -> None:
        self.python, self.env, self.cwd, self.output_bytes = python, env, cwd, output_bytes
        self.wrap = wrap or []  # e.g. the pid-namespace helper (isolate.py)
        self.address_space = address_space
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.buffer = b""

    def _spawn(self) -> None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        argv = [*self.wrap, self.python, "-c", _BOOT.format(root=root), str(self.output_bytes)]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
            preexec_fn=child_setup(self.address_space),
        )
        set_oom_score(self.proc.pid, 500)
        if self._read_line(time.monotonic() + _START_WAIT) is None:
            self.kill()
            raise RuntimeError(f"python worker ({self.python}) did not start")

    def kill(self) -> None:
        """Kill the worker and anything it started."""
        if self.proc is not None:
            kill_session(self.proc.pid)
            self.proc.wait()
        self.proc, self.buffer = None, b""

    def _read_line(self, deadline: float) -> dict | None:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                if time.monotonic() >= deadline:
                    return None
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def run(self, code: str, timeout: float) -> PythonResult:
        """Run a cell; interrupt it at the timeout, restart the worker if that fails."""
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self.kill()
                self._spawn()
            try:
                self.proc.stdin.write(json.dumps({"code": code}).encode() + b"\n")
                self.proc.stdin.flush()
            except BrokenPipeError:  # died between calls (e.g. OOM-killed): start afresh
                self.kill()
                self._spawn()
                self.proc.stdin.write(json.dumps({"code": code}).encode() + b"\n")
                self.proc.stdin.flush()
            reply = self._read_line(time.monotonic() + timeout)
            if reply is not None:
                return PythonResult(reply["output"], reply["error"])
            if self.proc.poll() is not None:
                self.kill()
                return PythonResult("", "the Python worker died (state is lost)")
            os.kill(self.proc.pid, signal.SIGINT)
            reply = self._read_line(time.monotonic() + _INTERRUPT_WAIT)
            note = f"TimeoutError: cell exceeded {timeout:g}s"
            if reply is not None:
                error = (reply["error"] or "") + f"\n{note}; interrupted, session kept"
                return PythonResult(reply["output"], error, timed_out=True)
            self.kill()
            return PythonResult("", f"{note}; worker restarted, state is lost", timed_out=True)
