"""Named Python environments: built once with the system interpreter, used read-only in sandboxes."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from sandbox import SandboxStartError
from sandbox.cli import env_command
from sandbox.environments import build_environment, list_environments, resolve_env

# Built once per machine and reused (builds are idempotent), so reruns stay fast.
ENV_ROOT = os.environ.get("RAAS_TEST_ENV_ROOT", "/tmp/raas-test-envs")


@pytest.fixture(scope="module")
def ipy_env() -> str:
    """An environment with IPython and sympy."""
    return str(build_environment("ipy", ["ipython", "sympy"], root=ENV_ROOT))


def test_build_is_idempotent_and_listed(ipy_env):
    manifest = os.path.join(ipy_env, "raas-env.json")
    before = os.stat(manifest).st_mtime_ns
    assert str(build_environment("ipy", ["sympy", "ipython"], root=ENV_ROOT)) == ipy_env
    assert os.stat(manifest).st_mtime_ns == before  # same package set: nothing rebuilt
    names = {env["name"]: env["packages"] for env in list_environments(ENV_ROOT)}
    assert names["ipy"] == ["ipython", "sympy"]
    assert resolve_env("ipy", root=ENV_ROOT) == ipy_env
    with pytest.raises(SandboxStartError, match="not built"):
        resolve_env("nope", root=ENV_ROOT)


def test_cli_build_and_list(tmp_path):
    runner = CliRunner()
    result = runner.invoke(env_command, ["build", "bare", "--root", str(tmp_path)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(env_command, ["list", "--root", str(tmp_path)])
    assert result.exit_code == 0 and "bare" in result.output


@pytest.mark.parametrize("runtime", ["bwrap", "local"])
def test_sandbox_uses_the_environment(start, ipy_env, runtime):
    sb = start(runtime, python_env=ipy_env)
    r = sb.bash("which python3 pip; python3 -c 'import sympy; print(sympy.__name__)'")
    assert r.output == f"{ipy_env}/bin/python3\n{ipy_env}/bin/pip\nsympy\n"
    assert sb.python("get_ipython().__class__.__name__").output == "'InteractiveShell'\n"
    p = sb.python("import sympy\nx = sympy.Symbol('x')\nsympy.expand((x + 1)**2)")
    assert p.output == "x**2 + 2*x + 1\n" and p.error is None
    assert "ZeroDivisionError" in sb.python("1/0").error
    p = sb.python("import time; time.sleep(100)", timeout=1)
    assert p.timed_out and "KeyboardInterrupt" in p.error
    assert sb.python("x").output == "x\n"


def test_environment_is_read_only_and_git_works(start, ipy_env):
    sb = start("bwrap", python_env=ipy_env)
    assert sb.bash(f"touch {ipy_env}/evil").exit_code != 0
    r = sb.bash(
        "git init -q . && git -c user.name=a -c user.email=a@b commit -q --allow-empty -m init && git log --format=%s"
    )
    assert r.output == "init\n", r.output
