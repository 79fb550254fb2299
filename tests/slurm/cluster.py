"""A private one-node Slurm cluster on this machine (Debian's slurm-wlm 22.05 + munge).

Everything is the cluster's own: a munged on a private socket and key, a `slurm.conf` in a
temporary folder with free controller/daemon ports, own state, spool, pid and log files. It
runs as root (CI does): `munged --force`, then `slurmctld -D -i` (first start, no state yet) and
`slurmd -D` in the background, `SLURM_CONF` for the client commands.

`proctrack` is the plugin under test: `cgroup` (what most production sites use; needs a
writable cgroup v1 freezer) or `linuxproc` (where cgroup tracking is unavailable: orphans
escape the job). The node declares more CPUs and memory than the machine has
(`SlurmdParameters=config_overrides`), so two node jobs with their slot counts fit at once.
"""

from __future__ import annotations

import os
import re
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

    def __init__(self, proctrack: str = "cgroup", kill_wait: int = 30, cpus: int = 32, memory_mb: int = 64000) -> None:
        self.proctrack = proctrack
        self.kill_wait = kill_wait
        self.dir = Path(tempfile.mkdtemp(prefix=f"raas-slurm-{proctrack}-", dir="/tmp"))
        self.node = socket.gethostname().split(".")[0]
        self.cpus, self.memory_mb = cpus, memory_mb
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge.socket"
        self.procs: list[subprocess.Popen] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- start / stop ---------------------------------------------------------------------
    def start(self, timeout: float = 60) -> SlurmCluster:
        """Write the configuration, start munged, slurmctld and slurmd; wait for the node."""
        ensure_installed()
        for sub in ("state", "spool", "log"):
            (self.dir / sub).mkdir()
        self._start_munge()
        self._write_conf()
        self._daemon(["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
        self._daemon(["slurmd", "-D", "-f", str(self.conf)], "slurmd")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.run("sinfo", "-h", "-o", "%T", check=False).stdout.strip()
            if state in ("idle", "mixed", "allocated"):
                return self
            time.sleep(0.5)
        raise RuntimeError(f"slurm node not idle after {timeout}s (state {state!r}):\n{self.log_tail()}")

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
        self.conf.write_text(f"""\
ClusterName=raas{os.getpid()}
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
StateSaveLocation={d / "state"}
SlurmdSpoolDir={d / "spool"}
SlurmctldPidFile={d / "slurmctld.pid"}
SlurmdPidFile={d / "slurmd.pid"}
SlurmctldLogFile={d / "log" / "slurmctld.log"}
SlurmdLogFile={d / "log" / "slurmd.log"}
SlurmctldDebug=info
SlurmdDebug=info
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN
PartitionName=raas Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")
        (d / "cgroup.conf").write_text(
            "CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n"
            "ConstrainCores=no\nConstrainRAMSpace=no\n"
            "ConstrainDevices=no\nConstrainSwapSpace=no\n"
        )

    def _daemon(self, argv: list[str], name: str) -> None:
        log = open(self.dir / "log" / f"{name}.out", "ab")
        self.procs.append(
            subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        )

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
