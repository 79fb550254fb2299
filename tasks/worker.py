"""Start one stage's Celery worker pool on this node."""
from __future__ import annotations

import logging
import os
import warnings

from celery.platforms import SecurityWarning
from celery.signals import worker_ready

from agents.llm.backends import http_client
from agents.registry import load_handler_modules
from core.db import configure_pool, use_pre_ping
from core.settings import Settings
from tasks import db_retry
from tasks.celery_app import make_celery
from tasks.config import stage_queue
from tasks.sandboxes import check_node_settings

log = logging.getLogger(__name__)


def worker_argv(settings: Settings, stage: str, concurrency: int, pool: str,
                loglevel: str, quiet: bool = False) -> list[str]:
    """Celery worker arguments: one queue, the stage's pool, no chatter between workers
    (and no start-up banner when quiet)."""
    return [*(["--quiet"] if quiet else []), "worker", "-Q", stage_queue(stage, settings.node),
            "-P", pool, "-c", str(concurrency), "-n", f"{stage}@{settings.node}-{os.getpid()}",
            "-l", loglevel, "--without-gossip", "--without-mingle", "--without-heartbeat"]


def run_worker(settings: Settings, stage: str, concurrency: int, pool: str = "threads",
               loglevel: str = "INFO", quiet: bool = False) -> None:
    """Block running the worker (returns on shutdown)."""
    load_handler_modules(settings.handler_modules)
    check_node_settings(settings)
    configure_pool(settings)  # a few connections shared by all `concurrency` threads
    use_pre_ping(False)
    http_client.configure(concurrency)  # keep-alive connections for every slot
    db_retry.configure(settings.lease_timeout if settings.db_retry_seconds is None
                       else settings.db_retry_seconds)  # an outage shorter than the lease
    app = make_celery(settings)
    queue = stage_queue(stage, settings.node)
    if quiet:
        # Celery warns on every start as root; stage code never runs agent code (sandboxes
        # do), and root is how containers run: not something the operator can act on.
        warnings.filterwarnings("ignore", category=SecurityWarning)

    @worker_ready.connect(weak=False)
    def _ready(**_: object) -> None:
        log.info("%s pool ready: queue %s, %s %s, pid %s", stage.upper(), queue, concurrency,
                 pool, os.getpid())

    app.worker_main(worker_argv(settings, stage, concurrency, pool, loglevel, quiet))
