"""Review 1 item 4: the tool server's signal record counts only kernel-made senders as outside.

Each case runs the real recorder (`sandbox.toolserver.signals`) in a child process and sends
it a real SIGTERM; the record file is what `tasks.sandboxing.run_guard` reads. A forged `rt_sigqueueinfo`
(SI_QUEUE with `si_pid` 0, which any same-uid process may send) must not read as "outside",
while a plain kill(2) from outside the server's pid namespace still does.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO = str(Path(__file__).resolve().parents[2])
RECORDER = """
import os, sys, time
sys.path.insert(0, {repo!r})
from sandbox.toolserver.signals import block, start_recorder
block()
start_recorder(os.open({path!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
print('ready', flush=True)
time.sleep(30)
"""


def _recorder(tmp_path, own_pid_namespace: bool) -> tuple[subprocess.Popen, int, Path]:
    """(process to wait for, pid to signal, record file) of a running recorder."""
    path = tmp_path / "signals"
    argv = [sys.executable, "-c", RECORDER.format(repo=REPO, path=str(path))]
    if own_pid_namespace:
        argv = ["unshare", "--pid", "--fork", "--kill-child", *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    pid = proc.pid
    if own_pid_namespace:  # the python under unshare's fork
        pid = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
    return proc, pid, path


def _record(proc: subprocess.Popen, path: Path) -> dict:
    assert proc.wait(10) == 128 + signal.SIGTERM
    (line,) = path.read_text().splitlines()
    return json.loads(line)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="rt_sigqueueinfo number is x86_64's")
def test_a_forged_sigqueueinfo_with_pid_0_is_not_outside(tmp_path):
    proc, pid, path = _recorder(tmp_path, own_pid_namespace=False)
    info = bytearray(128)
    struct.pack_into("iii", info, 0, signal.SIGTERM, 0, -1)  # si_code SI_QUEUE
    struct.pack_into("iI", info, 16, 0, 0)  # si_pid 0, si_uid 0: "from outside"
    libc = ctypes.CDLL(None, use_errno=True)
    sent = libc.syscall(129, pid, signal.SIGTERM, (ctypes.c_char * 128).from_buffer(info))
    assert sent == 0, os.strerror(ctypes.get_errno())
    record = _record(proc, path)
    assert record["sender_pid"] == 0  # the forgery arrived as sent
    assert record["outside"] is False
    assert record["sender_code"] == -1  # SI_QUEUE, recorded for the host's diagnosis


def test_kill_from_inside_names_the_sender_and_is_not_outside(tmp_path):
    proc, pid, path = _recorder(tmp_path, own_pid_namespace=False)
    os.kill(pid, signal.SIGTERM)
    record = _record(proc, path)
    assert record["sender_pid"] == os.getpid() and record["outside"] is False


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_kill_from_outside_the_pid_namespace_is_outside(tmp_path):
    try:
        proc, pid, path = _recorder(tmp_path, own_pid_namespace=True)
    except AssertionError:
        pytest.skip("no pid namespace here")
    os.kill(pid, signal.SIGTERM)
    proc.wait(10)  # unshare passes on its child's status
    (line,) = path.read_text().splitlines()
    record = json.loads(line)
    assert record["sender_pid"] == 0 and record["outside"] is True
    assert record["sender_code"] == 0  # SI_USER: kill(2)
