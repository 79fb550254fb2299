"""`raas weights push|pause|resume`: verified weight pushes and pool pauses from a shell."""

from __future__ import annotations

from pathlib import Path

import click

from raas_client.cli import gateway, http_error_message, url_option
from raas_client.sdk import RaasHTTPError
from raas_client.weight_models import ServerPushReport
from raas_client.weights import TiedCheckpoint, load_probe


@click.group()
def weights() -> None:
    """Pause the pool, push verified weights, resume."""


def _server_line(s: ServerPushReport) -> str:
    diff = s.check.max_abs_diff if s.check is not None else None
    state = "ok" if s.ok else "FAILED"
    return (
        f"  {s.url:<28} {state:<6} pause {s.pause_seconds:.3f}s "
        f"load {s.load_seconds or 0:.3f}s verify {s.verify_seconds or 0:.3f}s "
        f"total {s.total_seconds:.3f}s max|dlogp| "
        f"{'-' if diff is None else f'{diff:.2e}'}" + (f"\n    {s.error}" if s.error else "")
    )


@weights.command("push")
@click.argument("path")
@click.option("--version", required=True, help="The new weight version")
@click.option(
    "--probe",
    "probe_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSON {prompt_ids, token_ids, logprobs}: raas_client.weights.probe_fingerprint",
)
@click.option("--mechanism", type=click.Choice(["reload", "lora"]), default="reload", show_default=True)
@click.option("--lora-name", default=None, help="Fixed adapter name (mechanism lora)")
@click.option("--tolerance", type=float, default=1e-3, show_default=True)
@click.option("--server", "servers", multiple=True, help="Server id (repeat; default: all)")
@click.option(
    "--timeout", type=float, default=300.0, show_default=True, help="Seconds to wait for in-flight generations"
)
@click.option("--json", "as_json", is_flag=True, help="Print the JSON report")
@url_option
def push(
    path: str,
    version: str,
    probe_file: Path,
    mechanism: str,
    lora_name: str | None,
    tolerance: float,
    servers: tuple[str, ...],
    timeout: float,
    as_json: bool,
    url: str,
) -> None:
    """Load PATH (a folder the inference servers read) on the pool, verify, resume."""
    try:
        probe = load_probe(probe_file)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--probe") from None
    with gateway(url) as client:
        try:
            report = client.push_weights(
                path, version, probe, mechanism, lora_name, tolerance, list(servers) or None, timeout
            )
        except TiedCheckpoint as exc:
            raise click.ClickException(str(exc)) from None
        except RaasHTTPError as exc:
            details = exc.body.get("details") if isinstance(exc.body, dict) else None
            if isinstance(details, dict) and details.get("servers"):
                lines = (_server_line(ServerPushReport.model_validate(s)) for s in details["servers"])
                click.echo("\n".join(lines), err=True)
            raise click.ClickException(http_error_message(exc)) from None
    if as_json:
        click.echo(report.model_dump_json(indent=1))
        return
    click.echo(
        f"pushed {version} ({mechanism}): verified on {len(report.servers)} servers, "
        f"pause {report.pause_seconds:.3f}s, total {report.total_seconds:.3f}s"
    )
    click.echo("\n".join(_server_line(s) for s in report.servers))


@weights.command("pause")
@click.option("--server", "servers", multiple=True, help="Server id (repeat; default: all)")
@click.option("--timeout", type=float, default=300.0, show_default=True)
@url_option
def pause(servers: tuple[str, ...], timeout: float, url: str) -> None:
    """Pause the pool; returns once no generation is in flight."""
    with gateway(url) as client:
        try:
            result = client.pause_pool(list(servers) or None, timeout)
        except RaasHTTPError as exc:
            raise click.ClickException(http_error_message(exc)) from None
    click.echo(f"paused {len(result.servers)} servers in {result.pause_seconds:.3f}s")


@weights.command("resume")
@click.option("--version", "weight_version", default=None, help="Record this weight version")
@click.option("--server", "servers", multiple=True, help="Server id (repeat; default: all)")
@url_option
def resume(weight_version: str | None, servers: tuple[str, ...], url: str) -> None:
    """Resume the pool (after a pause, or after a push that failed verification)."""
    with gateway(url) as client:
        result = client.resume_pool(weight_version, list(servers) or None)
    click.echo(f"resumed {len(result.servers)} servers" + (f" at version {weight_version}" if weight_version else ""))
