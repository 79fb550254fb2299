"""The example data the handlers ship as package data, read where the package is installed.

`agents/examples/` holds what a handler reads by default: the search handler's corpus and the
SWE example repositories (the checkout's `examples/` links to them). A job names them as it
always has, relative to this root: `examples/search/corpus.jsonl`, `examples/swe/money/repo`.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def _folder(resource: object) -> Path:
    """A package's folder on disk (git, pip and BM25 read these as files, not as resources)."""
    if not isinstance(resource, Path):
        raise RuntimeError(f"raas must be installed as files, not in a zip archive ({resource})")
    return resource


# What a job's relative example path is read against ("examples/..." lies inside it).
SHIPPED_ROOT = _folder(files("agents"))
SHIPPED_EXAMPLES = SHIPPED_ROOT / "examples"
