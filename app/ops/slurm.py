"""Slurm job scripts for raas: a node job (array of N) and a service job, from slot counts.

What the scripts do and why (measured on a real Slurm 22.05, `tests/slurm/`,
`docs/slurm.md`):
- Slurm's `scancel`, time limit, preemption and `scontrol requeue` signal *every* process of
  the job; `--signal=TERM@N` reaches job steps only, never a batch script's `&` children. So
  the node job asks for `--signal=B:TERM@<drain + margin>` (the batch shell alone) and its
  `trap` forwards TERM to `raas node` only: the node drains within
  `RAAS_SOFT_SHUTDOWN_TIMEOUT` while its sandboxes live, then hands back what still runs.
- Under `proctrack/cgroup` the whole job is SIGKILLed ~1 s after the batch shell exits, so
  the shell waits for `raas node` however often `wait` is interrupted by the trap.
- Sites that set `SBATCH_EXPORT=NONE` give the job no variables of the submitter: the job
  sources an env file written next to it (0600: it holds the database URL).
- Node-local state (RAAS_HOME, workspaces, sandbox sockets) goes to the job's local scratch;
  the environments come from a shared, pre-built root (`RAAS_ENV_ROOT`), never built on a
  compute node.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import sys
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

# Variables that are node-local by nature: the job script sets them per node.
NODE_LOCAL = {"RAAS_HOME", "RAAS_NODE", "RAAS_WORKSPACE_ROOT", "RAAS_SANDBOX_DIR", "RAAS_SOFT_SHUTDOWN_TIMEOUT"}
ENV_FILE, SERVICES_FILE = "raas.env", "services.env"


class SlurmJobConfig(BaseModel):
    """What `raas slurm write` needs to write the job scripts."""

    model_config = ConfigDict(extra="forbid")

    init: int = Field(8, ge=1, description="INIT slots per node (sandbox starts)")
    run: int = Field(64, ge=1, description="RUN slots per node (agent loops)")
    eval: int = Field(8, ge=1, description="EVAL slots per node (grading)")
    nodes: int = Field(1, ge=1, description="Node jobs in the array")
    drain: int = Field(60, ge=0, description="Seconds a node drains on TERM (RAAS_SOFT_SHUTDOWN_TIMEOUT)")
    signal_margin: int = Field(30, ge=0, description="Seconds between the drain's end and the time limit")
    time: str = Field("1-00:00:00", description="Node job time limit (sbatch --time)")
    mem_per_sandbox_mb: int = Field(1024, ge=64, description="Memory budget per live sandbox")
    slots_per_process: int = Field(
        32,
        ge=1,
        description="The nodes' RAAS_MAX_SLOTS_PER_PROCESS: how many worker processes a node runs (sizes --mem)",
    )
    partition: str | None = Field(None, description="sbatch --partition")
    account: str | None = Field(None, description="sbatch --account")
    env_root: Path | None = Field(None, description="Shared pre-built environment root")
    services: bool = Field(False, description="Node jobs wait for the service job's address")
    services_time: str = Field("7-00:00:00", description="Service job time limit")
    gateway_port: int = Field(8000, description="Service job: gateway port")

    @property
    def cpus(self) -> int:
        """CPUs per node job: one per INIT and EVAL slot (sandbox starts and test runs are
        CPU-bound), one per 16 RUN slots (they wait on the LLM), one for the pools."""
        return self.init + self.eval + math.ceil(self.run / 16) + 1

    @property
    def worker_processes(self) -> int:
        """The node's stage worker processes (`app.ops.node.process_slots`)."""
        from app.ops.node import process_slots

        return sum(len(process_slots(n, self.slots_per_process)) for n in (self.init, self.run, self.eval))

    @property
    def mem_mb(self) -> int:
        """Memory per node job: every slot may hold a live sandbox, plus the pools: 2 GB for
        three worker processes and the reaper, 512 MB per further process (a RUN process
        peaked at 285 MB RSS in `bench/hot_path.py`, its tokenizer loaded)."""
        extra = max(0, self.worker_processes - 3)
        return (self.init + self.run + self.eval) * self.mem_per_sandbox_mb + 2048 + 512 * extra


def _render(template: str, values: dict[str, object]) -> str:
    """Replace `{{name}}` placeholders (bash's own `${...}` stay as they are)."""

    def one(match: re.Match) -> str:
        return str(values[match.group(1)])

    return re.sub(r"\{\{(\w+)\}\}", one, template)


def _sbatch_common(cfg: SlurmJobConfig) -> str:
    lines = [f"#SBATCH --partition={cfg.partition}"] if cfg.partition else []
    lines += [f"#SBATCH --account={cfg.account}"] if cfg.account else []
    return "\n".join(lines)


NODE_JOB = r"""#!/bin/bash
# A raas node: INIT {{init}}, RUN {{run}}, EVAL {{eval}} slots and the node's reaper, as one
# supervised unit (`raas node`). Written by `raas slurm write`; submit with
#   sbatch {{dir}}/node.sbatch        (an array of {{nodes}} node jobs)
#SBATCH --job-name=raas-node
#SBATCH --array=0-{{last}}
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task={{cpus}}
#SBATCH --mem={{mem}}M
#SBATCH --time={{time}}
#SBATCH --requeue
#SBATCH --signal=B:TERM@{{signal_at}}
#SBATCH --output={{dir}}/logs/node-%A_%a.out
#SBATCH --open-mode=append
{{common}}
set -u
# Settings come from a file, not from the submitter's environment (SBATCH_EXPORT=NONE).
source {{dir_q}}/raas.env
if [ -n "${RAAS_SERVICES_FILE:-}" ]; then   # the service job writes its address there
    while [ ! -s "$RAAS_SERVICES_FILE" ]; do sleep 5; done
    source "$RAAS_SERVICES_FILE"
fi
# Node-local state in the job's local scratch, never on the shared submit folder.
SCRATCH="${SLURM_TMPDIR:-${TMPDIR:-/tmp}}/raas-${SLURM_JOB_ID}"
mkdir -p "$SCRATCH"
export RAAS_HOME="$SCRATCH/home" RAAS_WORKSPACE_ROOT="$SCRATCH/ws" RAAS_SANDBOX_DIR="$SCRATCH/sbx"
# One name per allocation: a requeued job is a new node (its sandboxes died with the old one).
export RAAS_NODE="$(hostname -s)-${SLURM_JOB_ID}-r${SLURM_RESTART_COUNT:-0}"
export RAAS_SOFT_SHUTDOWN_TIMEOUT={{drain}}
echo "raas node $RAAS_NODE on $(hostname) at $(date -Is), scratch $SCRATCH"
raas node --node "$RAAS_NODE" --init {{init}} --run {{run}} --eval {{eval}} &
NODE_PID=$!
# TERM (scancel, time limit via --signal=B:TERM, requeue, preemption) goes to raas node
# only: it stops taking work, drains, hands back what still runs; sandboxes live meanwhile.
trap 'echo "TERM at $(date -Is): draining $RAAS_NODE"; kill -TERM "$NODE_PID" 2>/dev/null' TERM
wait "$NODE_PID"; code=$?
while kill -0 "$NODE_PID" 2>/dev/null; do wait "$NODE_PID"; code=$?; done
echo "raas node $RAAS_NODE exited $code at $(date -Is)"
rm -rf "$SCRATCH"
exit $code
"""

SERVICES_JOB = r"""#!/bin/bash
# raas services for sites without a service node: PostgreSQL, Redis and the gateway in one
# long job. Its address goes to {{dir}}/services.env, which node jobs wait for and source.
# Data lives under RAAS_SERVICES_STATE (default {{dir}}/state, shared): a new service job
# continues where the last one stopped. Needs redis-server, initdb/postgres (site modules or
# conda) on PATH. Written by `raas slurm write`; submit with
#   sbatch {{dir}}/services.sbatch
#SBATCH --job-name=raas-services
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=4
#SBATCH --mem=8G
#SBATCH --time={{services_time}}
#SBATCH --signal=B:TERM@60
#SBATCH --output={{dir}}/logs/services-%j.out
#SBATCH --open-mode=append
{{common}}
set -eu
source {{dir_q}}/raas.env
STATE="${RAAS_SERVICES_STATE:-{{dir}}/state}"
SCRATCH="${SLURM_TMPDIR:-${TMPDIR:-/tmp}}/raas-services-${SLURM_JOB_ID}"
mkdir -p "$STATE/redis" "$STATE/pg" "$SCRATCH/pg"
chmod 700 "$STATE" "$STATE/redis" "$STATE/pg" "$SCRATCH"
AS_PG=""
if [ "$(id -u)" = 0 ]; then   # PostgreSQL refuses root (containers): it runs as postgres
    AS_PG="runuser -u postgres --"
    chmod 711 "$STATE" "$SCRATCH" && chown postgres "$STATE/pg" "$SCRATCH/pg"
fi
ADDR="$(hostname -I 2>/dev/null | awk '{print $1}')"; ADDR="${ADDR:-$(hostname -f)}"
PG_PORT=${RAAS_PG_PORT:-15432} REDIS_PORT=${RAAS_REDIS_PORT:-16379}
GW_PORT=${RAAS_GATEWAY_PORT:-{{gateway_port}}}
[ -s "$STATE/secret" ] || (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' > "$STATE/secret")
SECRET="$(cat "$STATE/secret")"
if [ ! -f "$STATE/pg/PG_VERSION" ]; then
    (umask 077; echo "$SECRET" > "$SCRATCH/pg/pw")
    [ -z "$AS_PG" ] || chown postgres "$SCRATCH/pg/pw"
    $AS_PG initdb -D "$STATE/pg" -U raas -E UTF8 --locale=C --auth=scram-sha-256 --pwfile="$SCRATCH/pg/pw" >/dev/null
    rm -f "$SCRATCH/pg/pw"
    echo "host all all 0.0.0.0/0 scram-sha-256" >> "$STATE/pg/pg_hba.conf"
fi
$AS_PG postgres -D "$STATE/pg" -p "$PG_PORT" -c listen_addresses='*' -k "$SCRATCH/pg" -c max_connections=500 &
PIDS=$!
redis-server --port "$REDIS_PORT" --bind 0.0.0.0 --requirepass "$SECRET" --appendonly yes \
    --dir "$STATE/redis" --save '' &
PIDS="$PIDS $!"
export PGPASSWORD="$SECRET"
until pg_isready -q -h "$ADDR" -p "$PG_PORT"; do sleep 1; done
psql -h "$ADDR" -p "$PG_PORT" -U raas -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname='raas'" | grep -q 1 \
    || createdb -h "$ADDR" -p "$PG_PORT" -U raas raas
export RAAS_DATABASE_URL="postgresql://raas:$SECRET@$ADDR:$PG_PORT/raas"
export RAAS_BROKER_URL="redis://:$SECRET@$ADDR:$REDIS_PORT/0"
raas db upgrade
# gthread workers: a results long-poll holds a thread, not the worker (docs/slurm.md, "The gateway line")
gunicorn -k gthread -w 2 --threads 16 --timeout 120 -b "0.0.0.0:$GW_PORT" 'app:create_app()' &
PIDS="$PIDS $!"
(umask 077; cat > "$SCRATCH/services.env" <<EOF
export RAAS_DATABASE_URL='$RAAS_DATABASE_URL'
export RAAS_BROKER_URL='$RAAS_BROKER_URL'
export RAAS_URL='http://$ADDR:$GW_PORT'
EOF
)
mv "$SCRATCH/services.env" {{dir_q}}/services.env
echo "raas services on $ADDR: gateway :$GW_PORT, PostgreSQL :$PG_PORT, Redis :$REDIS_PORT"
trap 'rm -f {{dir_q}}/services.env; kill -TERM $PIDS' TERM
set +e
wait; wait
"""


def env_file(cfg: SlurmJobConfig, environ: dict[str, str] | None = None, python: str = sys.executable) -> str:
    """`raas.env`: PATH with this raas installation, and this shell's RAAS_* settings."""
    environ = dict(os.environ if environ is None else environ)
    lines = [
        "# Sourced by the raas Slurm jobs (they do not rely on sbatch --export).",
        f'export PATH={shlex.quote(str(Path(python).parent))}:"$PATH"',
    ]
    if cfg.env_root:
        environ["RAAS_ENV_ROOT"] = str(cfg.env_root)
    if cfg.services:
        environ["RAAS_SERVICES_FILE"] = "{dir}/" + SERVICES_FILE
    for key in sorted(environ):
        if key.startswith("RAAS_") and key not in NODE_LOCAL:
            lines.append(f"export {key}={shlex.quote(environ[key])}")
    return "\n".join(lines) + "\n"


def write_jobs(
    cfg: SlurmJobConfig, folder: Path, environ: dict[str, str] | None = None, python: str = sys.executable
) -> list[Path]:
    """Write node.sbatch, services.sbatch and raas.env into `folder`; returns the paths."""
    folder = folder.resolve()
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    values = {
        **cfg.model_dump(),
        "dir": folder,
        "dir_q": shlex.quote(str(folder)),
        "last": cfg.nodes - 1,
        "cpus": cfg.cpus,
        "mem": cfg.mem_mb,
        "signal_at": cfg.drain + cfg.signal_margin,
        "common": _sbatch_common(cfg),
    }
    node, services = folder / "node.sbatch", folder / "services.sbatch"
    node.write_text(_render(NODE_JOB, values))
    services.write_text(_render(SERVICES_JOB, values))
    env = folder / ENV_FILE
    env.touch(mode=0o600)
    env.chmod(0o600)
    env.write_text(env_file(cfg, environ, python).replace("{dir}", str(folder)))
    return [node, services, env]
