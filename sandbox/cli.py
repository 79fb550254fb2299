"""`raas env ...`: build and list the named Python environments sandboxes can use."""
from __future__ import annotations

import json

import click

from sandbox.environments import build_environment, envs_root, list_environments


@click.group("env")
def env_command() -> None:
    """Named Python environments for sandboxes (built once per node)."""


@env_command.command("build")
@click.argument("name")
@click.option("--package", "-p", "packages", multiple=True, help="pip requirement; repeatable")
@click.option("--root", type=click.Path(file_okay=False), default=None,
              help="Folder holding environments (default <RAAS home>/envs)")
@click.option("--python", "python", default="/usr/bin/python3", show_default=True,
              help="Interpreter the venv is made from (must exist inside sandboxes)")
def build(name: str, packages: tuple[str, ...], root: str | None, python: str) -> None:
    """Create or update environment NAME with the given packages (no-op if unchanged)."""
    path = build_environment(name, list(packages), root=root, python=python)
    click.echo(f"{name}: {path}")


@env_command.command("list")
@click.option("--root", type=click.Path(file_okay=False), default=None,
              help="Folder holding environments (default <RAAS home>/envs)")
@click.option("--json", "as_json", is_flag=True, help="Print JSON")
def list_(root: str | None, as_json: bool) -> None:
    """Show built environments and their packages."""
    envs = list_environments(root)
    if as_json:
        click.echo(json.dumps(envs, indent=1))
        return
    if not envs:
        click.echo(f"no environments under {root or envs_root()}")
    for env in envs:
        click.echo(f"{env['name']:<20} {' '.join(env['packages']) or '-':<40} {env['path']}")
