"""What a gateway request reads of the process it runs in: the settings `create_app` stored,
and how often a request that waits on the database (a rollout's wait, an event stream,
ProRL's `/process`) reads it again."""

from __future__ import annotations

from flask import current_app

from core.settings import Settings

SETTINGS_KEY = "RAAS"  # the Flask config key holding the gateway's `Settings`
# A waiting request reads the database again this often: short enough that an answer follows
# its row within a fifth of a second, long enough that many waits cost little.
POLL_SECONDS = 0.2


def gateway_settings() -> Settings:
    """The settings of the gateway serving this request."""
    return current_app.config[SETTINGS_KEY]
