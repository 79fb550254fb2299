"""An environment built from another Python than the system's (pyenv's 3.12 here, issue 36):
found by version, recorded in the manifest, its base install bound read-only into a real
bwrap sandbox at the same path, and nothing else of the home it lives under; a version the
node lacks fails at build and at submission, naming it."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandbox.cli import env_command
from sandbox.environments import build_environment, interpreter_binds
from sandbox.pythons import PythonMissing, candidates, find_python

VERSION = "3.12"


def _have(version: str) -> bool:
    try:
        find_python(version)
    except PythonMissing:
        return False
    return True


needs_312 = pytest.mark.skipif(not _have(VERSION), reason="no Python 3.12 on this host (pyenv's or on PATH)")


@needs_312
def test_a_version_is_found_as_its_real_binary_and_base_install() -> None:
    found = find_python(VERSION)
    assert found.version == VERSION and os.path.isabs(found.executable)
    assert "shims" not in found.executable  # pyenv's shim resolved (or skipped) to the binary
    assert Path(found.executable).resolve().is_relative_to(Path(found.base_prefix).resolve())
    assert find_python(found.executable) == found  # a path is probed as it is


def test_a_missing_version_fails_naming_it_and_where_it_looked(tmp_path) -> None:
    with pytest.raises(PythonMissing, match=r"no Python 3\.99 on this node"):
        find_python("3.99")
    # the operator's mapping is the only place looked at for its version, and is checked
    wrong = "/usr/bin/python3"  # runs, but is 3.11: not taken for 3.12
    assert candidates(VERSION, {VERSION: wrong}) == [wrong]
    with pytest.raises(PythonMissing, match=wrong):
        find_python(VERSION, {VERSION: wrong})
    with pytest.raises(ValueError, match="neither a version"):
        find_python("three-twelve")
    # `raas env build --python` says so, and builds nothing
    result = CliRunner().invoke(env_command, ["build", "e", "--python", "3.99", "--root", str(tmp_path)])
    assert result.exit_code != 0 and "no Python 3.99" in result.output, result.output
    assert not (tmp_path / "e").exists()


def test_a_system_python_environment_needs_no_extra_bind(tmp_path) -> None:
    env = build_environment("plain", [], root=tmp_path)
    manifest = json.loads(Path(env, "raas-env.json").read_text())
    assert manifest == {"packages": [], "python": "/usr/bin/python3", "base_prefix": "/usr"}
    assert interpreter_binds(env) == []


@pytest.fixture(scope="module")
def env312(tmp_path_factory) -> str:
    if not _have(VERSION):
        pytest.skip("no Python 3.12 on this host")
    return str(build_environment("py312", [], root=tmp_path_factory.mktemp("envs"), python=VERSION))


@needs_312
def test_the_manifest_records_the_interpreter_and_its_base_install(env312) -> None:
    found = find_python(VERSION)
    manifest = json.loads(Path(env312, "raas-env.json").read_text())
    assert manifest == {"packages": [], "python": found.executable, "base_prefix": found.base_prefix}
    assert interpreter_binds(env312) == [os.path.realpath(found.base_prefix)]
    # the same inputs again: a no-op (what was learnt while building does not force a rebuild)
    before = os.stat(Path(env312, "raas-env.json")).st_mtime_ns
    build_environment("py312", [], root=Path(env312).parent, python=found.executable)
    assert os.stat(Path(env312, "raas-env.json")).st_mtime_ns == before


@pytest.fixture
def home_secret() -> str:
    """A file beside pyenv's install in the same home: the sandbox must not see it."""
    base = Path(find_python(VERSION).base_prefix)
    home = base.parents[2] if base.parent.name == "versions" else base.parent
    secret = home / f"raas-secret-{uuid.uuid4().hex[:8]}"
    secret.write_text("top secret\n")
    yield str(secret)
    secret.unlink()


@needs_312
def test_the_sandbox_runs_the_environments_python_and_sees_no_more_of_its_home(start, env312, home_secret) -> None:
    found = find_python(VERSION)
    sb = start("bwrap", python_env=env312, network=False)
    result = sb.bash("python3 -c 'import sys, ssl, sqlite3; print(\"%d.%d\" % sys.version_info[:2], sys.base_prefix)'")
    assert result.exit_code == 0, result.output
    assert result.output.split() == [VERSION, found.base_prefix]
    # only the install itself: the home's other files and folders are not there
    home = os.path.dirname(home_secret)
    assert sb.bash(f"cat {home_secret}").exit_code != 0
    assert "top secret" not in sb.bash(f"cat {home_secret}").output
    listing = sb.bash(f"ls -A {home}").output.split()
    assert listing == [Path(found.base_prefix).relative_to(home).parts[0]], listing  # ".pyenv" alone
    ssh = os.path.join(os.path.expanduser("~"), ".ssh")
    if os.path.isdir(ssh):
        assert sb.bash(f"ls {ssh}").exit_code != 0
    # read-only, like the environment
    assert sb.bash(f"touch {found.base_prefix}/evil").exit_code != 0
    assert not os.path.exists(f"{found.base_prefix}/evil")
