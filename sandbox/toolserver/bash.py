"""A persistent bash behind a pty: one round trip per command, exit code via an end marker."""

from __future__ import annotations

import os
import re
import secrets
import select
import signal
import tempfile
import threading
import time

from ptyprocess import PtyProcess

from .output import CappedBuffer
from .procs import child_setup, descendants, kill_session, set_oom_score
from .protocol import BashResult

_SETUP = (
    "stty -echo -onlcr; PS1=''; PS2=''; PS4='+ '; unset PROMPT_COMMAND; set +H; "
    "HISTFILE=/dev/null; printf '__RAAS_%s_%s__\\n' {nonce} READY\n"
)
_SYNC_WAIT = 2.0


class BashSession:
    """One long-lived shell; commands are sourced from a file so heredocs and long input work."""

    def __init__(
        self, env: dict[str, str], cwd: str, output_bytes: int, address_space: int = 0, wrap: list[str] | None = None
    ) -> None:
        self.env, self.cwd, self.output_bytes = env, cwd, output_bytes
        self.wrap = wrap or []  # e.g. the pid-namespace helper (isolate.py)
        self.shell_pid: int | None = None
        self.address_space = address_space
        self.lock = threading.Lock()
        self.scratch = tempfile.mkdtemp(prefix="raas-bash-")
        self.proc: PtyProcess | None = None
        self.seq = 0
        self.pending = b""
        self.eof = False

    # -- lifecycle -----------------------------------------------------------------------
    def _spawn(self) -> None:
        self.nonce = secrets.token_hex(6)
        argv = [*self.wrap, "/bin/bash", "--noprofile", "--norc", "--noediting"]
        self.proc = PtyProcess.spawn(
            argv, env=self.env, cwd=self.cwd, dimensions=(50, 400), preexec_fn=child_setup(self.address_space)
        )
        set_oom_score(self.proc.pid, 500)
        os.write(self.proc.fd, _SETUP.format(nonce=self.nonce).encode())
        marker = re.compile(rb"__RAAS_%s_READY__\n" % self.nonce.encode())
        found, _ = self._read_until(marker, time.monotonic() + 10, CappedBuffer(4096))
        if not found:
            self.kill()
            raise RuntimeError("bash did not start")
        # the shell itself: the spawned process, or the helper's child when wrapped
        children = descendants(self.proc.pid) if self.wrap else []
        self.shell_pid = children[0] if children else self.proc.pid

    def kill(self) -> None:
        """Kill the shell and everything it started."""
        if self.proc is not None:
            kill_session(self.proc.pid)
            try:
                self.proc.close(force=True)
            except Exception:  # noqa: BLE001 - the pty may already be gone
                pass
        self.proc, self.pending = None, b""

    def _alive(self) -> bool:
        return self.proc is not None and self.proc.isalive()

    # -- commands ------------------------------------------------------------------------
    def run(self, command: str, timeout: float) -> BashResult:
        """Run `command`; on timeout interrupt it and keep the shell (restart if it is stuck)."""
        with self.lock:
            if not self._alive():
                self.kill()
                self._spawn()
            self.seq += 1
            path = os.path.join(self.scratch, "cmd")
            try:
                os.makedirs(self.scratch, exist_ok=True)  # the agent may have wiped /tmp
                with open(path, "w") as handle:
                    handle.write(command if command.endswith("\n") else command + "\n")
            except OSError as exc:  # the agent filled /tmp: its problem, told as an observation
                return BashResult(
                    f"[cannot start the command: {exc.strerror} writing {path}; free space in /tmp]", None
                )
            line = f" . {path}; printf '\\n__RAAS_%s_%s_%d__\\n' {self.nonce} {self.seq} \"$?\"\n"
            out = CappedBuffer(self.output_bytes)
            out.write(self.pending)
            self.pending = b""
            os.write(self.proc.fd, line.encode())
            marker = re.compile(rb"\n__RAAS_%s_%d_(-?\d+)__\n" % (self.nonce.encode(), self.seq))
            found, code = self._read_until(marker, time.monotonic() + timeout, out)
            if found:
                return BashResult(self._clean(out.text()), code, False, out.elided)
            if self.eof:  # `exit` or a crash: report and respawn next time
                status = self._exit_status()
                self.kill()
                text = self._clean(out.text()) + "\n[shell exited; a new one starts on the next call]"
                return BashResult(text, status, False, out.elided)
            note = self._interrupt(out)
            text = self._clean(out.text()).rstrip("\n")
            return BashResult(text + f"\n[command timed out after {timeout:g}s; {note}]", None, True, out.elided)

    def _exit_status(self) -> int | None:
        try:
            self.proc.wait()
        except Exception:  # noqa: BLE001 - already reaped
            pass
        return self.proc.exitstatus

    def _clean(self, text: str) -> str:
        """Drop markers of interrupted commands that arrived late."""
        if "__RAAS_" not in text:
            return text
        return re.sub(r"\n?__RAAS_%s_\d+_-?\d+__\n?" % self.nonce, "", text)

    def _interrupt(self, out: CappedBuffer) -> str:
        """SIGINT the foreground job, then SIGKILL it, then restart the shell; say which worked."""
        for sig in (signal.SIGINT, signal.SIGKILL):
            self._signal_foreground(sig)
            if self._sync(out):
                return "interrupted" if sig == signal.SIGINT else "killed"
        self.kill()
        self._spawn()
        return "the shell was restarted: cwd, variables and background jobs are reset"

    def _signal_foreground(self, sig: int) -> None:
        try:
            pgrp = os.tcgetpgrp(self.proc.fd)
        except OSError:
            return
        try:
            if pgrp in (self.proc.pid, self.shell_pid):  # a builtin loop: the shell is busy
                os.kill(self.shell_pid or self.proc.pid, signal.SIGINT)
            else:
                os.killpg(pgrp, sig)
        except OSError:
            pass

    def _sync(self, out: CappedBuffer) -> bool:
        """Type a fresh marker and wait for it; True when the shell answers."""
        self.seq += 1
        os.write(self.proc.fd, f"printf '\\n__RAAS_%s_%s_0__\\n' {self.nonce} {self.seq}\n".encode())
        marker = re.compile(rb"\n__RAAS_%s_%d_0__\n" % (self.nonce.encode(), self.seq))
        found, _ = self._read_until(marker, time.monotonic() + _SYNC_WAIT, out)
        return found

    def _read_until(self, marker: re.Pattern, deadline: float, out: CappedBuffer):
        """Read pty output into `out` until `marker`; returns (found, exit code)."""
        window = b""
        keep = 64
        self.eof = False
        fd = self.proc.fd
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                out.write(window)
                return False, None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError:  # EIO: the shell is gone
                chunk = b""
            if not chunk:
                self.eof = True
                out.write(window)
                return False, None
            window += chunk
            match = marker.search(window)
            if match:
                out.write(window[: match.start()])
                self.pending = window[match.end() :]
                code = int(match.group(1)) if match.groups() else 0
                return True, code
            if len(window) > keep:
                out.write(window[:-keep])
                window = window[-keep:]
