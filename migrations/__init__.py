"""Alembic environment and revisions; `raas db upgrade` runs them (see `migrations.runner`)."""
