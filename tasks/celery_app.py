"""Build the Celery app for a given `Settings` (gateway, workers and tests each make one)."""

from __future__ import annotations

from celery import Celery

from core.settings import Settings
from tasks.broker.config import celery_config


def make_celery(settings: Settings) -> Celery:
    """A Celery app wired to `settings`; the stage tasks are registered on it.

    On the embedded default this is where every process (gateway, workers, reaper, Flower)
    finds the home's Redis server running or starts it (`tasks.broker.embedded_redis`)."""
    if settings.embedded_broker:
        from tasks.broker.embedded_redis import ensure_running

        ensure_running(settings)
    app = Celery("raas", set_as_current=False)
    app.conf.update(celery_config(settings))
    app.raas_settings = settings  # read by the stage tasks: one source of config per process
    app.raas_factory = f"{__name__}:make_celery"  # how a child process (the outbox's) makes its own
    import tasks.reevaluate  # noqa: F401  (shared_task registration on every app)
    import tasks.stages  # noqa: F401
    import tasks.validation  # noqa: F401

    app.finalize()
    return app
