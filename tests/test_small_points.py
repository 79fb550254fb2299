"""The quick start's small points (issue 21): each cost a new user time once.

`raas llm-sim --detach` on a busy port fails and registers nothing; `make up` runs no apt-get
(Chromium only for `make test`); `raas up` prints next commands with the ports in use; the
mask-0 logprob placeholder is documented in the rollout record (and so in the OpenAPI)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from fakellm.server import BUNDLED_TOKENIZER, start_simulator
from app.ops.embedded import next_commands
from app.openapi import build_openapi
from bench.support.pipeline_harness import start_service

REPO = Path(__file__).resolve().parent.parent


def test_llm_sim_detach_on_a_busy_port_fails_and_registers_nothing(tmp_path):
    svc = start_service(tmp_path / "home", stages=(), reaper=False)  # the gateway alone
    url, stop = start_simulator(str(BUNDLED_TOKENIZER), {"default": ["another server"]})
    port = url.rsplit(":", 1)[1]
    try:
        env = {**os.environ, "RAAS_HOME": str(tmp_path / "home")}
        res = subprocess.run(
            [
                sys.executable,
                "-m",
                "app.ops.cli",
                "llm-sim",
                "--detach",
                "--register",
                "--port",
                port,
                "--url",
                svc.url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=REPO,
        )
        assert res.returncode == 1, res.stdout + res.stderr
        assert f"port {port} on 127.0.0.1 is in use" in res.stderr
        assert "Traceback" not in res.stderr and "registered" not in res.stdout
        assert svc.client.llm_servers() == []  # the server already there was not adopted
        assert httpx.get(f"{url}/sim/stats", timeout=5).json().get("requests", 0) == 0
    finally:
        stop()
        svc.stop()


def test_make_up_runs_no_apt_get_and_make_test_gets_chromium():
    def planned(target: str) -> str:
        return subprocess.run(
            ["make", "-n", target, "VENV=/nonexistent-venv"], cwd=REPO, capture_output=True, text=True, timeout=30
        ).stdout

    up, test = planned("up"), planned("test")
    assert "raas up" in up and "install_chromium" not in up and "apt-get" not in up
    assert "install_chromium.sh" in test and "pytest" in test


def _requirements(*target: str) -> list[str]:
    """The server's requirements as pip resolves them for `pip install TARGET` (metadata only)."""
    report = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--no-deps", "--report", "-", *target],
        cwd="/",
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    (server,) = json.loads(report.stdout)["install"]
    return server["metadata"]["requires_dist"]


def test_installing_the_server_brings_the_sdk_it_imports():
    """The server imports raas_client (sdk/, no index has it): a wheel requires it from the
    folder beside, so `pip install .` alone gives a `raas` that starts; an editable install
    requires it by name, so the Makefile's editable SDK (installed first) is left in place."""
    assert f"raas-client @ {(REPO / 'sdk').as_uri()}" in _requirements(str(REPO))
    editable = _requirements("-e", str(REPO))
    assert "raas-client" in editable and not any(r.startswith("raas-client @") for r in editable)
    makefile = (REPO / "Makefile").read_text()
    assert makefile.index("-e './sdk") < makefile.index("-e '.[test]'")
    image = (REPO / "docker-compose.dev.yml").read_text()
    assert "pip install --no-cache-dir -e ./sdk -e ." in image


def test_up_prints_next_commands_for_the_ports_in_use():
    with socket.socket() as held:  # the simulator's usual port is taken: another is offered
        held.bind(("127.0.0.1", 0))
        held.listen()
        busy = held.getsockname()[1]
        lines = next_commands("127.0.0.1", 8001, sim_port=busy)
    assert lines[0] == "export RAAS_URL=http://127.0.0.1:8001"
    offered = int(lines[1].rsplit("--port ", 1)[1])
    assert offered != busy and offered != 8001
    assert lines[-1] == "# dashboard: http://127.0.0.1:8001/ui"


def test_the_mask_0_logprob_is_documented_in_the_record():
    import app.api.jobs  # noqa: F401 - registers the typed routes the document is built from

    schema = build_openapi()["components"]["schemas"]["RolloutView-Output"]["properties"]
    assert "0.0 where loss_mask is 0" in schema["response_logprobs"]["description"]
    assert "failure_class" in schema
