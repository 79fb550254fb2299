"""A whole raas service for tests: real gateway over HTTP, real Celery worker processes per
stage and node, a real reaper, on the embedded default or on Redis + PostgreSQL.

Other test modules use `start_service(...)`; workers load the test-only handlers from
`tests.pipeline_handlers` plus any modules passed in `handler_modules`.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from werkzeug.serving import make_server

from app import create_app
from client import RaasClient
from core.settings import Settings
from migrations.runner import upgrade
from tasks.reaper import Reaper

REPO = Path(__file__).resolve().parent.parent
def wait_for(predicate: Callable[[], Any], timeout: float = 30, what: str = "condition",
             interval: float = 0.1) -> Any:
    """Poll `predicate` until it returns something truthy (returned); fail naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


FAST_RELIABILITY = {"heartbeat_interval": 0.5, "lease_timeout": 4.0, "requeue_after": 3.0,
                    "reaper_interval": 0.5, "stage_grace": 2.0, "soft_shutdown_timeout": 0}


@dataclass
class Service:
    """A running raas service; `stop()` tears everything down."""

    settings: Settings
    env: dict[str, str]
    url: str
    client: RaasClient
    logs: Path
    workers: dict[tuple[str, str], subprocess.Popen] = field(default_factory=dict)
    _server: Any = None
    _reaper: Reaper | None = None

    def start_worker(self, stage: str, node: str, concurrency: int = 4) -> subprocess.Popen:
        """Start (or restart) the `stage` pool of `node` as a child process."""
        log = open(self.logs / f"{stage}-{node}.log", "ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "worker", "--stage", stage, "--node", node,
             "--concurrency", str(concurrency), "--loglevel", "INFO"],
            env={**self.env, "RAAS_NODE": node}, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        self.workers[(stage, node)] = proc
        return proc

    def kill_worker(self, stage: str, node: str, sig: int = signal.SIGKILL) -> None:
        """Kill a pool the hard way (no cleanup, no ack)."""
        proc = self.workers.pop((stage, node))
        proc.send_signal(sig)
        proc.wait(30)

    def wait_done(self, job_id: str, timeout: float = 60) -> dict[str, Any]:
        """Poll until every rollout of the job is terminal; returns the job view."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.client.job(job_id)
            if job["finished"] >= job["n_rollouts"]:
                return job
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} not done in {timeout}s: {self.client.job(job_id)}"
                             f"\n{self.log_tail()}")

    def all_results(self, job_id: str) -> list[dict[str, Any]]:
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
        """Stop workers, reaper and gateway."""
        if self._reaper:
            self._reaper.stop()
        for proc in self.workers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.workers.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.client.close()
        if self._server:
            self._server.shutdown()
        self.release_sandboxes()

    def release_sandboxes(self) -> int:
        """Stop sandboxes this service left behind (rollouts still running at stop)."""
        from sandbox import list_sandboxes
        from tasks.sandboxes import release

        root = str(self.settings.workspaces) + "/"
        leftovers = [h for h in list_sandboxes() if str(h.get("workspace", "")).startswith(root)]
        for handle in leftovers:
            release(handle)
        return len(leftovers)


def start_service(home: Path, *, db_url: str | None = None, broker_url: str | None = None,
                  key_prefix: str = "", nodes: tuple[str, ...] = ("node-a",),
                  concurrency: int | dict[str, int] = 4, reaper: bool = True,
                  handler_modules: str = "", stages: tuple[str, ...] = ("init", "run", "eval"),
                  extra: dict[str, Any] | None = None) -> Service:
    """Migrate, start the gateway in a thread, one pool per stage and node, and a reaper."""
    modules = ",".join(m for m in ("tests.pipeline_handlers", handler_modules) if m)
    values: dict[str, Any] = {"home": home, "database_url": db_url, "broker_url": broker_url,
                              "broker_key_prefix": key_prefix, "node": nodes[0],
                              "handler_modules": modules, **FAST_RELIABILITY, **(extra or {})}
    settings = Settings(**{k: v for k, v in values.items() if v is not None})
    upgrade(settings.db_url)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAAS_")}
    env["PYTHONPATH"] = str(REPO)
    for key, value in values.items():
        if value is not None:
            env[f"RAAS_{key.upper()}"] = json.dumps(value) if isinstance(value, (dict, list)) \
                else str(value)
    app = create_app(settings)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    svc = Service(settings, env, url, RaasClient(url, timeout=60), logs, _server=server)
    for node in nodes:
        for stage in stages:
            n = concurrency if isinstance(concurrency, int) else concurrency[stage]
            svc.start_worker(stage, node, n)
    if reaper:
        svc._reaper = Reaper(settings, app.extensions["celery"])
        threading.Thread(target=svc._reaper.run_forever, daemon=True).start()
    return svc
