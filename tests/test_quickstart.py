"""The README's quick start, run verbatim on a fresh home and fresh ports, as a newcomer would.

The README's blocks are read from README.md and run with bash; `raas` on PATH is this
checkout's CLI. `make up` is run as the command its Makefile recipe runs (`raas up`), because
`make` would (re)install the package into the shared virtualenv. The LLM is the simulator with
its built-in demo policy (a fake model, named as such): no GPU here.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.test_embedded_up import ctrl_c, default_sigint, free_port, processes_with_env

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`

REPO = Path(__file__).resolve().parent.parent
MARKER = "<!-- tests/test_quickstart.py runs these blocks verbatim"


def readme_blocks() -> tuple[str, str]:
    """The two bash blocks after the marker: starting the service, then using it."""
    text = (REPO / "README.md").read_text()
    after = text[text.index(MARKER) :]
    blocks = re.findall(r"```bash\n(.*?)```", after, re.DOTALL)
    return blocks[0], blocks[1]


def newcomer_env(tmp_path: Path) -> dict[str, str]:
    """A fresh HOME, no RAAS_* settings but fresh ports, and `raas` on PATH."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "raas"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m app.ops.cli "$@"\n')
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAAS_")}
    gateway_port, sim_port = free_port(), free_port()
    env.update(
        HOME=str(tmp_path / "home"),
        PYTHONPATH=str(REPO),
        PATH=f"{bindir}{os.pathsep}{env['PATH']}",
        RAAS_PORT=str(gateway_port),
        RAAS_URL=f"http://127.0.0.1:{gateway_port}",
        RAAS_LLM_SIM_PORT=str(sim_port),
    )
    return env


def raas(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["raas", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def wait_ready(url: str, up: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and up.poll() is None:
        try:
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"raas up did not become ready (rc={up.poll()})")


def test_readme_quick_start_on_a_fresh_home(tmp_path):
    start_block, use_block = readme_blocks()
    assert start_block.split("#")[0].strip() == "make up"
    assert "$(VENV)/bin/raas up" in (REPO / "Makefile").read_text()
    work = tmp_path / "clone"
    work.mkdir()
    (work / "examples").symlink_to(REPO / "examples")
    (tmp_path / "home").mkdir()
    env = newcomer_env(tmp_path)
    home = work / ".raas"
    up = subprocess.Popen(
        ["raas", "up"],
        env=env,
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=default_sigint,
    )
    sim_pid = None
    try:
        wait_ready(env["RAAS_URL"], up)
        started = time.monotonic()
        used = subprocess.run(
            ["bash", "-e", "-c", use_block], env=env, cwd=work, capture_output=True, text=True, timeout=400
        )
        elapsed = time.monotonic() - started
        found = re.search(r"pid (\d+)", used.stdout)
        sim_pid = int(found.group(1)) if found else None
        assert used.returncode == 0, used.stdout + used.stderr
        rows = [json.loads(line) for line in (work / "rollouts.jsonl").read_text().splitlines()]
        assert len(rows) == 8
        assert {(r["outcome"], r["reward"]) for r in rows} == {("completed", 1.0)}
        assert all(r["response_ids"] and len(r["loss_mask"]) == len(r["response_ids"]) for r in rows)
        assert re.search(r"completed +8 +mean reward 1\.00", used.stdout), used.stdout
        print(f"quick start: {elapsed:.1f} s including the first build of the math env")

        listed = raas(env, work, "env", "list")
        assert re.search(r"^math +numpy sympy +/", listed.stdout, re.M), listed.stdout
        servers = raas(env, work, "llm", "list")
        assert f"127.0.0.1:{env['RAAS_LLM_SIM_PORT']}" in servers.stdout

        unknown = raas(env, work, "status", "no-such-job")
        assert unknown.returncode == 1 and "Traceback" not in unknown.stderr
        assert "not found" in unknown.stderr and len(unknown.stderr.splitlines()) == 1

        job = work / "job.json"  # an environment nobody declared: the service cannot run it
        job.write_text(json.dumps({"sandbox": {"python_env": "not-built"}}))
        failed = raas(
            env, work, "submit", "examples/math.jsonl", "--agent", "math", "--limit", "1", "--job", str(job), "--wait"
        )
        assert failed.returncode == 1, failed.stdout + failed.stderr
        assert re.search(r"infra_error +1 +e\.g\. .*not built", failed.stdout), failed.stdout
        assert "Traceback" not in failed.stderr
    finally:
        if sim_pid:
            os.kill(sim_pid, signal.SIGKILL)
        output = ctrl_c(up, grace=90)
    assert up.returncode == 0, output[-3000:]
    assert not processes_with_env(f"RAAS_HOME={home.resolve()}"), "workers survived Ctrl-C"
