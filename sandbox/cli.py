"""`raas env ...`: build and list the named environments sandboxes can use (a venv, with npm
packages beside it when asked).

The sandbox package knows nothing of agents or of the service's settings, so the environments
that handlers and harness registrations declare (name -> pip packages, name -> npm packages)
and the default folder are passed in by whoever mounts the command (`make_env_command`).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import click

from sandbox.environments import SYSTEM_PYTHON, build_environment, list_environments
from sandbox.errors import SandboxStartError
from sandbox.settings import DEFAULT_ENVS_ROOT

Declared = Callable[[], dict[str, list[str]]]


def make_env_command(
    declared: Declared = dict,
    default_root: Callable[[], Path] = lambda: DEFAULT_ENVS_ROOT,
    declared_npm: Declared = dict,
    declared_python: Callable[[], dict[str, str]] = dict,
    python_map: Callable[[], dict[str, str]] = dict,
) -> click.Group:
    """The `env` command group; `declared()` gives the environments handlers ask for (pip
    packages), `declared_npm()` their npm packages, `declared_python()` the Python versions
    they name, `python_map()` the operator's version -> interpreter mapping, `default_root()`
    the folder used when --root is not given."""

    @click.group("env")
    def env_command() -> None:
        """Named Python environments for sandboxes (built once per node, on first use)."""

    @env_command.command("build")
    @click.argument("name")
    @click.option(
        "--package",
        "-p",
        "packages",
        multiple=True,
        help="pip requirement; repeatable (default: what the handlers declare)",
    )
    @click.option(
        "--root",
        type=click.Path(file_okay=False),
        default=None,
        help="Folder holding environments (default RAAS_ENV_ROOT, else <RAAS home>/envs)",
    )
    @click.option(
        "--python",
        "python",
        default=None,
        help="Interpreter the venv is made from: a path, or a version (3.12) found as the "
        "policy's harnesses.pythons maps it, else python3.X on PATH or pyenv's (default: the "
        "registration's version, else /usr/bin/python3); its install is bound into sandboxes",
    )
    @click.option(
        "--find-links",
        "find_links",
        multiple=True,
        metavar="DIR|URL",
        help="Local wheelhouse for pip (repeatable); with --no-index, the only source",
    )
    @click.option(
        "--npm",
        "npm",
        multiple=True,
        help="npm package (name[@version]); repeatable (default: what the registrations declare)",
    )
    @click.option(
        "--npm-cache",
        "npm_cache",
        type=click.Path(file_okay=False),
        default=None,
        help="npm's content cache to fill (online) or install from (with --no-index)",
    )
    @click.option("--no-index", is_flag=True, help="Do not reach a package index or the npm registry (offline)")
    @click.option(
        "--shared",
        is_flag=True,
        help="Mark the root shared: compute nodes use it read-only and never build "
        "in it (run this on a login node, with RAAS_ENV_ROOT on every node)",
    )
    def build(
        name: str,
        packages: tuple[str, ...],
        root: str | None,
        python: str | None,
        find_links: tuple[str, ...],
        npm: tuple[str, ...],
        npm_cache: str | None,
        no_index: bool,
        shared: bool,
    ) -> None:
        """Create or update environment NAME with the given packages (no-op if unchanged)."""
        given = bool(packages or npm)  # explicit lists replace the declared ones, both
        wanted = list(packages) if given else declared().get(name, [])
        wanted_npm = list(npm) if given else declared_npm().get(name, [])
        python = python or declared_python().get(name) or SYSTEM_PYTHON
        click.echo(f"building {name} ({' '.join([*wanted, *wanted_npm]) or 'no packages'}; python {python}) ...")
        try:
            path = build_environment(
                name,
                wanted,
                root=root or default_root(),
                python=python,
                pythons=python_map(),
                find_links=find_links,
                no_index=no_index,
                shared=shared,
                npm=wanted_npm,
                npm_cache=npm_cache,
            )
        except (RuntimeError, OSError, ValueError, SandboxStartError, subprocess.CalledProcessError) as exc:
            raise click.ClickException(f"building {name} failed: {exc}") from None
        click.echo(f"{name}: {path}")

    @env_command.command("list")
    @click.option(
        "--root",
        type=click.Path(file_okay=False),
        default=None,
        help="Folder holding environments (default RAAS_ENV_ROOT, else <RAAS home>/envs)",
    )
    @click.option("--json", "as_json", is_flag=True, help="Print JSON")
    def list_(root: str | None, as_json: bool) -> None:
        """Built environments and the ones handlers declare (built on first use)."""
        root = root or str(default_root())
        envs = [{**env, "built": True} for env in list_environments(root)]
        built = {env["name"] for env in envs}
        npm = declared_npm()
        envs += [
            {"name": name, "packages": declared().get(name, []), "npm": npm.get(name, []), "path": None, "built": False}
            for name in sorted(set(declared()) | set(npm))
            if name not in built
        ]
        if as_json:
            click.echo(json.dumps(envs, indent=1))
            return
        if not envs:
            click.echo(f"no environments under {root}")
        for env in envs:
            where = env["path"] or f"not built yet: built on first use (or `raas env build {env['name']}`)"
            packages = " ".join([*env["packages"], *env.get("npm", [])]) or "-"
            click.echo(f"{env['name']:<12} {packages:<24} {where}")

    return env_command


env_command = make_env_command()
