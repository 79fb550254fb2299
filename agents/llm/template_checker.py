"""Inline chat templates are checked in a process of their own: nothing forks a threaded process.

`template_budget.check_template` renders the sample conversation in a forked child with CPU,
memory and wall limits. A fork copies every lock as it stood: a gateway thread that held one at
that instant (the render watchdog's, a connection pool's, a buffered stream's) leaves it held
for ever in the child, which then hangs until the wall deadline, and a sound template is
refused as "wall time" (a 400 the trainer cannot fix; CI saw it once, and holding the watchdog's
lock in another thread reproduces it every time). So the gateway forks nothing itself: it asks a
checker process, started once per process with `subprocess` (fork and exec, safe anywhere),
which runs one thread, loads each tokenizer once and forks the bounded child from there.

The protocol is one JSON line each way on the checker's stdin and stdout:
{"tokenizer", "template"} in; {"verdict", "message", "threads"} out, the verdict one of
`VERDICTS` and `threads` the checker's own thread count when it forked (1; tests hold it to that).
A check takes ~25 ms warm; a template that spends its whole budget holds its checker for up
to the child's wall deadline. So a process keeps a small pool (`CheckerPool`, up to
`MAX_CHECKERS` checker processes, started as they are needed): one owner's checks run one after
another (an owner holds at most one checker), different owners' at once. A tenant submitting
bomb templates in parallel queues behind itself, not in front of the other tenants.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from agents.llm.template_budget import FIELD, TemplateOverBudget
from agents.llm.tokenizer import check_template_here
from core.errors import InvalidRequest, ServiceUnavailable

VERDICTS = ("ok", "invalid", "over_budget", "tokenizer")
# a first check loads the tokenizer (a second or two); the child's own wall deadline is 10 s
REPLY_SECONDS = 120.0
REPO = Path(__file__).resolve().parents[2]  # the checker runs this tree's code
# numpy (transformers imports it) would start OpenBLAS's pool: the checker forks, so one thread
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
# checker processes per gateway process (~170 MB each once a tokenizer is loaded): owners whose
# checks run at once; more wait for a checker to come free
MAX_CHECKERS = 3


class TemplateChecker:
    """This process's client of its checker process (started on first use, again after a
    fork or if it died)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._owner = 0  # the pid that started `_proc` (a forked copy starts its own)

    def check(self, tokenizer: str, template: str) -> dict[str, Any]:
        """The checker's reply for `template` over the tokenizer folder `tokenizer`; raises
        the verdict's error (InvalidRequest, TemplateOverBudget) unless it is "ok"."""
        with self._lock:
            reply = self._ask({"tokenizer": tokenizer, "template": template})
        verdict, message = reply.get("verdict"), str(reply.get("message", ""))
        if verdict == "ok":
            return reply
        if verdict == "over_budget":
            raise TemplateOverBudget(message, field=FIELD)
        if verdict == "tokenizer":
            raise InvalidRequest(message, field="llm.tokenizer")
        if verdict == "invalid":
            raise InvalidRequest(message, field=FIELD)
        raise ServiceUnavailable(f"{FIELD}: the template checker answered {reply!r}")

    def close(self) -> None:
        """Stop the checker (it also exits by itself when this process's end of its pipe closes)."""
        with self._lock:
            self._stop()

    def _ask(self, request: dict[str, str]) -> dict[str, Any]:
        line = (json.dumps(request) + "\n").encode()
        for _ in range(2):  # a checker that died is started once more
            proc = self._running()
            try:
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(line)
                proc.stdin.flush()
                reply = _read_line(proc.stdout, REPLY_SECONDS)
                if reply:
                    return json.loads(reply)
            except (OSError, ValueError):
                pass
            self._stop()
        raise ServiceUnavailable(f"{FIELD}: the template checker process failed; the template was not checked")

    def _running(self) -> subprocess.Popen:
        if self._proc is not None and self._owner == os.getpid() and self._proc.poll() is None:
            return self._proc
        if self._owner != os.getpid():
            self._proc = None  # a forked copy's: its pipes are the parent's
        self._stop()
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), path) if p), **ONE_THREAD}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "agents.llm.template_checker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,  # Ctrl-C of `raas up` does not cut a check short: EOF stops it
        )
        self._owner = os.getpid()
        return self._proc

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def _read_line(stream: IO[bytes], timeout: float) -> bytes:
    """One line from `stream` (b"" at EOF or after `timeout` seconds)."""
    fd = stream.fileno()
    data = b""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while not data.endswith(b"\n"):
            if not selector.select(timeout):
                return b""
            chunk = os.read(fd, 65536)
            if not chunk:
                return b""
            data += chunk
    return data


class CheckerPool:
    """This process's checkers: each owner's checks in turn, up to `size` owners' at once.

    An owner first takes its own turn (a lock per owner, dropped when no check of it waits),
    then a free checker (an idle one, else a new one while fewer than `size` were started,
    else the next one given back)."""

    def __init__(self, size: int = MAX_CHECKERS) -> None:
        self.size = size
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a forked copy's locks and pipes are not its own

    def _reset(self) -> None:
        self._free = threading.Condition()
        self._idle: list[TemplateChecker] = []
        self._all: list[TemplateChecker] = []
        self._turns: dict[str, tuple[threading.Lock, list[int]]] = {}  # owner -> (its lock, [waiting])

    def check(self, tokenizer: str, template: str, owner: str = "") -> dict[str, Any]:
        """`TemplateChecker.check` on a free checker, in `owner`'s turn."""
        with self._turn(owner):
            checker = self._take()
            try:
                return checker.check(tokenizer, template)
            finally:
                with self._free:
                    self._idle.append(checker)
                    self._free.notify()

    def pids(self) -> list[int]:
        """The checker processes running now (tests)."""
        return [c._proc.pid for c in self._all if c._proc is not None and c._owner == os.getpid()]

    def close(self) -> None:
        """Stop every checker (each also exits by itself when this process exits)."""
        with self._free:
            for checker in self._all:
                checker.close()

    @contextmanager
    def _turn(self, owner: str) -> Iterator[None]:
        with self._free:
            lock, waiting = self._turns.setdefault(owner, (threading.Lock(), [0]))
            waiting[0] += 1
        try:
            with lock:
                yield
        finally:
            with self._free:
                waiting[0] -= 1
                if not waiting[0]:
                    del self._turns[owner]

    def _take(self) -> TemplateChecker:
        with self._free:
            while not self._idle and len(self._all) >= self.size:
                self._free.wait()
            if self._idle:
                return self._idle.pop()
            checker = TemplateChecker()
            self._all.append(checker)
            return checker


_checker = CheckerPool()


def check_untrusted_template(tokenizer: str, template: str, owner: str = "") -> dict[str, Any]:
    """Render a sample conversation through an untrusted inline template in a bounded child
    of one of this process's checkers, in `owner`'s turn; InvalidRequest naming
    llm.chat_template_text (or llm.tokenizer) unless it passes (the reply, for tests)."""
    return _checker.check(tokenizer, template, owner)


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """The checker's reply to one request (this runs in the checker process)."""
    try:
        check_template_here(str(request["tokenizer"]), str(request["template"]))
        verdict, message = "ok", ""
    except TemplateOverBudget as exc:
        verdict, message = "over_budget", exc.message
    except InvalidRequest as exc:
        verdict = "tokenizer" if exc.details.get("field") == "llm.tokenizer" else "invalid"
        message = exc.message
    # what ran when it forked: loading the tokenizer came first and starts no thread
    return {"verdict": verdict, "message": message, "threads": len(os.listdir("/proc/self/task"))}


def main() -> None:
    """Answer one request per line until stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out = os.fdopen(os.dup(1), "wb")  # the replies' own descriptor:
    os.dup2(2, 1)  # whatever a library prints goes to stderr, not into the protocol
    for line in sys.stdin.buffer:
        try:
            reply = answer(json.loads(line))
        except (ValueError, KeyError, TypeError) as exc:
            reply = {"verdict": "error", "message": f"a bad request line: {exc}"}
        out.write((json.dumps(reply) + "\n").encode())
        out.flush()


if __name__ == "__main__":
    main()
