"""Running one side of a before/after benchmark in a fresh interpreter.

A side's code comes from its own source tree (`cwd`, and `PYTHONPATH` when given), so each
import, worker and reaper of that side runs the commit being measured. The child prints its
result as the last line of its stdout, one JSON object.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_child(script: str, tree: Path, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `script` with `args` under this interpreter in `tree`; its last stdout line, parsed
    (RuntimeError with the end of its stderr when it fails)."""
    out = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, cwd=tree, env=env)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])
