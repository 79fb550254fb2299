"""`raas env ...`: build and list the named Python environments sandboxes can use.

The sandbox package knows nothing of agents or of the service's settings, so the environments
that handlers declare (name -> packages) and the default folder are passed in by whoever mounts
the command (`make_env_command`).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import click

from sandbox.environments import build_environment, list_environments
from sandbox.settings import DEFAULT_ENVS_ROOT

Declared = Callable[[], dict[str, list[str]]]


def make_env_command(
    declared: Declared = dict, default_root: Callable[[], Path] = lambda: DEFAULT_ENVS_ROOT
) -> click.Group:
    """The `env` command group; `declared()` gives the environments handlers ask for,
    `default_root()` the folder used when --root is not given."""

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
        default="/usr/bin/python3",
        show_default=True,
        help="Interpreter the venv is made from (must exist inside sandboxes)",
    )
    @click.option(
        "--find-links",
        "find_links",
        multiple=True,
        metavar="DIR|URL",
        help="Local wheelhouse for pip (repeatable); with --no-index, the only source",
    )
    @click.option("--no-index", is_flag=True, help="Do not reach a package index (offline)")
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
        python: str,
        find_links: tuple[str, ...],
        no_index: bool,
        shared: bool,
    ) -> None:
        """Create or update environment NAME with the given packages (no-op if unchanged)."""
        wanted = list(packages) or declared().get(name, [])
        click.echo(f"building {name} ({' '.join(wanted) or 'no packages'}) ...")
        try:
            path = build_environment(
                name,
                wanted,
                root=root or default_root(),
                python=python,
                find_links=find_links,
                no_index=no_index,
                shared=shared,
            )
        except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
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
        envs += [
            {"name": name, "packages": packages, "path": None, "built": False}
            for name, packages in sorted(declared().items())
            if name not in built
        ]
        if as_json:
            click.echo(json.dumps(envs, indent=1))
            return
        if not envs:
            click.echo(f"no environments under {root}")
        for env in envs:
            where = env["path"] or f"not built yet: built on first use (or `raas env build {env['name']}`)"
            click.echo(f"{env['name']:<12} {' '.join(env['packages']) or '-':<24} {where}")

    return env_command


env_command = make_env_command()
