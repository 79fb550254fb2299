"""The production gateway line of docs/deployment.md run for real (gunicorn), and the dev stack's file.

Docker cannot run on this machine, so docker-compose.dev.yml is only checked as a file: the
gateway is that page's gunicorn line, the node builds the handlers' sandbox environments,
and the image has the system Python that `raas env build` makes them from.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.test_embedded_up import free_port

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`

REPO = Path(__file__).resolve().parent.parent


def documented_gunicorn_line() -> str:
    """The production gateway command as docs/deployment.md gives it."""
    text = (REPO / "docs" / "deployment.md").read_text()
    return re.search(r"`(gunicorn [^`]*-b [^`]*'app:create_app\(\)')`", text).group(1)


def test_documented_gunicorn_line_serves_the_api(tmp_path):
    line = documented_gunicorn_line()
    port = free_port()
    argv = shlex.split(line.replace("0.0.0.0:8000", f"127.0.0.1:{port}"))
    assert argv[0] == "gunicorn" and f"127.0.0.1:{port}" in argv
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAAS_")}
    env.update(
        PYTHONPATH=str(REPO),
        RAAS_HOME=str(tmp_path / "home"),
        RAAS_HANDLER_MODULES="tests.pipeline_handlers",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
    )
    subprocess.run(
        [sys.executable, "-m", "app.ops.cli", "db", "upgrade"], env=env, check=True, capture_output=True, timeout=120
    )
    server = subprocess.Popen(
        argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and server.poll() is None:
            try:
                if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        accepted = httpx.post(
            f"{url}/v1/jobs",
            timeout=30,
            json={"agent": "test-trivial", "instances": [{"instance_id": "a", "data": {}}]},
        )
        assert accepted.status_code == 202, accepted.text
        job = httpx.get(f"{url}/v1/jobs/{accepted.json()['job_id']}", timeout=30).json()
        assert job["n_rollouts"] == 1
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        output = server.communicate(timeout=60)[0].decode(errors="replace")
    assert "Booting worker" in output, output[-2000:]


def test_dev_stack_builds_environments_with_the_system_python():
    compose = yaml.safe_load((REPO / "docker-compose.dev.yml").read_text())
    services = compose["services"]
    assert services["gateway"]["command"] == documented_gunicorn_line()
    node = services["node"]["command"]
    assert node.index("raas env build math") < node.index("raas worker")
    assert "raas env build pytest" in node
    image = compose["x-raas"]["build"]["dockerfile_inline"]
    assert re.search(r"apt-get install .*\bpython3\b.*\bpython3-venv\b", image)  # /usr/bin/python3


def test_dev_stack_flower_is_reachable_with_basic_auth_and_task_events():
    compose = yaml.safe_load((REPO / "docker-compose.dev.yml").read_text())
    flower = compose["services"]["flower"]
    assert "--address 0.0.0.0" in flower["command"]  # the container's loopback is not published
    user, _, password = flower["environment"]["RAAS_FLOWER_BASIC_AUTH"].partition(":")
    assert user and len(password) >= 8  # what `raas flower` requires off loopback
    assert compose["x-raas"]["environment"]["RAAS_TASK_EVENTS"] == "true"


def test_documented_gunicorn_line_keeps_long_polls_across_quiet_minutes(tmp_path):
    """Issue 27.5: with no result for > 30 s (node jobs pending: routine on a cluster), a
    40 s long poll on the documented gunicorn line answers 200, not a worker-timeout 500, and
    `raas submit --wait` keeps following until the job ends (workers start after 35 s)."""
    port = free_port()
    argv = shlex.split(documented_gunicorn_line().replace("0.0.0.0:8000", f"127.0.0.1:{port}"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAAS_")}
    env.update(
        PYTHONPATH=str(REPO),
        RAAS_HOME=str(tmp_path / "home"),
        RAAS_NODE="quiet",
        RAAS_HANDLER_MODULES="tests.pipeline_handlers",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
    )
    subprocess.run(
        [sys.executable, "-m", "app.ops.cli", "db", "upgrade"], env=env, check=True, capture_output=True, timeout=120
    )
    server = subprocess.Popen(
        argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    workers: list[subprocess.Popen] = []
    try:
        _wait_healthy(url, server)
        (tmp_path / "in.jsonl").write_text('{"instance_id": "a"}\n{"instance_id": "b"}\n')
        started = time.monotonic()
        submit = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app.ops.cli",
                "submit",
                str(tmp_path / "in.jsonl"),
                "--agent",
                "test-trivial",
                "--wait",
                "--url",
                url,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        job_id = None
        while job_id is None and time.monotonic() - started < 60:
            jobs = httpx.get(f"{url}/v1/jobs", timeout=10).json()["jobs"]
            job_id = jobs[0]["job_id"] if jobs else time.sleep(0.3)
        poll = httpx.get(f"{url}/v1/jobs/{job_id}/results", params={"wait": 40}, timeout=90)
        assert poll.status_code == 200 and poll.json()["items"] == [], poll.text[:500]
        assert time.monotonic() - started > 35  # the poll was held, not answered early
        for stage in ("init", "run", "eval"):
            workers.append(
                subprocess.Popen(
                    [sys.executable, "-m", "app.ops.cli", "worker", "--stage", stage, "-c", "1"],
                    env=env,
                    cwd=tmp_path,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        output = submit.communicate(timeout=120)[0].decode(errors="replace")
        assert submit.returncode == 0, output[-2000:]
        assert re.search(r"completed\W+2", output), output[-2000:]
    finally:
        for proc in workers:
            proc.terminate()
        for proc in workers:
            proc.wait(30)
        os.killpg(server.pid, signal.SIGTERM)
        log = server.communicate(timeout=60)[0].decode(errors="replace")
    assert "WORKER TIMEOUT" not in log, log[-2000:]


def _wait_healthy(url: str, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.3)
    raise AssertionError("gateway did not become healthy")
