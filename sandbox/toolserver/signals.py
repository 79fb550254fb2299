"""Who stopped the tool server: a record of every terminating signal and its sender.

The host must tell "the agent killed its server" (reward 0, `agent_error`) from "the
infrastructure did" (a Slurm `scancel` signals every process of the job, sandboxes included:
a retry, never the agent's failure). The kernel says which: a signal sent from outside the
receiver's pid namespace arrives with `si_pid == 0`, one sent from inside names the sender.
Only a kernel-made `si_code` counts (SI_USER from kill(2), SI_KERNEL): `rt_sigqueueinfo`
lets any process that can name the server send SI_QUEUE (or another negative code) with a
`si_pid` of its choosing, 0 included, which must not pass for "from outside".
So the server blocks the catchable terminating signals, takes them with `sigwaitinfo` in
one thread, appends one JSON line per signal to a descriptor the host opened for it (a file in
the host's 0700 state dir, never mounted in the sandbox, close-on-exec here and the server is
not dumpable, so no tool process can write to it), then exits (status 128 + the signal), as the
signal would have ended it.
SIGKILL and SIGSTOP cannot be caught; the host diagnoses those (`tasks.sandboxing.run_guard`).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

# Catchable signals whose default action ends the process.
RECORDED = (
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
)
SI_USER, SI_KERNEL = 0, 0x80  # si_code values only the kernel sets (kill(2); the kernel)


def block() -> None:
    """Block the recorded signals in the calling thread and every thread it starts later
    (call first in the main thread); children unblock them (`procs.child_setup`)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, RECORDED)


def start_recorder(record_fd: int, on_signal=None) -> threading.Thread:
    """Take the blocked signals in a thread; record each to `record_fd` (-1: nowhere), run
    `on_signal` (best effort), then exit as the signal would have."""
    if record_fd >= 0:
        os.set_inheritable(record_fd, False)

    def loop() -> None:
        while True:
            info = signal.sigwaitinfo(RECORDED)
            line = {
                "signal": info.si_signo,
                "name": signal.Signals(info.si_signo).name,
                "sender_pid": info.si_pid,
                "sender_uid": info.si_uid,
                "sender_code": info.si_code,
                "outside": info.si_pid == 0 and info.si_code in (SI_USER, SI_KERNEL),
                "at": time.time(),
            }
            if record_fd >= 0:
                try:
                    os.write(record_fd, (json.dumps(line) + "\n").encode())
                except OSError:
                    pass
            if on_signal is not None:
                try:
                    on_signal(line)
                except Exception:  # noqa: BLE001 - dying is what matters
                    pass
            os._exit(128 + info.si_signo)  # the namespace's processes go with it

    thread = threading.Thread(target=loop, name="signal-recorder", daemon=True)
    thread.start()
    return thread


def read_records(path: str | None) -> list[dict]:
    """The host's view: every signal the server recorded (none when the file is absent)."""
    if not path:
        return []
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except OSError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records
