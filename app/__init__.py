"""The raas gateway: Flask app factory, REST API, wire schemas and the CLI.

The shared core (errors, settings, models, db) lives in `core/`; importing this package stays
cheap (no Flask import) so that the CLI can start quickly.
"""

from __future__ import annotations

from typing import Any


def create_app(config: Any = None):
    """Build the Flask gateway; `config` is a Settings object or a mapping of overrides."""
    from app.factory import build_app

    return build_app(config)
