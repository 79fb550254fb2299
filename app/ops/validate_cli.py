"""`raas validate FILE --agent A`: grade every instance's gold solution and null action k times
on this node, through EVAL's one code path, and write a quarantine list a job can name.

It grades in this process (no worker needed); `POST /v1/validations` (the SDK's `validate`)
runs the same `tasks.validation.run_validation` on an `init` worker instead.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import click

from core.settings import load_settings


@click.command("validate")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--agent", required=True, help="Handler whose EVAL grades: swe, code or math")
@click.option("--k", default=3, show_default=True, type=click.IntRange(1, 20), help="Grades per action")
@click.option("--name", default=None, help="Write the quarantine list of this name (a job's `quarantine`)")
@click.option("--owner", default="default", show_default=True, help="Owner of the list (a tenant)")
@click.option("--agent-config", default="{}", help="Handler config as JSON (as the job's)")
@click.option("--parallel", default=1, show_default=True, type=click.IntRange(1, 64), help="Instances at once")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Also write the report as JSON")
def validate_command(
    file: Path, agent: str, k: int, name: str | None, owner: str, agent_config: str, parallel: int, out: Path | None
) -> None:
    """Find instances whose gold solution fails, whose null action passes, or that are flaky."""
    from pydantic import ValidationError
    from raas_client.cli import read_instances

    from app.validations import ValidationCreate, create_validation, get_validation, view
    from core.db import session_scope
    from core.errors import RaasError
    from tasks.validation import run_validation

    logging.basicConfig(level=logging.WARNING)
    settings = load_settings()
    try:
        body = ValidationCreate(
            agent=agent, instances=read_instances(file), k=k, name=name, agent_config=json.loads(agent_config)
        )
        validation_id = create_validation(settings, body, owner)
    except (ValidationError, RaasError, json.JSONDecodeError) as exc:
        raise click.ClickException(str(getattr(exc, "message", exc))) from None
    run_validation(settings, validation_id, parallel=parallel)
    with session_scope(settings.db_url) as s:
        report = view(get_validation(s, validation_id, owner))
    for item in report.instances:
        if item.problems:
            click.echo(
                f"{item.instance_id}: {', '.join(item.problems)} (gold {item.gold_rewards}, null {item.null_rewards})"
                + (f" {item.errors[0]}" if item.errors else "")
            )
    if out is not None:
        out.write_text(report.model_dump_json(indent=2))
    if report.status == "failed":
        raise click.ClickException(f"validation failed: {report.error}")
    sound = len(report.instances) - len(report.quarantined)
    listed = f"; quarantine list {name!r}" if name else ""
    click.echo(
        f"{len(report.instances)} instance(s), {sound} sound, {len(report.quarantined)} quarantined, "
        f"k={k}, {report.seconds:.1f}s{listed} (validation {validation_id})"
    )
