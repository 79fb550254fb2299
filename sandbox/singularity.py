"""SingularityRuntime (placeholder until the command lines land)."""
from __future__ import annotations
