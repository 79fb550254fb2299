"""The background processes of a demo (`scripts/demo.py`, `examples/train/demo.py`): announce a
step, run a command in the repository, start one in its own session, wait for its HTTP
endpoint, stop its whole process group. Plain standard library + httpx, so both the raas venv
and the training venv can import it (it sits beside the scripts, not in a package)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]


def step(text: str) -> None:
    """Announce a step of the demo."""
    print(f"\n==> {text}", flush=True)


def run(cmd: list[Any], **kwargs: Any) -> None:
    """Run a command in the repository, failing the demo if it fails."""
    print("$ " + " ".join(map(str, cmd)), flush=True)
    subprocess.run([str(c) for c in cmd], cwd=REPO, check=True, **kwargs)


def start(cmd: list[Any], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start a background process in its own session (so its children stop with it)."""
    print("$ " + " ".join(map(str, cmd)) + f"  > {log} &", flush=True)
    return subprocess.Popen(
        [str(c) for c in cmd],
        cwd=REPO,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen | None, name: str, grace: float = 30) -> None:
    """SIGTERM the process group we started, then SIGKILL it after `grace` seconds."""
    if proc is None or proc.poll() is not None:
        return
    print(f"stopping {name} (pid {proc.pid})", flush=True)
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_http(url: str, proc: subprocess.Popen | None, log: Path | None, timeout: float) -> float:
    """Poll `url` until it answers 200; fail early if `proc` died meanwhile. Returns the
    seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log else ""
            raise SystemExit(f"process for {url} exited with {proc.returncode}\n{tail}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise SystemExit(f"{url} not ready after {timeout:.0f}s")


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
