"""Turns `SandboxLimits` into tool-server rlimit flags, given which cgroups exist.

RLIMIT_NPROC is per user and ignored for root; since Linux 5.14 it is counted per user
namespace, so inside a rootless bwrap sandbox it limits exactly the sandbox's processes.
On older kernels it is set relative to the user's current process count.
"""

from __future__ import annotations

import logging
import os
import platform

from sandbox.spec import SandboxLimits

log = logging.getLogger(__name__)
MB = 1024 * 1024


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        parts = platform.release().split(".")
        return (int(parts[0]), int(parts[1].split("-")[0])) >= (major, minor)
    except (ValueError, IndexError):
        return False


def _own_process_count() -> int:
    uid, count = os.getuid(), 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                count += os.stat(f"/proc/{name}").st_uid == uid
            except OSError:
                pass
    return count


def nproc_limit(limits: SandboxLimits, userns: bool) -> int:
    """RLIMIT_NPROC enforcing `max_procs` for this sandbox, or 0 when it cannot work (root)."""
    if os.geteuid() == 0:
        return 0
    if userns and _kernel_at_least(5, 14):
        return limits.max_procs
    return _own_process_count() + limits.max_procs


def server_flags(limits: SandboxLimits, cgroups: list[str], userns: bool, isolated: bool = True) -> list[str]:
    """Tool-server flags: output cap, file size, and rlimits for what no cgroup covers."""
    flags = ["--output-bytes", str(limits.output_bytes), "--fsize", str(limits.file_size_mb * MB)]
    if not isolated:  # the local runtime limits nothing else: it is not a sandbox
        return flags
    has_pids = any(os.path.exists(f"{path}/pids.max") for path in cgroups)
    has_memory = any(
        os.path.exists(f"{path}/memory.max") or os.path.exists(f"{path}/memory.limit_in_bytes") for path in cgroups
    )
    if not has_pids:
        nproc = nproc_limit(limits, userns)
        if nproc:
            flags += ["--nproc", str(nproc)]
        else:
            log.warning("running as root without a writable pids cgroup: max_procs is not enforced")
    if not has_memory:
        flags += ["--address-space", str(limits.memory_mb * MB)]
    return flags
