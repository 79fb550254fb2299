"""Real escape attempts against bwrap sandboxes; every one must fail and the host must stay fine."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from sandbox import ToolUsageError, stop_handle
from sandbox.cgroups import pids_current
from sandbox.handles import read_handles
from tests.sandbox.conftest import host_processes_matching

REPO = Path(__file__).resolve().parents[2]
HOME = Path.home()
DATA_TREE = REPO.parents[-2]  # the top-level folder the checkout lives in (e.g. /srv, /home)


@pytest.fixture
def bw(start):
    """A bwrap sandbox with default limits."""
    return start("bwrap")


def test_cannot_write_outside_the_workspace(bw, tmp_path):
    outside = tmp_path / "outside.txt"
    targets = [
        "/usr/raas-evil",
        "/etc/raas-evil",
        "/opt/raas/toolserver/evil.py",
        str(outside),
        str(REPO / "raas-evil"),  # the checkout the service runs from
        str(HOME / "raas-evil"),
    ]
    for target in targets:
        r = bw.bash(f"echo pwned > {target}")
        if not target.startswith("/tmp/"):  # /tmp inside is a private tmpfs: writable, not the host's
            assert r.exit_code != 0, target
        assert not os.path.exists(target), target
    assert bw.bash("echo ok > inside.txt && cat inside.txt").output == "ok\n"
    assert (Path(bw.workspace) / "inside.txt").read_text() == "ok\n"


def test_cannot_read_host_secrets_or_data_trees(start, tmp_path, monkeypatch):
    monkeypatch.setenv("RAAS_TEST_SECRET", "hunter2-env")
    secret_tmp = tmp_path / "secret.txt"
    secret_tmp.write_text("hunter2-file")
    secret_home = HOME / f"raas-test-secret-{uuid.uuid4().hex[:8]}"
    secret_home.write_text("hunter2-home")
    try:
        bw = start("bwrap")
        r = bw.bash(f"cat {secret_tmp} {secret_home}; echo env=$RAAS_TEST_SECRET; cat /proc/*/environ | tr '\\0' '\\n'")
        assert "hunter2" not in r.output
        listing = bw.bash(f"ls -A {HOME} /root /home /var /srv /mnt {DATA_TREE} {REPO} 2>&1; ls -A /tmp").output
        assert "No such file" in listing and "hunter2" not in listing
        assert "root:" not in bw.bash("cat /etc/shadow").output  # masked even where it is readable
        with pytest.raises(ToolUsageError):
            bw.read_file(str(secret_tmp))
    finally:
        secret_home.unlink()


@pytest.mark.skipif(os.geteuid() != 0, reason="a root service only: a user's sandbox is that user")
def test_a_root_service_runs_sandboxes_unprivileged(start):
    """Issue 22.2: a sandbox of a root service was host root, so every root-only file of the
    read-only /etc bind that the deny-list did not name was readable. Now the agent is an
    unprivileged uid, and what it reads no longer depends on a list."""
    secret = Path(f"/etc/raas-test-root-only-{uuid.uuid4().hex[:8]}")
    secret.write_text("hunter2-etc")
    secret.chmod(0o600)
    try:
        bw = start("bwrap")
        r = bw.bash(f"id -u; cat {secret}; echo made > mine.txt && cat mine.txt")
        assert "hunter2" not in r.output and "Permission denied" in r.output, r.output
        assert r.output.splitlines()[0] == "65534" and r.output.endswith("made\n")
        assert bw.bash("ls /proc | grep -c '^[0-9]'").output.strip() in {"1", "2", "3", "4"}
    finally:
        secret.unlink()


def test_where_the_uid_may_not_create_namespaces_root_sandboxes_remain(monkeypatch):
    """Unprivileged user namespaces can be forbidden (sysctl, AppArmor): then a root service
    keeps starting sandboxes (as root, with the masked files hidden) and says so."""
    from sandbox import bwrap
    from sandbox.settings import SandboxSettings

    settings = SandboxSettings()
    monkeypatch.setattr(bwrap, "_probe_as", lambda uid: "forbidden here")
    monkeypatch.setattr(bwrap.os, "geteuid", lambda: 0)
    assert bwrap.unprivileged_uid(settings) is None
    monkeypatch.setattr(bwrap, "_probe_as", lambda uid: None)
    assert bwrap.unprivileged_uid(settings) == 65534
    monkeypatch.setattr(bwrap.os, "geteuid", lambda: 1000)
    assert bwrap.unprivileged_uid(settings) is None  # a user's sandbox is that user


def test_a_failed_probe_is_not_remembered_for_good(monkeypatch, caplog):
    """Review 1 item 5: one failed root->nobody probe (a timeout on a loaded node) must not run
    every later sandbox of the process as host root: only success is cached; a failure is
    probed again after PROBE_RETRY_S. The probe's outcome is a fake (a transient failure
    cannot be made to happen on demand); the caching around it is the real code."""
    from sandbox import bwrap

    outcomes = ["failed to run: timed out after 10 seconds", None]
    calls: list[int] = []

    def fake_probe(uid):
        calls.append(uid)
        return outcomes.pop(0)

    now = [1000.0]
    monkeypatch.setattr(bwrap, "_run_probe_as", fake_probe)
    monkeypatch.setattr(bwrap.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(bwrap, "_probe_ok", set())
    monkeypatch.setattr(bwrap, "_probe_failed", {})
    assert bwrap._probe_as(65534).startswith("failed to run")
    now[0] += 1
    assert bwrap._probe_as(65534).startswith("failed to run")  # within the back-off: no probe
    assert calls == [65534]
    now[0] += bwrap.PROBE_RETRY_S
    with caplog.at_level("INFO", logger=bwrap.log.name):
        assert bwrap._probe_as(65534) is None  # probed again, and it works now
    assert "probing again" in caplog.text
    now[0] += 10 * bwrap.PROBE_RETRY_S
    assert bwrap._probe_as(65534) is None and calls == [65534, 65534]  # success is kept


def test_no_network_when_off(start):
    with socket.create_connection(("127.0.0.1", 5432), timeout=2):
        pass  # PostgreSQL is up on the host, so a failure inside is the sandbox's doing
    probe = "import socket; socket.create_connection(('127.0.0.1', 5432), timeout=2); print('connected')"
    bw = start("bwrap")
    r = bw.bash(f'python3 -c "{probe}"')
    assert r.exit_code != 0 and "connected" not in r.output
    assert bw.python(probe).error is not None
    online = start("bwrap", network=True)
    assert online.bash(f'python3 -c "{probe}"').output == "connected\n"


def test_fork_bomb_is_contained(start):
    bw = start("bwrap", limits={"max_procs": 64})
    groups = bw.handle["cgroups"]
    if os.geteuid() == 0 and pids_current(groups) is None:
        pytest.skip("root without a pids cgroup: RLIMIT_NPROC does not bind root, refusing to fork-bomb")
    before = len(os.listdir("/proc"))
    r = bw.bash(":(){ :|:& };:", timeout=5)
    assert r.exit_code is not None or r.timed_out
    time.sleep(2)  # let it saturate
    in_sandbox = pids_current(groups)
    assert in_sandbox is not None and in_sandbox <= 64
    assert len([p for p in os.listdir("/proc") if p.isdigit()]) < before + 80
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork
    bw.reset()  # kill every tool process; the server survives
    assert bw.bash("echo alive", timeout=20).output == "alive\n"
    bw.stop()
    assert pids_current(groups) is None  # the cgroup is gone with everything in it


ROOTLESS_SCRIPT = """
import os, sys, time
from sandbox import SandboxLimits, SandboxSpec
from sandbox.bwrap import BwrapRuntime
base = sys.argv[1]
rt = BwrapRuntime(state_dir=base + "/state", use_cgroups=False)
sb = rt.start(SandboxSpec(workspace=base + "/ws", limits=SandboxLimits(max_procs=64, memory_mb=256)))
try:
    big = sb.bash("python3 -c \\"b = b'x' * (600 * 1024 * 1024); print('allocated')\\"", timeout=30)
    assert big.exit_code != 0 and "MemoryError" in big.output, big.output  # RLIMIT_AS, no cgroup
    assert "MemoryError" in sb.python("b = b'x' * (600 * 1024 * 1024)").error
    sb.bash(":(){ :|:& };:", timeout=5)
    time.sleep(2)
    from sandbox.toolserver.procs import descendants  # this sandbox's tree: a root service's
    mine = 1 + len(descendants(sb.handle["pid"]))     # sandboxes elsewhere run as this uid too
    sb.reset()
    print(mine, sb.bash("echo alive", timeout=20).output.strip())
finally:
    sb.stop()
"""


def test_fork_bomb_rootless_rlimit():
    """As an unprivileged uid without cgroups, RLIMIT_NPROC (per user namespace) holds the bomb
    and RLIMIT_AS holds memory: the rootless path clusters take."""
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to an unprivileged uid for this check")
    base = Path(tempfile.mkdtemp(prefix="raas-rootless-"))
    try:
        base.chmod(0o755)
        for sub in ("ws", "state"):
            (base / sub).mkdir(mode=0o700)
            os.chown(base / sub, 65534, 65534)
        run = subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                sys.executable,
                "-c",
                ROOTLESS_SCRIPT,
                str(base),
            ],
            capture_output=True,
            text=True,
            timeout=90,
            cwd=str(Path(__file__).parents[2]),
        )
        assert run.returncode == 0, run.stderr[-2000:]
        count, alive = run.stdout.split()
        assert alive == "alive" and 0 < int(count) <= 64 + 3, run.stdout  # + client, bwrap, its init
    finally:
        for handle in read_handles(base / "state"):  # safety net, as root
            stop_handle(handle)
        subprocess.run(["rm", "-rf", str(base)])


def test_memory_limit(start):
    bw = start("bwrap", limits={"memory_mb": 256})
    r = bw.bash("python3 -c \"b = b'x' * (600 * 1024 * 1024); print('allocated', len(b))\"", timeout=30)
    assert r.exit_code != 0 and "allocated" not in r.output
    p = bw.python("b = b'x' * (600 * 1024 * 1024); 'allocated'", timeout=30)
    assert "allocated" not in p.output
    assert bw.ping().version == 1
    assert bw.bash("echo ok").output == "ok\n"


def test_huge_output_is_capped_and_server_stays_responsive(bw):
    started = time.monotonic()
    r = bw.bash("head -c 100000000 /dev/zero | tr '\\0' x; echo; echo END", timeout=60)
    assert r.exit_code == 0 and r.output.endswith("END\n")
    assert len(r.output) < 64 * 1024 + 200 and r.elided_bytes > 99_000_000
    assert "bytes of output elided" in r.output
    p = bw.python("print('y' * 100_000_000)", timeout=60)
    assert len(p.output) < 64 * 1024 + 200
    assert bw.ping().version == 1 and time.monotonic() - started < 60


def test_sleep_is_killed_at_timeout_and_next_call_works(bw):
    r = bw.bash("sleep 1000", timeout=1)
    assert r.timed_out
    assert bw.bash("echo next").output == "next\n"
    assert "sleep 1000" not in bw.bash("ps -eo args").output


def test_background_process_gone_after_stop(bw):
    tag = f"31337.{os.getpid()}"
    bw.bash(f"nohup sleep {tag} >/dev/null 2>&1 & disown; (setsid sleep {tag} &)")
    time.sleep(0.2)
    assert len(host_processes_matching(f"sleep\0{tag}")) == 2
    bw.stop()
    assert host_processes_matching(f"sleep\0{tag}") == []


def test_file_tools_stay_in_the_workspace(bw, tmp_path):
    ws = Path(bw.workspace)
    (ws / "link").symlink_to("/etc/passwd")
    (ws / "dirlink").symlink_to(tmp_path)
    attempts = [
        lambda: bw.read_file("../../etc/passwd"),
        lambda: bw.read_file("/etc/passwd"),
        lambda: bw.edit("view", "../../../../etc/passwd"),
        lambda: bw.read_file("link"),
        lambda: bw.edit("view", "link"),
        lambda: bw.write_file("../escape.txt", "x"),
        lambda: bw.write_file("dirlink/escape.txt", "x"),
        lambda: bw.edit("create", "/tmp/escape.txt", file_text="x"),
        lambda: bw.edit("str_replace", "link", old_str="root", new_str="toor"),
    ]
    for attempt in attempts:
        with pytest.raises(ToolUsageError, match="outside the workspace"):
            attempt()
    assert not (tmp_path / "escape.txt").exists() and not (ws.parent / "escape.txt").exists()


def test_no_nested_user_namespaces(bw):
    """Nested user namespaces would hand the agent a fresh capability set to attack the kernel with."""
    # The syscall itself, so the test cannot pass because an `unshare` binary is missing.
    r = bw.bash(
        "python3 -c 'import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
        "print(libc.unshare(0x10000000), os.strerror(ctypes.get_errno()))'"
    )  # NEWUSER
    assert r.exit_code == 0, r.output  # the probe ran
    result, _, reason = r.output.strip().partition(" ")
    assert result == "-1", f"unshare(CLONE_NEWUSER) succeeded inside the sandbox: {r.output}"
    assert reason, r.output


def test_tool_socket_is_out_of_reach_inside(bw, start_mode):
    """The host binds the socket in its own state dir and passes it in: nothing to move."""
    assert bw.handle["server_pid"] and bw.handle["server_start"]
    r = bw.bash("ls -A /run; find / -xdev -type s 2>/dev/null | head; echo done")
    # a fork slot's two staging points (the layers folder, its fork folder) stay as names,
    # each covered by an empty, read-only tmpfs the agent can neither read nor unmount
    staged = ("raas-fork", "raas-layers") if start_mode == "slot" else ()
    seen = " ".join(x for x in r.output.split() if x not in staged)
    assert "raas" not in seen and "tool.sock" not in r.output and r.output.endswith("done\n")
    for name in staged:
        covered = bw.bash(f"ls -A /run/{name}; umount /run/{name}; touch /run/{name}/x; ls -A /run/{name}")
        assert "Permission denied" in covered.output and "must be superuser" in covered.output, covered.output
    # the tools run in a pid namespace below the server's: it has no pid they could use
    assert bw.bash("echo $PPID").output == "0\n"
    # where the kernel leaves the outer /proc visible (a root service), the server is
    # listed, but it is not dumpable: its descriptors (the listening socket) stay unreachable
    find = (
        "python3 -c \"import os; print(*[p for p in os.listdir('/proc') if p.isdigit() "
        "and open(f'/proc/{p}/cmdline', 'rb').read().startswith(b'/usr/bin/python3\\0-I\\0-B\\0-c\\0')][:1])\""
    )
    server = bw.bash(find).output.strip()
    if server:
        fds = bw.bash(f"ls /proc/{server}/fd 2>&1; cat /proc/{server}/environ 2>&1 | head -c 100")
        assert "Permission denied" in fds.output
    assert bw.bash("echo still-serving").output == "still-serving\n"


def test_the_server_imports_nothing_from_where_the_agent_can_write(bw):
    """Review 1 item 12: the root tmpfs is the sandbox uid's (the agent may write /json.py).
    The server runs isolated (-I: no cwd or PYTHONPATH entry on sys.path; -S: no site, so no
    .pth file of the system's site-packages runs in it either), from a read-only
    cwd, and /opt/raas, the only place it imports from, is a read-only mount."""
    pid = bw.handle["server_pid"]
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert argv[:4] == [b"/usr/bin/python3", b"-I", b"-S", b"-B"], argv  # -S: no .pth runs
    assert os.readlink(f"/proc/{pid}/cwd") == "/opt/raas"
    r = bw.bash(
        "for d in /opt/raas /opt/raas/lib /opt/raas/toolserver; do "
        "touch $d/json.py 2>/dev/null && echo WROTE $d; done; echo done"
    )
    assert r.output == "done\n", r.output
    # the server sees what the agent wrote elsewhere, and still serves without importing it
    assert bw.bash("echo 'raise SystemExit(99)' > /json.py; echo ok").output == "ok\n"
    assert bw.python("import json; print(json.dumps([1]))").output.strip() == "[1]"
    assert bw.bash("echo still-serving").output == "still-serving\n"


def test_a_swapped_socket_is_an_error_never_an_answer(start):
    """Whoever answers on the socket path must be the server the runtime started."""
    from sandbox import Sandbox
    from sandbox.errors import SandboxTampered

    local = start("local")
    path = local.handle["socket"]
    os.rename(path, path + ".real")
    impostor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    impostor.bind(path)
    impostor.listen(1)
    try:
        with pytest.raises(SandboxTampered, match="not by the server"):
            Sandbox(local.handle, stop_handle).ping()
    finally:
        impostor.close()
        os.unlink(path)
        os.rename(path + ".real", path)
    assert Sandbox(local.handle, stop_handle).ping().pid == local.handle["server_pid"]
