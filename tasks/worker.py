"""Start one stage's Celery worker pool on this node."""
from __future__ import annotations

import os

from agents.registry import load_handler_modules
from core.db import use_pre_ping
from core.settings import Settings
from tasks.celery_app import make_celery
from tasks.config import stage_queue


def worker_argv(settings: Settings, stage: str, concurrency: int, pool: str,
                loglevel: str) -> list[str]:
    """Celery worker arguments: one queue, the stage's pool, no chatter between workers."""
    return ["worker", "-Q", stage_queue(stage, settings.node), "-P", pool,
            "-c", str(concurrency), "-n", f"{stage}@{settings.node}-{os.getpid()}",
            "-l", loglevel, "--without-gossip", "--without-mingle", "--without-heartbeat"]


def run_worker(settings: Settings, stage: str, concurrency: int, pool: str = "threads",
               loglevel: str = "INFO") -> None:
    """Block running the worker (returns on shutdown)."""
    load_handler_modules(settings.handler_modules)
    use_pre_ping(False)
    app = make_celery(settings)
    app.worker_main(worker_argv(settings, stage, concurrency, pool, loglevel))
