"""The machine's shared Redis and PostgreSQL that tests and benches use (never skipped when down).

`RAAS_TEST_PG_URL` / `RAAS_TEST_REDIS_URL` point them elsewhere.
"""

from __future__ import annotations

import os

PG_ADMIN_URL = os.environ.get("RAAS_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REDIS_URL = os.environ.get("RAAS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
