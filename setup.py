"""The server's requirements: setup.cfg's, plus the SDK it imports (see build_backend.py).

Everything else about the distribution is in setup.cfg.
"""

from __future__ import annotations

import configparser
import os
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
SDK = HERE / "sdk"


def sdk_requirement() -> str:
    """The SDK from the folder beside this one for a wheel; by name for an editable install
    (the developer's `pip install -e ./sdk` satisfies it) or a build away from a checkout."""
    if os.environ.get("RAAS_BUILD_EDITABLE") or not (SDK / "pyproject.toml").is_file():
        return "raas-client"
    return f"raas-client @ {SDK.as_uri()}"


def cfg_requirements() -> list[str]:
    """setup.cfg's `install_requires` (a setup() argument would replace them, not add to them)."""
    cfg = configparser.ConfigParser()
    cfg.read(HERE / "setup.cfg")
    return [line.strip() for line in cfg["options"]["install_requires"].splitlines() if line.strip()]


setup(install_requires=[*cfg_requirements(), sdk_requirement()])
