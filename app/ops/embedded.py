"""`raas up`: the whole service in one command on the embedded default: the gateway beside
the node supervisor of `raas node` (app/ops/node.py).

SQLite and the embedded Redis server (tasks/broker/embedded_redis.py: the broker, on a Unix socket,
with an append-only file) live under the home folder; `raas up` starts the server (or adopts
the one a killed `raas up` or a standalone worker left running) and stops it at exit;
migrations run first; the gateway serves from a thread; the main thread is the node
supervisor: the three stage pools as child processes (so a crash in one does not take the
gateway down) restarted with its backoff, and the reaper. Ctrl-C or SIGTERM drains as
`raas node` does (within `UP_SOFT_SHUTDOWN_SECONDS` unless RAAS_SOFT_SHUTDOWN_TIMEOUT says),
then the gateway stops, then the sandboxes this deployment left running, then the broker.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

from app.ops.node import STAGES, NodeSupervisor
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


# Ctrl-C at a terminal: RUN gets this long to finish its turn before it hands the rollout
# back (`raas node` under a scheduler: RAAS_SOFT_SHUTDOWN_TIMEOUT, 60 s by default)
UP_SOFT_SHUTDOWN_SECONDS = 5


def up_supervisor(settings: Settings, concurrency: int, verbose: bool = False, celery: Any = None) -> NodeSupervisor:
    """The node supervisor of `raas up`: `concurrency` slots per stage, the reaper on."""
    return NodeSupervisor(settings, dict.fromkeys(STAGES, concurrency), verbose=verbose, celery=celery)


def stop_deployment_sandboxes(settings: Settings) -> int:
    """Stop the sandboxes whose workspaces are this deployment's (after the drain: warm ones,
    and those of rollouts between stages, which the next start retries); returns how many."""
    from sandbox import list_sandboxes
    from tasks.sandboxing.sandboxes import release

    root = str(settings.workspaces) + "/"
    handles = [h for h in list_sandboxes(settings.sandbox_dir) if str(h.get("workspace", "")).startswith(root)]
    for handle in handles:
        release(handle)
    if handles:
        log.info("stopped %s sandbox(es) this deployment left running", len(handles))
    return len(handles)


def stop_broker(settings: Settings) -> None:
    """Stop the home's embedded Redis (`raas up` owns its life); nothing on a real Redis."""
    from tasks.broker import embedded_redis

    if settings.embedded_broker:
        embedded_redis.stop(settings)


def run_embedded(
    settings: Settings, host: str, port: int, concurrency: int, verbose: bool = False, insecure: bool = False
) -> None:
    """Run until Ctrl-C or SIGTERM (a non-loopback host without tokens refuses unless `insecure`)."""
    from app import create_app
    from app.auth import check_exposure
    from app.ops.devserver import make_server
    from migrations.runner import upgrade
    from tasks.broker import embedded_redis

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
    gateway = threading.Thread(target=server.serve_forever, name="raas-gateway", daemon=True)
    gateway.start()
    supervisor = up_supervisor(settings, concurrency, verbose, app.extensions["celery"])
    try:
        supervisor.run(announce=lambda: announce(settings, host, port, concurrency))
    finally:
        server.shutdown()
        try:
            stop_deployment_sandboxes(settings)
        except Exception:  # stopping must finish; the next reaper sweeps them
            log.exception("stopping this deployment's sandboxes failed")
        stop_broker(settings)  # after the pools: their last acks reach it
        server.server_close()


def announce(settings: Settings, host: str, port: int, concurrency: int) -> None:
    """The two lines `raas up` prints once everything runs: where, and what to type next."""
    log.info(
        "raas up: gateway http://%s:%s, home %s, node %s, database %s (migrated), broker %s, pools init/run/eval x%s",
        host,
        port,
        settings.home.resolve(),
        settings.node,
        settings.db_url.split("@")[-1],
        settings.broker.split("@")[-1],
        concurrency,
    )
    log.info("next, in another shell (. .venv/bin/activate):\n  %s", "\n  ".join(next_commands(host, port)))
