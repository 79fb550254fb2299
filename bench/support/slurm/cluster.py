"""A private one-node Slurm cluster on this machine (Debian's slurm-wlm 22.05 + munge).

Everything is the cluster's own: a munged on a private socket and key, a `slurm.conf` in a
temporary folder with free controller/daemon ports, own state, spool, pid and log files. It
runs as root (CI does): `munged --force`, then `slurmctld -D -i` (first start, no state yet) and
`slurmd -D` in the background, `SLURM_CONF` for the client commands.

`proctrack` is the plugin under test: `cgroup` (what most production sites use; needs a
writable cgroup v1 freezer) or `linuxproc` (where cgroup tracking is unavailable: orphans
escape the job). The node declares more CPUs and memory than the machine has
(`SlurmdParameters=config_overrides`), so two node jobs with their slot counts fit at once.

`nodes=2` declares two nodes, `n1` and `n2`, on this one machine: one slurmd each
(`slurmd -N n1`), each with its own `Port`, spool folder, pid and log file (`%n` in the
paths). Debian's 22.05 runs them side by side as it is (both register and take jobs); a
node's failure is `kill_node` (its slurmd, its jobs' step daemons and every process of those
jobs SIGKILLed, as a power loss leaves them), its return `restart_node`.
"""

from __future__ import annotations

import os
import random
import re
import signal
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

SLURM_PACKAGES = ("slurm-wlm", "munge")
FREEZER = Path("/sys/fs/cgroup/freezer")


def ensure_installed() -> None:
    """Install slurm-wlm and munge with apt-get when they are missing (CI runs as root)."""
    if shutil.which("slurmctld") and shutil.which("munged"):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(
        ["apt-get", "install", "-y", "-q", "-o", "DPkg::Lock::Timeout=600", *SLURM_PACKAGES],
        check=True,
        env=env,
        capture_output=True,
        timeout=1200,
    )


def freezer_writable() -> bool:
    """True when `proctrack/cgroup` can work here: the cgroup v1 freezer takes a folder."""
    probe = FREEZER / f"raas-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False


def available_proctracks() -> list[str]:
    """The proctrack plugins this machine can run: cgroup where the freezer is writable."""
    return (["cgroup"] if freezer_writable() else []) + ["linuxproc"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SlurmCluster:
    """One slurmctld + one slurmd (+ munged) of our own; `env` is what client commands need."""

    def __init__(
        self,
        proctrack: str = "cgroup",
        kill_wait: int = 30,
        cpus: int = 32,
        memory_mb: int = 64000,
        nodes: int = 1,
        slurmd_timeout: int = 300,
    ) -> None:
        self.proctrack = proctrack
        self.kill_wait = kill_wait
        self.dir = Path(tempfile.mkdtemp(prefix=f"raas-slurm-{proctrack}-", dir="/tmp"))
        self.node = socket.gethostname().split(".")[0]
        # one node: this host's own name; several: n1..nN, each its own slurmd on this host
        self.nodes = [self.node] if nodes == 1 else [f"n{i + 1}" for i in range(nodes)]
        self.cpus, self.memory_mb = cpus, memory_mb
        self.slurmd_timeout = slurmd_timeout  # how long a silent slurmd takes to be marked DOWN
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge.socket"
        self.procs: list[subprocess.Popen] = []
        self.slurmds: dict[str, subprocess.Popen] = {}
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- start / stop ---------------------------------------------------------------------
    def start(self, timeout: float = 60) -> SlurmCluster:
        """Write the configuration, start munged, slurmctld and the slurmds; wait for the nodes."""
        ensure_installed()
        for sub in ("state", "spool", "log"):
            (self.dir / sub).mkdir()
        self._start_munge()
        self._write_conf()
        self._daemon(["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
        for name in self.nodes:
            self.restart_node(name, timeout=0)
        self.wait_nodes_up(timeout)
        return self

    def wait_nodes_up(self, timeout: float = 60, names: list[str] | None = None) -> None:
        """Wait until every node (or `names`) takes jobs (idle, mixed or allocated)."""
        names = names or self.nodes
        deadline = time.monotonic() + timeout
        while True:
            states = {n: self.node_state(n) for n in names}
            if all(s in ("idle", "mixed", "allocated") for s in states.values()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"slurm nodes not up after {timeout}s ({states}):\n{self.log_tail()}")
            time.sleep(0.5)

    def node_state(self, name: str) -> str:
        """The node's state as sinfo names it (`idle`, `mixed`, `draining`, `down`, ...)."""
        return self.run("sinfo", "-h", "-N", "-n", name, "-o", "%T", check=False).stdout.strip()

    def node_flags(self, name: str) -> str:
        """The node's state as the controller holds it (`MIXED+DRAIN`, `DOWN+NOT_RESPONDING`)."""
        out = self.run("scontrol", "-o", "show", "node", name, check=False).stdout
        found = re.search(r"\bState=(\S+)", out)
        return found.group(1) if found else "UNKNOWN"

    def restart_node(self, name: str, timeout: float = 60) -> None:
        """Start the slurmd of node `name` (again); wait until it takes jobs."""
        if len(self.nodes) > 1:
            (self.dir / "spool" / name).mkdir(exist_ok=True)
        argv = ["slurmd", "-D", "-f", str(self.conf)] + (["-N", name] if len(self.nodes) > 1 else [])
        self.slurmds[name] = self._daemon(argv, f"slurmd-{name}" if len(self.nodes) > 1 else "slurmd")
        if timeout:
            self.wait_nodes_up(timeout, [name])

    def kill_node(self, name: str) -> int:
        """A node's power loss: SIGKILL its slurmd, the step daemons of its jobs and every
        process of those jobs (their cgroup, their process trees, whatever carries their job
        id); nothing is told first. Returns how many processes died."""
        jobs = self.run("squeue", "-h", "-w", name, "-o", "%A", check=False).stdout.split()
        daemon = self.slurmds[name]
        killed: set[int] = set()
        for _ in range(3):  # stop first (no fork races), then kill; again for stragglers
            pids = (_job_pids(jobs) | {daemon.pid}) - killed
            if killed and not pids:
                break
            for sig in (signal.SIGSTOP, signal.SIGKILL):
                for pid in pids:
                    _signal(pid, sig)
            killed |= pids
        daemon.wait(10)
        return len(killed)

    def _start_munge(self) -> None:
        key = self.dir / "munge.key"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
        key.chmod(0o600)
        self._daemon(
            [
                "munged",
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={key}",
                f"--pid-file={self.dir / 'munged.pid'}",
                f"--log-file={self.dir / 'log' / 'munged.log'}",
                f"--seed-file={self.dir / 'munge.seed'}",
            ],
            "munged",
        )
        deadline = time.monotonic() + 20
        while not self.munge_socket.exists() and time.monotonic() < deadline:
            time.sleep(0.1)

    def _write_conf(self) -> None:
        d = self.dir
        many = len(self.nodes) > 1
        per_node = "/%n" if many else ""  # slurmd expands %n to its node name
        nodes = "\n".join(
            f"NodeName={name} NodeHostname={self.node} NodeAddr=127.0.0.1"
            + (f" Port={_free_port()}" if many else "")
            + f" CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN"
            for name in self.nodes
        )
        # a job id of its own range: job cgroups (`slurm/uid_0/job_<id>`) and step daemons are
        # machine-wide, and another private cluster may run at the same time
        first_job = random.randrange(10_000, 60_000_000, 10_000)
        self.conf.write_text(f"""\
ClusterName=raas{os.getpid()}
FirstJobId={first_job}
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
ProctrackType=proctrack/{self.proctrack}
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobRequeue=1
KillWait={self.kill_wait}
MinJobAge=600
ReturnToService=2
SlurmdParameters=config_overrides
SlurmdTimeout={self.slurmd_timeout}
StateSaveLocation={d / "state"}
SlurmdSpoolDir={d / "spool"}{per_node}
SlurmctldPidFile={d / "slurmctld.pid"}
SlurmdPidFile={d / "slurmd"}{"-%n" if many else ""}.pid
SlurmctldLogFile={d / "log" / "slurmctld.log"}
SlurmdLogFile={d / "log" / "slurmd"}{"-%n" if many else ""}.log
SlurmctldDebug=info
SlurmdDebug=info
{nodes}
PartitionName=raas Nodes={",".join(self.nodes)} Default=YES MaxTime=INFINITE State=UP
""")
        (d / "cgroup.conf").write_text(
            "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n"
            "ConstrainCores=no\nConstrainRAMSpace=no\n"
            "ConstrainDevices=no\nConstrainSwapSpace=no\n"
        )

    def _daemon(self, argv: list[str], name: str) -> subprocess.Popen:
        with open(self.dir / "log" / f"{name}.out", "ab") as log:
            proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        """Cancel every job, stop the daemons, delete the folder."""
        self.run("scancel", "--full", "-u", "root", check=False)
        deadline = time.monotonic() + self.kill_wait + 15
        while self.queue() and time.monotonic() < deadline:
            time.sleep(0.5)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- client commands ------------------------------------------------------------------
    def run(
        self, *argv: str, check: bool = True, env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster."""
        result = subprocess.run(
            list(argv), env={**self.env, **(env or {})}, text=True, capture_output=True, timeout=timeout
        )
        if check and result.returncode:
            raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def sbatch(self, script: Path, *options: str, env: dict[str, str] | None = None) -> str:
        """Submit `script`; returns the job id."""
        out = self.run("sbatch", "--parsable", *options, str(script), env=env).stdout
        return out.strip().split(";")[0]

    def queue(self) -> dict[str, str]:
        """Job (or array task) id -> state of every job the controller still lists."""
        out = self.run("squeue", "-h", "-o", "%i %T", check=False).stdout
        return dict(line.split() for line in out.splitlines() if line.strip())

    def job_info(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a mapping (empty when the controller forgot the job)."""
        out = self.run("scontrol", "-o", "show", "job", job_id, check=False).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def state(self, job_id: str) -> str:
        """The job's state (`PENDING`, `RUNNING`, `CANCELLED`, `TIMEOUT`, ...)."""
        return self.job_info(job_id).get("JobState", "UNKNOWN")

    def wait_state(self, job_id: str, states: tuple[str, ...], timeout: float) -> str:
        """Wait until the job is in one of `states`; returns it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state(job_id)
            if state in states:
                return state
            time.sleep(0.5)
        raise AssertionError(
            f"job {job_id} not in {states} after {timeout}s: {self.job_info(job_id)}\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 30) -> str:
        """The end of the daemons' logs (for failure messages)."""
        out = []
        for path in sorted((self.dir / "log").glob("*.log")):
            out.append(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)


def _job_pids(jobs: list[str]) -> set[int]:
    """Every process of these Slurm jobs on this machine: their step daemons
    (`slurmstepd: [JOB.batch]`), the tasks of their freezer cgroups (proctrack/cgroup), any
    process carrying their `SLURM_JOB_ID`, and all descendants of those."""
    found: set[int] = set()
    for job in jobs:
        for procs in (FREEZER / "slurm").glob(f"uid_*/job_{job}/**/cgroup.procs"):
            found |= {int(p) for p in _read(procs).split()}
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        stat = _read(entry / "stat")
        if stat:
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(pid)
        cmdline = _read(entry / "cmdline").replace("\0", " ")
        environ = _read(entry / "environ").split("\0")
        if any(cmdline.startswith(f"slurmstepd: [{job}.") or f"SLURM_JOB_ID={job}" in environ for job in jobs):
            found.add(pid)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _read(path: Path) -> str:
    try:
        return path.read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
