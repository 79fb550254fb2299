"""Baseline for bench/pipeline.py: ONE pool that runs INIT, RUN and EVAL back to back per
rollout, through the very same stage code (claims, heartbeats, writes), so the comparison
isolates the effect of separate stage queues and pools.

Run as: python bench/serial_worker.py --concurrency N (settings from RAAS_* env).
"""

from __future__ import annotations

import argparse

from agents.registry import load_handler_modules
from core.settings import load_settings
from tasks import stages
from tasks.celery_app import make_celery
from tasks.process.parts import ProcessParts
from tasks.worker import stage_steps

NEXT = {"init": "run", "run": "eval"}


def inline_publish(
    app,
    stage,
    rollout_id,
    attempt,
    node=None,
    producer=None,  # noqa: ANN001
    retry_seconds=0.0,
):
    """Instead of queueing the next stage, run it right here in the same slot."""
    stages.StageRun(app, stage, rollout_id, attempt).execute()


def main() -> None:
    """Consume the init queue; every message runs the whole rollout serially."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=12)
    args = parser.parse_args()
    settings = load_settings()
    load_handler_modules(settings.handler_modules)
    stages.publish = inline_publish  # the only difference from the three-pool pipeline
    app = make_celery(settings)
    app.raas_parts = ProcessParts(stage_steps(settings)).start()  # what the stages reach
    app.worker_main(
        [
            "worker",
            "-Q",
            "init",
            "-P",
            "threads",
            "-c",
            str(args.concurrency),
            "-n",
            "serial@bench",
            "-l",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
    )


if __name__ == "__main__":
    main()
