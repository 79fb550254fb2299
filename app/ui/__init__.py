"""The web dashboard under /ui: jobs, a job, a rollout with its tokens, the live stage view.

Server-rendered (Jinja2, inline SVG charts) with a little plain JavaScript; nothing is fetched
from outside the gateway. Authentication is the API's own hook: a browser cannot send a bearer
header on navigation, so the token it logged in with (form or `?token=`) rides in a signed,
HttpOnly session cookie and is handed to that hook as the bearer header of /ui requests only.
Every query is scoped by `g.owner`, exactly like the API.
"""

from __future__ import annotations

from app.ui import views  # noqa: F401 - registers the pages on the blueprint
from app.ui.auth import bp

__all__ = ["bp"]
