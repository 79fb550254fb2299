"""Environments with npm packages: built with the real npm, bound read-only into a real bwrap
sandbox with their `node_modules/.bin` first on PATH, run by the system node; offline builds
install from npm's own cache alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandbox.cli import env_command
from sandbox.environments import build_environment, list_environments
from sandbox.inside import sandbox_env
from sandbox.spec import SandboxSpec

pytestmark = pytest.mark.skipif(shutil.which("npm") is None or shutil.which("node") is None, reason="needs Node.js")

# A small registry package with no dependencies (what the offline case installs).
REGISTRY_PACKAGE = "is-number@7.0.0"


@pytest.fixture(scope="module")
def tarball(tmp_path_factory) -> str:
    """A local npm package with a program (`raas-hello`), packed by `npm pack`."""
    src = tmp_path_factory.mktemp("hello-src")
    (src / "package.json").write_text(
        json.dumps({"name": "raas-hello", "version": "1.0.0", "bin": {"raas-hello": "hello.js"}})
    )
    (src / "hello.js").write_text(
        "#!/usr/bin/env node\nconsole.log('hello from ' + process.version + ' ' + __dirname)\n"
    )
    out = tmp_path_factory.mktemp("hello-pack")
    subprocess.run(["npm", "pack", "--pack-destination", str(out)], cwd=src, check=True, capture_output=True)
    return str(next(out.glob("*.tgz")))


@pytest.fixture(scope="module")
def node_env(tmp_path_factory, tarball) -> str:
    root = tmp_path_factory.mktemp("envs")
    return str(build_environment("hello", ["pytest"], root=root, npm=[tarball]))


def test_a_node_environment_is_a_venv_with_its_npm_programs_first_on_path(node_env, tarball) -> None:
    assert os.access(f"{node_env}/node_modules/.bin/raas-hello", os.X_OK)
    assert os.path.exists(f"{node_env}/bin/python3")  # still a venv: pytest for the swe tests
    manifest = json.loads(Path(node_env, "raas-env.json").read_text())
    assert manifest["npm"] == [tarball] and manifest["packages"] == ["pytest"]
    path = sandbox_env(SandboxSpec(workspace="/w"), node_env)["PATH"]
    assert path.startswith(f"{node_env}/node_modules/.bin:{node_env}/bin:")
    before = os.stat(Path(node_env, "raas-env.json")).st_mtime_ns
    build_environment("hello", ["pytest"], root=Path(node_env).parent, npm=[tarball])  # the same lists: no-op
    assert os.stat(Path(node_env, "raas-env.json")).st_mtime_ns == before


def test_a_python_environment_keeps_its_path_and_manifest(tmp_path) -> None:
    env = build_environment("plain", [], root=tmp_path)
    manifest = json.loads(Path(env, "raas-env.json").read_text())
    assert manifest == {"packages": [], "python": "/usr/bin/python3", "base_prefix": "/usr"}
    assert sandbox_env(SandboxSpec(workspace="/w"), str(env))["PATH"].startswith(f"{env}/bin:/usr/local/sbin")


def test_the_npm_program_runs_in_a_bwrap_sandbox_on_the_system_node(start, node_env) -> None:
    sb = start("bwrap", python_env=node_env, network=False)
    result = sb.bash("raas-hello && which raas-hello python3")
    real = os.path.realpath(f"{node_env}/node_modules/raas-hello")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"hello from {subprocess.run(['node', '--version'], capture_output=True, text=True).stdout.strip()} {real}",
        f"{node_env}/node_modules/.bin/raas-hello",
        f"{node_env}/bin/python3",
    ]
    assert sb.bash(f"touch {node_env}/node_modules/evil").exit_code != 0  # read-only


def test_an_offline_build_installs_from_the_npm_cache_alone(tmp_path) -> None:
    """Fill the cache where the registry is reachable, then build with --no-index from it; the
    same offline build from an empty cache fails (ENOTCACHED): nothing was fetched."""
    cache = tmp_path / "npm-cache"
    build_environment("online", [], root=tmp_path / "a", npm=[REGISTRY_PACKAGE], npm_cache=cache)
    built = build_environment(
        "offline", [], root=tmp_path / "b", npm=[REGISTRY_PACKAGE], npm_cache=cache, no_index=True
    )
    assert json.loads(Path(built, "node_modules/is-number/package.json").read_text())["version"] == "7.0.0"
    with pytest.raises(RuntimeError, match="ENOTCACHED"):
        build_environment(
            "nothing", [], root=tmp_path / "c", npm=[REGISTRY_PACKAGE], npm_cache=tmp_path / "empty", no_index=True
        )
    assert not (tmp_path / "c" / "nothing").exists()  # a failed build leaves no half environment


def test_cli_builds_npm_packages_and_lists_them(tmp_path, tarball) -> None:
    runner = CliRunner()
    result = runner.invoke(env_command, ["build", "cli-hello", "--npm", tarball, "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert [(e["name"], e["npm"]) for e in list_environments(tmp_path)] == [("cli-hello", [tarball])]
    result = runner.invoke(env_command, ["list", "--root", str(tmp_path)])
    assert result.exit_code == 0 and "raas-hello" in result.output


def test_a_shared_root_names_the_npm_packages_in_its_build_command(tmp_path) -> None:
    """Compute nodes never build in a shared root: the message says how, npm packages included."""
    from sandbox.environments import EnvironmentMissing, ensure_environment

    (tmp_path / ".raas-shared-root").write_text("")
    with pytest.raises(EnvironmentMissing, match=r"raas env build cli --package pytest --npm some-cli@1 --shared"):
        ensure_environment("cli", ["pytest"], tmp_path, npm=["some-cli@1"])
