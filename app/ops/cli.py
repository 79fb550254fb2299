"""The `raas` command: service processes (up, gateway, worker, reaper, flower), database,
status, and the trainer-side `submit` / `results` / `llm add`."""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

import click

from core.settings import load_settings

log = logging.getLogger("raas")


# Libraries whose INFO lines (Celery's per-task lines, Alembic's plugin lines, one line per
# HTTP request) bury ours: WARNING unless --verbose; requests with --access-log.
CHATTY_LOGGERS = ("alembic", "celery", "kombu", "amqp", "werkzeug")


def _setup_logging(level: str = "INFO", verbose: bool = False, access_log: bool = False) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not verbose:
        for name in CHATTY_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
    if access_log:
        logging.getLogger("werkzeug").setLevel(logging.INFO)


verbose_option = click.option(
    "--verbose", "-v", is_flag=True, help="Also the libraries' INFO lines (Celery, Alembic, requests)"
)
access_log_option = click.option("--access-log", is_flag=True, help="Log every HTTP request")


class RaasGroup(click.Group):
    """Service errors raised on purpose (an embedded broker that cannot start, ...) end the
    command with their one-line message, which names the fix, instead of a traceback."""

    def invoke(self, ctx: click.Context):  # untyped: click's signature
        from core.errors import ServiceUnavailable

        try:
            return super().invoke(ctx)
        except ServiceUnavailable as exc:
            raise click.ClickException(exc.message) from None


@click.group(cls=RaasGroup)
def main() -> None:
    """raas: Rollout-as-a-Service for RL training of multi-turn LLM agents."""


@main.command()
@click.option(
    "--home", type=click.Path(path_type=Path), default=None, help="State folder (default .raas, or RAAS_HOME)"
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option(
    "--port", default=8000, show_default=True, type=int, envvar="RAAS_PORT", help="Gateway port (or RAAS_PORT)"
)
@click.option("--concurrency", default=4, show_default=True, type=int, help="Per stage pool")
@verbose_option
@access_log_option
@click.option("--insecure", is_flag=True, help="Allow a non-loopback host without API tokens")
def up(
    home: Path | None, host: str, port: int, concurrency: int, verbose: bool, access_log: bool, insecure: bool
) -> None:
    """Everything in one command: migrations, gateway, the three stage pools and the reaper."""
    from app.ops.embedded import UP_SOFT_SHUTDOWN_SECONDS, run_embedded

    _setup_logging(verbose=verbose, access_log=access_log)
    if home is not None:
        os.environ["RAAS_HOME"] = str(home.resolve())
    os.environ.setdefault("RAAS_SOFT_SHUTDOWN_TIMEOUT", str(UP_SOFT_SHUTDOWN_SECONDS))  # the pools read it too
    run_embedded(load_settings(), host, port, concurrency, verbose=verbose, insecure=insecure)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@verbose_option
@access_log_option
@click.option("--insecure", is_flag=True, help="Allow a non-loopback host without API tokens")
def gateway(host: str, port: int, verbose: bool, access_log: bool, insecure: bool) -> None:
    """The REST gateway (for production prefer: gunicorn 'app:create_app()')."""
    from app import create_app
    from app.auth import check_exposure
    from app.ops.devserver import make_server

    _setup_logging(verbose=verbose, access_log=access_log)
    settings = load_settings()
    check_exposure(settings, host, insecure)  # before the app starts an embedded Redis
    app = create_app(settings)
    server = make_server(host, port, app, settings)
    click.echo(f"raas gateway on http://{host}:{port}")
    server.serve_forever()


@main.command()
@click.option("--stage", type=click.Choice(["init", "run", "eval"]), required=True)
@click.option("--node", default=None, help="Node name (default RAAS_NODE or the hostname)")
@click.option("--concurrency", "-c", default=4, show_default=True, type=int)
@click.option("--pool", default="threads", show_default=True, type=click.Choice(["threads", "prefork", "solo"]))
@click.option("--loglevel", default="INFO", show_default=True)
@verbose_option
def worker(stage: str, node: str | None, concurrency: int, pool: str, loglevel: str, verbose: bool) -> None:
    """A stage worker pool: init consumes `init`; run/eval consume `<stage>.<node>`."""
    from app.ops.node import follow_supervisor
    from tasks.worker import run_worker

    follow_supervisor()  # a pool of `raas node` or `raas up` ends with it
    _setup_logging(loglevel, verbose=verbose)
    settings = load_settings({"node": node} if node else None)
    code = run_worker(settings, stage, concurrency, pool, loglevel, quiet=not verbose)
    if code:
        sys.exit(code)  # a supervisor (raas up, systemd, Slurm) sees the pool failed


@main.command()
@click.option("--node", default=None, help="Node name (default RAAS_NODE or the hostname)")
@click.option(
    "--init",
    "init_slots",
    default=4,
    show_default=True,
    type=click.IntRange(0),
    help="INIT slots (sandbox starts); 0: no INIT pool",
)
@click.option(
    "--run",
    "run_slots",
    default=16,
    show_default=True,
    type=click.IntRange(0),
    help="RUN slots (agent loops); 0: no RUN pool",
)
@click.option(
    "--eval",
    "eval_slots",
    default=4,
    show_default=True,
    type=click.IntRange(0),
    help="EVAL slots (grading); 0: no EVAL pool",
)
@click.option("--no-reaper", is_flag=True, help="Run no reaper on this node")
@click.option("--pool", default="threads", show_default=True, type=click.Choice(["threads", "prefork", "solo"]))
@verbose_option
def node(
    node: str | None, init_slots: int, run_slots: int, eval_slots: int, no_reaper: bool, pool: str, verbose: bool
) -> None:
    """This node's three stage pools and its reaper as one supervised unit (foreground);
    SIGTERM/SIGINT drains within RAAS_SOFT_SHUTDOWN_TIMEOUT, then exits 0."""
    from app.ops.node import NodeSupervisor
    from core.db import configure_pool

    _setup_logging(verbose=verbose)
    settings = load_settings({"node": node} if node else None)
    configure_pool(settings)
    supervisor = NodeSupervisor(
        settings,
        {"init": init_slots, "run": run_slots, "eval": eval_slots},
        reaper=not no_reaper,
        pool=pool,
        verbose=verbose,
    )
    sys.exit(supervisor.run())


@main.command()
@click.option("--once", is_flag=True, help="One pass, print what it did, exit")
def reaper(once: bool) -> None:
    """Re-enqueue lost work and stop orphaned sandboxes (run one per node)."""
    from core.db import configure_pool
    from tasks.celery_app import make_celery
    from tasks.recovery.reaper import Reaper

    _setup_logging()
    settings = load_settings()
    configure_pool(settings)
    r = Reaper(settings, make_celery(settings))
    if once:
        click.echo(r.run_once())
        return
    signal.signal(signal.SIGTERM, lambda *_: r.stop())
    r.run_forever()


def flower_notes(settings) -> list[str]:
    """What Flower cannot show with these settings, and what to set so that it can."""
    notes = []
    if not settings.task_events:
        notes.append(
            "Flower sees workers and tasks only through Celery task events, which are "
            "off: set RAAS_TASK_EVENTS=true for the workers (`raas up`) and for "
            "this command."
        )
    return notes


@main.command()
@click.option("--port", default=5555, show_default=True, type=int)
@click.option("--address", default="127.0.0.1", show_default=True, help="Interface to bind")
@click.option(
    "--basic-auth",
    envvar="RAAS_FLOWER_BASIC_AUTH",
    default=None,
    help="user:password, required on a non-loopback address (env RAAS_FLOWER_BASIC_AUTH)",
)
def flower(port: int, address: str, basic_auth: str | None) -> None:
    """Celery Flower for this service's broker (loopback by default; basic auth when exposed)."""
    from app.auth import is_loopback
    from tasks.celery_app import make_celery

    argv = ["flower", f"--port={port}", f"--address={address}"]
    if basic_auth:
        user, _, password = basic_auth.partition(":")
        if not user or len(password) < 8:
            raise click.BadParameter(
                "must be user:password with a password of 8+ characters", param_hint="--basic-auth"
            )
        argv.append(f"--basic-auth={basic_auth}")
    elif not is_loopback(address):
        raise click.BadParameter(f"Flower on {address} needs --basic-auth user:password", param_hint="--basic-auth")
    settings = load_settings()
    for note in flower_notes(settings):
        click.echo(note, err=True)
    make_celery(settings).start(argv)


@main.group()
def broker() -> None:
    """The embedded Redis broker under RAAS_HOME (tasks/broker/embedded_redis.py)."""


@broker.command("stop")
def broker_stop() -> None:
    """Stop the home's embedded Redis (`raas up` stops it at exit; a server that a standalone
    worker started keeps running until then). Queued messages are kept in its file."""
    from tasks.broker import embedded_redis

    settings = load_settings()
    if not settings.embedded_broker:
        raise click.ClickException("RAAS_BROKER_URL is set: there is no embedded Redis to stop")
    stopped = embedded_redis.stop(settings)
    click.echo(f"embedded Redis under {settings.redis_dir}: {'stopped' if stopped else 'was not running'}")


@main.group()
def db() -> None:
    """Database schema (Alembic)."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
def db_upgrade(revision: str) -> None:
    """Apply migrations up to REVISION."""
    from sqlalchemy.exc import OperationalError

    from migrations.runner import upgrade as run_upgrade

    settings = load_settings()
    where = settings.db_url.split("@")[-1]
    try:
        run_upgrade(settings.db_url, revision)
    except OperationalError as exc:
        reason = str(exc.orig or exc).strip().splitlines()[0]
        raise click.ClickException(
            f"cannot reach the database at {where}: {reason}. Start it, or point to another "
            f"with RAAS_DATABASE_URL (default: SQLite under RAAS_HOME)."
        ) from None
    click.echo(f"database at {where} is at {revision}")


@db.command("downgrade")
@click.argument("revision")
def db_downgrade(revision: str) -> None:
    """Revert migrations down to REVISION."""
    from migrations.runner import downgrade as run_downgrade

    run_downgrade(load_settings().db_url, revision)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per check")
def doctor(as_json: bool) -> None:
    """Can this node run raas? Sandboxes, cgroups, environments, services, scratch."""
    import json

    from app.ops.doctor import run_checks

    logging.basicConfig(level=logging.WARNING)
    checks = run_checks(load_settings())
    for check in checks:
        click.echo(json.dumps(check.as_dict()) if as_json else check.line())
    failed = [c.name for c in checks if c.status == "fail"]
    if failed:
        click.echo(f"{len(failed)} check(s) failed: {', '.join(failed)}", err=True)
        sys.exit(1)


@main.group()
def slurm() -> None:
    """Slurm job scripts for this installation (docs/slurm.md)."""


@slurm.command("write")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option("--init", "init", default=8, show_default=True, type=int, help="INIT slots per node")
@click.option("--run", "run", default=64, show_default=True, type=int, help="RUN slots per node")
@click.option("--eval", "eval_", default=8, show_default=True, type=int, help="EVAL slots per node")
@click.option("--nodes", default=1, show_default=True, type=int, help="Node jobs (an array)")
@click.option(
    "--drain",
    default=60,
    show_default=True,
    type=int,
    help="Seconds a node drains on TERM (RAAS_SOFT_SHUTDOWN_TIMEOUT)",
)
@click.option("--time", "time_", default="1-00:00:00", show_default=True, help="Node job time limit")
@click.option(
    "--mem-per-sandbox", default=1024, show_default=True, type=int, help="MB of memory per live sandbox (sizes --mem)"
)
@click.option("--partition", default=None)
@click.option("--account", default=None)
@click.option(
    "--env-root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Shared pre-built environment root (default RAAS_ENV_ROOT)",
)
@click.option("--services", is_flag=True, help="Node jobs wait for the service job's address (no service node)")
def slurm_write(
    folder: Path,
    init: int,
    run: int,
    eval_: int,
    nodes: int,
    drain: int,
    time_: str,
    mem_per_sandbox: int,
    partition: str | None,
    account: str | None,
    env_root: Path | None,
    services: bool,
) -> None:
    """Write node.sbatch, services.sbatch and raas.env (this shell's RAAS_* settings)."""
    from app.ops.slurm import SlurmJobConfig, write_jobs

    root = env_root or os.environ.get("RAAS_ENV_ROOT")
    cfg = SlurmJobConfig(
        init=init,
        run=run,
        eval=eval_,
        nodes=nodes,
        drain=drain,
        time=time_,
        mem_per_sandbox_mb=mem_per_sandbox,
        slots_per_process=load_settings().max_slots_per_process,
        partition=partition,
        account=account,
        env_root=Path(root).resolve() if root else None,
        services=services,
    )
    for path in write_jobs(cfg, folder):
        click.echo(str(path))
    click.echo(f"node job: {cfg.cpus} CPUs, {cfg.mem_mb} MB, {nodes} node(s); sbatch {folder}/node.sbatch")


def _declared_pip() -> dict[str, list[str]]:
    """Environments the handlers and the policy's harness registrations declare: pip packages."""
    from agents.registry import declared_environments
    from core.harnesses import harness_environments

    harnesses = harness_environments(load_settings().policy.harnesses.registered)
    return {name: pip for name, (pip, _) in harnesses.items()} | declared_environments()


def _declared_npm() -> dict[str, list[str]]:
    """... and the harness registrations' npm packages."""
    from core.harnesses import harness_environments

    harnesses = harness_environments(load_settings().policy.harnesses.registered)
    return {name: npm for name, (_, npm) in harnesses.items() if npm}


def _declared_pythons() -> dict[str, str]:
    """... and the Python versions they name."""
    from core.harnesses import harness_pythons

    harnesses = load_settings().policy.harnesses
    return harness_pythons(harnesses.registered)


def _python_map() -> dict[str, str]:
    """The operator's version -> interpreter mapping (`policy.harnesses.pythons`)."""
    return dict(load_settings().policy.harnesses.pythons)


def _register_optional_commands() -> None:
    """Commands owned by other packages (client, sandbox envs, LLM simulator)."""
    from app.ops.tokens_cli import token_command
    from raas_client.cli import branch, cancel, llm, pause, results, resume, status, submit
    from raas_client.weights_cli import weights

    main.add_command(token_command)
    from app.ops.validate_cli import validate_command

    main.add_command(validate_command)

    for command in (submit, results, status, pause, resume, cancel, branch, llm, weights):
        main.add_command(command)
    try:
        from sandbox.cli import make_env_command

        main.add_command(
            make_env_command(
                _declared_pip, lambda: load_settings().envs_root, _declared_npm, _declared_pythons, _python_map
            ),
            "env",
        )
    except ImportError:
        pass
    try:
        from fakellm.cli import llm_sim_command

        main.add_command(llm_sim_command, "llm-sim")
    except ImportError:
        pass


_register_optional_commands()

if __name__ == "__main__":
    main()
