"""`raas up`: the whole service in one command on the embedded default.

SQLite and the kombu filesystem broker live under the home folder; migrations run first; the
three stage pools are child processes (so a crash in one does not take the gateway down); the
reaper runs in a thread; Ctrl-C stops everything, children first.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading

from core.settings import Settings

log = logging.getLogger(__name__)
STOP_GRACE_SECONDS = 15


def spawn_workers(settings: Settings, concurrency: int) -> list[subprocess.Popen]:
    """One child process per stage pool, with this process's settings in its environment."""
    env = {**os.environ, "RAAS_HOME": str(settings.home.resolve()), "RAAS_NODE": settings.node}
    return [subprocess.Popen([sys.executable, "-m", "app.cli", "worker", "--stage", stage,
                              "--concurrency", str(concurrency)], env=env)
            for stage in ("init", "run", "eval")]


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


def run_embedded(settings: Settings, host: str, port: int, concurrency: int) -> None:
    """Run until Ctrl-C."""
    from werkzeug.serving import make_server

    from app import create_app
    from migrations.runner import upgrade
    from tasks.reaper import Reaper

    settings.home.mkdir(parents=True, exist_ok=True)
    upgrade(settings.db_url)
    app = create_app(settings)
    server = make_server(host, port, app, threaded=True)  # a busy port fails before any child
    children: list[subprocess.Popen] = []
    reaper = Reaper(settings, app.extensions["celery"])
    # Background launches (`cmd &` in a script) start with SIGINT ignored: SIGTERM always works.
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    try:
        children = spawn_workers(settings, concurrency)
        threading.Thread(target=reaper.run_forever, name="raas-reaper", daemon=True).start()
        log.info("raas up: http://%s:%s (home %s, node %s)", host, port,
                 settings.home.resolve(), settings.node)
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        log.info("stopping")
        reaper.stop()
        stop_children(children)
        server.server_close()
