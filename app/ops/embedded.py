"""`raas up`: the whole service in one command on the embedded default.

SQLite and the embedded Redis server (tasks/broker/embedded_redis.py: the broker, on a Unix socket,
with an append-only file) live under the home folder; `raas up` starts the server (or adopts
the one a killed `raas up` or a standalone worker left running) and stops it at exit;
migrations run first; the three stage pools are child processes (so a crash in one does not take the gateway down; a
pool of more than `max_slots_per_process` slots is several) that
a supervisor thread restarts when one dies; the reaper runs in a thread; Ctrl-C stops
everything, children first, then the sandboxes this deployment left running.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from core.settings import Settings

log = logging.getLogger(__name__)
SIM_PORT = 8100  # `raas llm-sim`'s default port


def port_free(host: str, port: int) -> bool:
    """True when nothing listens on host:port (a bind succeeds)."""
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def next_commands(host: str, port: int, sim_port: int = SIM_PORT) -> list[str]:
    """The quick start's next commands for the ports actually in use: the gateway's URL, and
    a simulator port that is free (the default one unless it is taken)."""
    free = next((p for p in range(sim_port, sim_port + 100) if p != port and port_free(host, p)), sim_port)
    sim = "" if free == SIM_PORT else f" --port {free}"
    url = f"http://{host}:{port}"
    return [
        f"export RAAS_URL={url}",
        f"raas llm-sim --register --detach{sim}",
        "raas submit examples/math.jsonl --agent math --limit 4 --n 2 --wait --out rollouts.jsonl",
        f"# dashboard: {url}/ui",
    ]


STOP_GRACE_SECONDS = 15
SUPERVISE_INTERVAL = 1.0
RESTART_BACKOFF = 5.0  # a pool that keeps crashing at start is retried this often, not faster
STAGES = ("init", "run", "eval")


def spawn_worker(settings: Settings, stage: str, concurrency: int, verbose: bool = False) -> subprocess.Popen:
    """One stage pool as a child process, with this process's settings in its environment."""
    env = {**os.environ, "RAAS_HOME": str(settings.home.resolve()), "RAAS_NODE": settings.node}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.ops.cli",
            "worker",
            "--stage",
            stage,
            "--concurrency",
            str(concurrency),
            *(["--verbose"] if verbose else []),
        ],
        env=env,
    )


class Supervisor:
    """Keeps each stage pool's processes alive (one unless `concurrency` exceeds
    `max_slots_per_process`: `app.ops.node.process_slots`): a process that exits is started
    again (with a log line)."""

    def __init__(self, settings: Settings, concurrency: int, verbose: bool = False) -> None:
        from app.ops.node import process_slots

        self.settings = settings
        self.verbose = verbose
        # (stage, index) -> that process's slots
        self.slots = {
            (stage, i): n
            for stage in STAGES
            for i, n in enumerate(process_slots(concurrency, settings.max_slots_per_process))
        }
        self.pools: dict[tuple[str, int], subprocess.Popen] = {}
        self.started: dict[tuple[str, int], float] = {}
        self.stopping = threading.Event()
        self.lock = threading.Lock()

    def start(self) -> None:
        """Spawn the pools and the watching thread."""
        with self.lock:
            for key in self.slots:
                self._spawn(key)
        threading.Thread(target=self._watch, name="raas-supervisor", daemon=True).start()

    def _watch(self) -> None:
        while not self.stopping.wait(SUPERVISE_INTERVAL):
            with self.lock:
                if self.stopping.is_set():
                    return
                for key, proc in list(self.pools.items()):
                    if proc.poll() is None:
                        continue
                    if time.monotonic() - self.started[key] < RESTART_BACKOFF:
                        continue
                    log.warning(
                        "%s pool (pid %s) exited with %s; starting a new one",
                        key[0].upper(),
                        proc.pid,
                        _describe_exit(proc.returncode),
                    )
                    self._spawn(key)

    def _spawn(self, key: tuple[str, int]) -> None:
        self.pools[key] = spawn_worker(self.settings, key[0], self.slots[key], self.verbose)
        self.started[key] = time.monotonic()

    def stop(self) -> None:
        """Stop watching, then stop every pool."""
        self.stopping.set()
        with self.lock:
            stop_children(list(self.pools.values()))


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


def _interrupt(supervisor: Supervisor) -> None:
    """Ctrl-C: the pools got it too and are exiting; do not restart them."""
    supervisor.stopping.set()
    raise KeyboardInterrupt


def stop_children(children: list[subprocess.Popen]) -> None:
    """SIGTERM, wait, then SIGKILL whatever is left."""
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            child.wait(STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def stop_deployment_sandboxes(settings: Settings) -> int:
    """Stop the sandboxes whose workspaces are this deployment's; returns how many."""
    from sandbox import list_sandboxes
    from tasks.sandboxing.sandboxes import release

    root = str(settings.workspaces) + "/"
    handles = [h for h in list_sandboxes() if str(h.get("workspace", "")).startswith(root)]
    for handle in handles:
        release(handle)
    if handles:
        log.info(
            "stopped %s sandbox(es) of rollouts between stages; the next `raas up` retries those rollouts", len(handles)
        )
    return len(handles)


def stop_broker(settings: Settings) -> None:
    """Stop the home's embedded Redis (`raas up` owns its life); nothing on a real Redis."""
    from tasks.broker import embedded_redis

    if settings.embedded_broker:
        embedded_redis.stop(settings)


def run_embedded(
    settings: Settings, host: str, port: int, concurrency: int, verbose: bool = False, insecure: bool = False
) -> None:
    """Run until Ctrl-C (a non-loopback host without tokens refuses unless `insecure`)."""
    from app import create_app
    from app.auth import check_exposure
    from app.ops.devserver import make_server
    from migrations.runner import upgrade
    from tasks.broker import embedded_redis
    from tasks.recovery.reaper import Reaper

    settings.home.mkdir(parents=True, exist_ok=True)
    upgrade(settings.db_url)
    check_exposure(settings, host, insecure)
    if settings.embedded_broker and not embedded_redis.ensure_running(settings):
        log.info("the embedded Redis was already running: using it (it keeps what was queued)")
    try:
        app = create_app(settings)
        server = make_server(host, port, app, settings)  # a busy port fails before any child
    except BaseException:
        stop_broker(settings)
        raise
    supervisor = Supervisor(settings, concurrency, verbose)
    reaper = Reaper(settings, app.extensions["celery"])
    # Background launches (`cmd &` in a script) start with SIGINT ignored: SIGTERM always works.
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, lambda *_: _interrupt(supervisor))
    try:
        supervisor.start()
        threading.Thread(target=reaper.run_forever, name="raas-reaper", daemon=True).start()
        log.info(
            "raas up: gateway http://%s:%s, home %s, node %s, database %s (migrated), "
            "broker %s, pools init/run/eval x%s",
            host,
            port,
            settings.home.resolve(),
            settings.node,
            settings.db_url.split("@")[-1],
            settings.broker.split("@")[-1],
            concurrency,
        )
        log.info("next, in another shell (. .venv/bin/activate):\n  %s", "\n  ".join(next_commands(host, port)))
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        log.info("stopping")
        reaper.stop()
        supervisor.stop()
        try:
            stop_deployment_sandboxes(settings)
        except Exception:  # noqa: BLE001 - stopping must finish; the next reaper sweeps them
            log.exception("stopping this deployment's sandboxes failed")
        stop_broker(settings)  # after the pools: their last acks reach it
        server.server_close()
