"""Which interpreter an environment is built from: a version ("3.12") the operator's mapping
names, or the one found on this node.

Why: harnesses such as OpenHands need a newer Python than the system's (Debian 12: 3.11), so
a harness registration may name a version. The interpreter is the operator's (trusted):
`policy.harnesses.pythons` maps a version to a path; without an entry, `python3.X` on PATH is
asked for its real `sys.executable` (a pyenv shim resolves to the binary, or fails when the
version is not pyenv's global one), then pyenv's own installs (`$PYENV_ROOT`, else
`~/.pyenv`, `versions/3.X.*`, newest first). The interpreter is asked for its version and
`sys.base_prefix`: a venv's python is a symlink into that base install, so a sandbox must see
it (`sandbox.environments.interpreter_binds`). A version found nowhere fails at once, naming
the version and where it looked, never later inside a sandbox.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sandbox.errors import SandboxStartError

VERSION_RE = re.compile(r"^3\.\d{1,2}$")
_PROBE = "import json, sys; print(json.dumps([sys.executable, sys.base_prefix, '%d.%d' % sys.version_info[:2]]))"


class PythonMissing(SandboxStartError):
    """No interpreter of the version an environment asks for on this node."""

    code = "python_missing"


@dataclass(frozen=True)
class Interpreter:
    """A probed interpreter: its real path, its base install and its `major.minor`."""

    executable: str
    base_prefix: str
    version: str


def probe(path: str, timeout: float = 20.0) -> Interpreter | None:
    """Ask `path` what it is (None when it does not run: a missing file, a shim without that
    version)."""
    try:
        done = subprocess.run([path, "-I", "-c", _PROBE], capture_output=True, text=True, timeout=timeout)
        executable, base_prefix, version = json.loads(done.stdout) if done.returncode == 0 else (None, None, None)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    return Interpreter(executable, base_prefix, version) if executable else None


def _pyenv_candidates(version: str) -> list[str]:
    """pyenv's installs of `version` (3.12 -> versions/3.12.*), newest patch first."""
    root = Path(os.environ.get("PYENV_ROOT") or Path("~/.pyenv").expanduser()) / "versions"
    found = []
    for folder in root.glob(f"{version}.*") if root.is_dir() else []:
        patch = folder.name[len(version) + 1 :]
        if patch.isdigit():
            found.append((int(patch), str(folder / "bin" / f"python{version}")))
    return [path for _, path in sorted(found, reverse=True)]


def candidates(spec: str, mapping: Mapping[str, str] = {}) -> list[str]:
    """Where `spec` (a version or an absolute path) is looked for, in order."""
    if os.path.isabs(spec):
        return [spec]
    if spec in mapping:  # the operator's choice is the only one
        return [mapping[spec]]
    on_path = shutil.which(f"python{spec}")
    return [*([on_path] if on_path else []), *_pyenv_candidates(spec)]


def find_python(spec: str, mapping: Mapping[str, str] = {}) -> Interpreter:
    """The interpreter for `spec`: a version ("3.12") or an absolute path; PythonMissing
    names what was asked and where it was looked for."""
    return _find(spec, tuple(sorted(mapping.items())))


@functools.lru_cache(maxsize=32)
def _find(spec: str, mapping: tuple[tuple[str, str], ...]) -> Interpreter:
    if not os.path.isabs(spec) and not VERSION_RE.match(spec):
        on_path = shutil.which(spec)  # a command name ("python3.12"): where PATH finds it
        if on_path:
            return _find(on_path, mapping)
        raise ValueError(f"python {spec!r} is neither a version like '3.12' nor an absolute path")
    looked = candidates(spec, dict(mapping))
    for path in looked:
        found = probe(path)
        if found is not None and (os.path.isabs(spec) or found.version == spec):
            return found
    where = ", ".join(looked) or "nothing found"
    raise PythonMissing(
        f"no Python {spec} on this node (looked at: {where}; also python{spec} on PATH and "
        f"pyenv's versions/{spec}.*): install it, or map it in the policy's harnesses.pythons "
        f'(e.g. {{"{spec}": "/path/to/python{spec}"}})'
        if not os.path.isabs(spec)
        else f"the interpreter {spec} does not run on this node"
    )
