"""Celery side of raas: the app and its config, the three stage tasks, the reaper, worker CLI."""
