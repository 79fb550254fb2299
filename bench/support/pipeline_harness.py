"""A whole raas service for tests: real gateway over HTTP, real Celery worker processes per
stage and node, a real reaper, on the embedded default (SQLite + the embedded Redis under the
test's home, started by the gateway and stopped by `stop()`) or on Redis + PostgreSQL.

Other test modules use `start_service(...)`; workers load the test-only handlers from
`bench.support.pipeline_handlers` plus any modules passed in `handler_modules`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from werkzeug.serving import make_server

from app import create_app
from app.ops.embedded import stop_broker, stop_deployment_sandboxes
from app.ops.node import NodeSupervisor
from raas_client import RaasClient, RolloutView
from raas_client.models import JobView
from core.settings import Settings
from migrations.runner import upgrade
from tasks.recovery.reaper import Reaper
from bench.support.waiting import wait_for  # re-exported: tests import it from here

REPO = Path(__file__).resolve().parents[2]


FAST_RELIABILITY = {
    "heartbeat_interval": 0.5,
    "lease_timeout": 4.0,
    "requeue_after": 3.0,
    "reaper_interval": 0.5,
    "stage_grace": 2.0,
    "soft_shutdown_timeout": 0,
}


@dataclass
class Service:
    """A running raas service; `stop()` tears everything down.

    Each node's pools and reaper start and stop through that node's `NodeSupervisor` (the one
    `raas node` and `raas up` run: same argv, sessions, parent-death signal and stop order),
    but nothing restarts a pool that exits unless the test does (`start_worker`, from a thread
    that outlives the pool: Linux sends the parent-death signal when the forking thread ends)."""

    settings: Settings
    env: dict[str, str]
    url: str
    client: RaasClient
    logs: Path
    workers: dict[tuple[str, str], subprocess.Popen] = field(default_factory=dict)  # each pool's first process
    # every process of each pool: more than one past `max_slots_per_process` (`app.ops.node.process_slots`)
    processes: dict[tuple[str, str], list[subprocess.Popen]] = field(default_factory=dict)
    node_extra: dict[str, dict[str, Any]] = field(default_factory=dict)
    reapers: dict[str, Reaper] = field(default_factory=dict)
    supervisors: dict[str, NodeSupervisor] = field(default_factory=dict)
    _server: Any = None
    _reaper: Reaper | None = None
    _celery: Any = None

    def node_settings(self, node: str) -> Settings:
        """The settings a process of `node` runs with (its own dirs when `node_extra` says;
        its values are typed as Settings holds them, e.g. Path for folders)."""
        return self.settings.model_copy(update={"node": node, **self.node_extra.get(node, {})})

    def supervisor(self, node: str) -> NodeSupervisor:
        """`node`'s supervisor (made on first use), its pools logging to `logs/<stage>-<node>.log`."""
        if node not in self.supervisors:
            env = {**self.env, **_as_env(self.node_extra.get(node, {}))}
            self.supervisors[node] = NodeSupervisor(
                self.node_settings(node), {}, env=env, logs=self.logs, celery=self._celery
            )
        return self.supervisors[node]

    def start_reaper(self, node: str) -> Reaper:
        """Start (or restart) `node`'s reaper loop in a thread of this process."""
        reaper = self.supervisor(node).start_reaper()
        self.reapers[node] = reaper
        self._reaper = self._reaper or reaper
        return reaper

    def stop_reaper(self, node: str) -> None:
        """Stop `node`'s reaper after its current pass (a node that died stops reaping)."""
        reaper = self.reapers.pop(node)
        self.supervisor(node).stop_reaper()
        if self._reaper is reaper:
            self._reaper = next(iter(self.reapers.values()), None)

    def start_worker(self, stage: str, node: str, concurrency: int = 4) -> subprocess.Popen:
        """Start (or restart) the `stage` pool of `node` as child processes, split as `raas
        node` splits it; returns the first."""
        procs = [pool.proc for pool in self.supervisor(node).add_pool(stage, concurrency)]
        self.workers[(stage, node)], self.processes[(stage, node)] = procs[0], procs
        return procs[0]

    def kill_worker(self, stage: str, node: str, sig: int = signal.SIGKILL) -> None:
        """Kill a pool the hard way (no cleanup, no ack)."""
        proc = self.workers.pop((stage, node))
        proc.send_signal(sig)
        proc.wait(30)

    def wait_done(self, job_id: str, timeout: float = 60) -> JobView:
        """Poll until every rollout of the job is terminal; returns the job view."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.client.job(job_id)
            if job.finished >= job.n_rollouts:
                return job
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} not done in {timeout}s: {self.client.job(job_id)}\n{self.log_tail()}")

    def all_results(self, job_id: str) -> list[RolloutView]:
        """Every result page from cursor 0."""
        return list(self.client.results(job_id, wait=1))

    def log_tail(self, lines: int = 40) -> str:
        """The end of every worker log (for failure messages)."""
        out = []
        for path in sorted(self.logs.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(out)

    def stop(self) -> None:
        """Stop reapers, workers (as a node's drain does, without its hand-back) and gateway,
        then the sandboxes left behind (rollouts still running at stop) and the broker."""
        self.reapers.clear()
        for supervisor in self.supervisors.values():
            supervisor.stop_reaper()
        for supervisor in self.supervisors.values():
            supervisor.stop_pools()
        self.client.close()
        if self._server:
            self._server.shutdown()
        for node in {self.settings.node, *self.node_extra}:
            stop_deployment_sandboxes(self.node_settings(node))
        stop_broker(self.settings)  # the gateway started it (make_celery)


def start_service(
    home: Path,
    *,
    db_url: str | None = None,
    broker_url: str | None = None,
    key_prefix: str = "",
    nodes: tuple[str, ...] = ("node-a",),
    concurrency: int | dict[str, int] = 4,
    reaper: bool | str = True,
    handler_modules: str = "",
    stages: tuple[str, ...] = ("init", "run", "eval"),
    extra: dict[str, Any] | None = None,
    node_extra: dict[str, dict[str, Any]] | None = None,
) -> Service:
    """Migrate, start the gateway in a thread, one pool per stage and node, and a reaper.

    `reaper`: True runs one reaper (the first node's), "per_node" one per node (what a
    deployment runs), False none. `node_extra`: settings that differ per node (e.g. its own
    `sandbox_dir` and `workspace_root`, as on separate machines) for its workers and reaper.
    """
    modules = ",".join(m for m in ("bench.support.pipeline_handlers", handler_modules) if m)
    values: dict[str, Any] = {
        "home": home,
        "database_url": db_url,
        "broker_url": broker_url,
        "broker_key_prefix": key_prefix,
        "node": nodes[0],
        "handler_modules": modules,
        # a session's private sandbox folder (tests/agents/conftest.py)
        # reaches the workers too, not only this process's Settings
        "sandbox_dir": os.environ.get("RAAS_SANDBOX_DIR"),
        **FAST_RELIABILITY,
        **(extra or {}),
    }
    settings = Settings(**{k: v for k, v in values.items() if v is not None})
    upgrade(settings.db_url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAAS_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(_as_env({k: v for k, v in values.items() if v is not None}))
    app = create_app(settings)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    # a short poll: `stop()` waits for the loop to notice its shutdown (0.5 s by default)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    svc = Service(
        settings,
        env,
        url,
        RaasClient(url, timeout=60),
        logs,
        node_extra=dict(node_extra or {}),
        _server=server,
        _celery=app.extensions["celery"],
    )
    for node in nodes:
        for stage in stages:
            n = concurrency if isinstance(concurrency, int) else concurrency[stage]
            svc.start_worker(stage, node, n)
    for node in nodes if reaper == "per_node" else nodes[:1] if reaper else ():
        svc.start_reaper(node)
    return svc


def _as_env(values: dict[str, Any]) -> dict[str, str]:
    """Settings as the RAAS_* environment variables a worker process reads."""
    return {
        f"RAAS_{key.upper()}": json.dumps(value) if isinstance(value, (dict, list)) else str(value)
        for key, value in values.items()
    }


@dataclass
class GatewayProcess:
    """`raas gateway` as a child process of the service's settings, on a fixed port."""

    svc: Service
    port: int
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> GatewayProcess:
        """Start it and wait until /healthz answers."""
        log = open(self.svc.logs / f"gateway-{self.port}.log", "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.ops.cli", "gateway", "--port", str(self.port)],
            env=self.svc.env,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        # generous: a Python start-up takes tens of seconds on a loaded 2-core CI machine
        wait_for(self._healthy, timeout=180, what=f"gateway on port {self.port}", interval=0.2)
        return self

    def _healthy(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            log = (self.svc.logs / f"gateway-{self.port}.log").read_text(errors="replace")
            raise AssertionError(f"gateway exited {self.proc.returncode}:\n{log[-3000:]}")
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def kill(self) -> None:
        """SIGKILL: no shutdown, open streams torn mid-way."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
