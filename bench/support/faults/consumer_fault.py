"""Test-only: make a pool's Celery consumer fail once, on demand (a fault of the campaign).

Loaded into every campaign pool through RAAS_HANDLER_MODULES. Once the pool is ready, a thread
watches the folder named by the CAMPAIGN_TRIGGERS environment variable: when a file named
after the pool's queue (e.g. `eval.n2`) appears, it is removed and a callback that raises is
scheduled on the consumer's own loop, the way kombu's AttributeError on an ack during a Redis
restart did (issue 26). Everything around it is real: the worker process, its consumer, the
broker; what the pool does next (exit, or restart its consumer) is what is measured.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from celery.signals import worker_ready

ENV = "CAMPAIGN_TRIGGERS"


def _crash(fired: threading.Event) -> None:
    if fired.is_set():  # scheduled again while the first one was on its way: once is enough
        return
    fired.set()
    raise AttributeError("'NoneType' object has no attribute 'hostname'")


def _watch(consumer: Any, folder: Path) -> None:
    names = [q.name for q in consumer.task_consumer.queues]
    while True:
        for name in names:
            trigger = folder / name
            if trigger.exists():
                trigger.unlink(missing_ok=True)
                fired = threading.Event()
                # A consumer that is reconnecting (the broker is away) drops what was
                # scheduled on its loop: schedule again until the failure happened once.
                while not fired.is_set():
                    consumer.call_soon(_crash, fired)
                    fired.wait(0.5)
        time.sleep(0.1)


@worker_ready.connect(weak=False)
def _arm(sender: Any = None, **_: Any) -> None:
    folder = os.environ.get(ENV)
    if folder and sender is not None:
        threading.Thread(target=_watch, args=(sender, Path(folder)), name="consumer-fault", daemon=True).start()
