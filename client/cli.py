"""Trainer-side commands: `raas submit`, `raas status`, `raas llm add`."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import click

from client.sdk import RaasClient, RaasHTTPError

DEFAULT_URL = os.environ.get("RAAS_URL", "http://127.0.0.1:8000")
OUT_FIELDS = ("rollout_id", "job_id", "instance_id", "sample_index", "node", "status", "outcome",
              "reward", "finish_reason", "prompt_ids", "response_ids", "response_logprobs",
              "loss_mask", "policy_versions", "token_exact", "timing", "error")


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
        if set(obj) <= {"instance_id", "data"}:
            out.append({"instance_id": str(obj["instance_id"]), "data": obj.get("data", {})})
        else:
            data = {k: v for k, v in obj.items() if k != "instance_id"}
            out.append({"instance_id": str(obj["instance_id"]), "data": data})
    return out


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--agent", required=True, help="Registered handler name")
@click.option("--n", "n_samples", default=1, show_default=True, help="Samples per instance")
@click.option("--url", default=DEFAULT_URL, show_default=True)
@click.option("--job", "job_file", type=click.Path(exists=True, path_type=Path),
              help="JSON with sampling/limits/llm/sandbox/agent_config")
@click.option("--llm-server", multiple=True, help="Inference server URL (else the pool)")
@click.option("--tokenizer", default=None, help="Local tokenizer folder")
@click.option("--idempotency-key", default=None)
@click.option("--wait/--no-wait", default=False, help="Wait for every rollout")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Write one JSON object per finished rollout (implies --wait)")
def submit(file: Path, agent: str, n_samples: int, url: str, job_file: Path | None,
           llm_server: tuple[str, ...], tokenizer: str | None, idempotency_key: str | None,
           wait: bool, out: Path | None) -> None:
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
    with RaasClient(url) as client:
        try:
            accepted = client.submit(agent, read_instances(file), n_samples, **job)
        except RaasHTTPError as exc:
            raise click.ClickException(f"{exc} {json.dumps(exc.body)}") from None
        click.echo(f"job {accepted['job_id']}: {len(accepted['rollout_ids'])} rollouts")
        click.echo(f"dashboard: {url.rstrip('/')}/ui/jobs/{accepted['job_id']}")
        if wait or out:
            follow(client, accepted["job_id"], len(accepted["rollout_ids"]), out)


def follow(client: RaasClient, job_id: str, total: int, out: Path | None) -> None:
    """Progress bar until the job is done; optional JSONL of the finished rollouts."""
    from tqdm import tqdm

    outcomes: dict[str, int] = {}
    sink = out.open("w") if out else None
    try:
        with tqdm(total=total, desc=job_id[:8], unit="rollout") as bar:
            for item in client.results(job_id, wait=30):
                outcomes[item["outcome"] or "none"] = outcomes.get(item["outcome"] or "none", 0) + 1
                bar.update(1)
                bar.set_postfix(outcomes)
                if sink:
                    sink.write(json.dumps({k: item.get(k) for k in OUT_FIELDS}) + "\n")
    finally:
        if sink:
            sink.close()
    click.echo(f"job {job_id} done: {outcomes}")


@click.command()
@click.argument("job_id", required=False)
@click.option("--url", default=DEFAULT_URL, show_default=True)
def status(job_id: str | None, url: str) -> None:
    """A job's progress, or the latest jobs."""
    with RaasClient(url) as client:
        if job_id:
            click.echo(json.dumps(client.job(job_id), indent=2))
            return
        for j in client.jobs(limit=20)["jobs"]:
            click.echo(f"{j['job_id']}  {j['agent']:<10} {j['status']:<10} "
                       f"{j['finished']}/{j['n_rollouts']}  {j['outcomes']}")


@click.group()
def llm() -> None:
    """Inference servers in the shared pool."""


@llm.command("add")
@click.argument("server_url")
@click.option("--model", default=None)
@click.option("--weight-version", default=None)
@click.option("--url", default=DEFAULT_URL, show_default=True)
def llm_add(server_url: str, model: str | None, weight_version: str | None, url: str) -> None:
    """Register SERVER_URL (e.g. http://10.0.0.5:8000) with the pool."""
    with RaasClient(url) as client:
        try:
            click.echo(json.dumps(client.add_llm_server(server_url, model, weight_version)))
        except RaasHTTPError as exc:
            raise click.ClickException(str(exc)) from None
