"""The server's build backend: setuptools', telling `setup.py` whether the build is editable.

The server imports the SDK (sdk/, the `raas-client` distribution), which no package index has.
`setup.py` names it one of two ways, and only the backend knows which build runs (setuptools
prepares the same metadata for a wheel and for an editable install):

- a wheel (`pip install .`): `raas-client @ file://<this checkout>/sdk`, so pip installs the SDK
  from the folder beside the server;
- an editable install (the Makefile's `pip install -e '.[test]'`, after `pip install -e ./sdk`):
  `raas-client` by name, which the editable SDK satisfies (a file requirement would make pip
  replace that editable SDK with a copy).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # the wheel and sdist hooks, unchanged
    build_sdist,
    build_wheel,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_wheel,
)

# Set while an editable hook runs (pip runs each hook in a process of its own); setup.py reads it.
EDITABLE = "RAAS_BUILD_EDITABLE"

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]


def _editable(hook: Callable[..., Any]) -> Callable[..., Any]:
    """`hook` run with EDITABLE set."""

    def run(*args: Any, **kwargs: Any) -> Any:
        os.environ[EDITABLE] = "1"
        try:
            return hook(*args, **kwargs)
        finally:
            del os.environ[EDITABLE]

    run.__name__ = hook.__name__
    return run


get_requires_for_build_editable = _editable(_setuptools.get_requires_for_build_editable)
prepare_metadata_for_build_editable = _editable(_setuptools.prepare_metadata_for_build_editable)
build_editable = _editable(_setuptools.build_editable)
