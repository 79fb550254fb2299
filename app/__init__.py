"""The raas gateway: Flask app factory, REST API, persistence and configuration.

Importing this package stays cheap (no Flask import) so that workers, the sandbox client and
the CLI can use `app.errors`, `app.config` and `app.models` without loading the web stack.
"""
from __future__ import annotations

from typing import Any


def create_app(config: Any = None):
    """Build the Flask gateway; `config` is a Settings object or a mapping of overrides."""
    from app.factory import build_app

    return build_app(config)
