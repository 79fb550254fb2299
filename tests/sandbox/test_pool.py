"""The warm pool (sandbox/pool.py) with real bwrap sandboxes: a claim hands one whole sandbox
to one rollout, on its own workspace, and members of a dead pool process are found and stopped.
(The attack tests run on pooled sandboxes too: tests/sandbox/test_security.py, `[pooled]`.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sandbox import SandboxOptions, SandboxSettings, list_sandboxes, stop_handle
from sandbox.handles import POOL_LABEL, hand_over, orphaned, pid_alive, read_handles
from sandbox.pool import WarmPool, claim_file, remove_slot, slot_folders
from sandbox.toolserver.procs import descendants, start_time

PLAIN = SandboxOptions()


@pytest.fixture
def pool_of(state_dir, tmp_path):
    """pool_of(size, **kwargs) -> a WarmPool on this test's state dir; closed at teardown."""
    pools: list[WarmPool] = []

    def _make(size: int = 2, **kwargs) -> WarmPool:
        pools.append(WarmPool(SandboxSettings(state_dir=state_dir), tmp_path / "slots", size, **kwargs))
        return pools[-1]

    yield _make
    for pool in pools:
        pool.close()
    for handle in list_sandboxes(state_dir, include_dead=True):
        stop_handle(handle)


def _on_disk(state_dir: str, sandbox_id: str) -> dict:
    return next(h for h in read_handles(Path(state_dir)) if h["id"] == sandbox_id)


def test_a_claim_hands_over_a_running_sandbox_on_its_own_workspace(pool_of, state_dir):
    pool = pool_of(1)
    assert pool.claim(PLAIN, "bwrap", "r1:1") is None  # a miss teaches the pool the shape
    assert pool.wait_ready(PLAIN, "bwrap", timeout=60)
    [member] = [h for h in read_handles(Path(state_dir)) if h["label"] == POOL_LABEL]
    assert member["owner_pid"] == os.getpid() and not orphaned(member)
    sb = pool.claim(PLAIN, "bwrap", "r1:1")
    assert sb is not None and sb.handle["id"] == member["id"]
    # the relabel is on disk before the claim returns (a reaper reads it from there)
    assert _on_disk(state_dir, member["id"])["label"] == "r1:1"
    assert claim_file(sb.workspace).read_text() == "r1:1"
    assert Path(sb.workspace).name.startswith("pool-") and os.listdir(sb.workspace) == []
    # the host fills the workspace after the claim (INIT, prepare_eval) and hands it over
    Path(sb.workspace, "task.py").write_text("x = 1\n")
    hand_over(sb.handle)
    result = sb.bash("pwd; cat task.py; echo y = 2 >> task.py && echo wrote")
    assert result.output.splitlines() == [sb.workspace, "x = 1", "wrote"]
    assert Path(sb.workspace, "task.py").read_text() == "x = 1\ny = 2\n"
    assert pool.stats()["claims"] == 1 and pool.stats()["misses"] == 1


def test_a_pooled_sandbox_is_never_handed_to_two_rollouts(pool_of, state_dir):
    pool = pool_of(2)
    assert pool.wait_ready(PLAIN, "bwrap", timeout=60)
    got: dict[str, object] = {}
    lock = threading.Lock()

    def claimer(n: int) -> None:
        end = time.monotonic() + 120
        while time.monotonic() < end:
            sb = pool.claim(PLAIN, "bwrap", f"r{n}:1")
            if sb is not None:
                with lock:
                    got[f"r{n}:1"] = sb
                return
            time.sleep(0.01)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(got) == 8
    ids = {sb.handle["id"] for sb in got.values()}
    servers = {sb.handle["server_pid"] for sb in got.values()}
    workspaces = {sb.workspace for sb in got.values()}
    assert len(ids) == len(servers) == len(workspaces) == 8
    for label, sb in got.items():  # each is labelled for its own rollout, on disk too
        assert sb.label == label == _on_disk(state_dir, sb.handle["id"])["label"]
        assert sb.ping().pid  # and answers
    # stopped sandboxes never come back: the next claims are new sandboxes
    for sb in got.values():
        sb.stop()
    assert pool.wait_ready(PLAIN, "bwrap", timeout=60)
    again = pool.claim(PLAIN, "bwrap", "r9:1")
    assert again is not None and again.handle["id"] not in ids


def test_only_the_same_shape_is_handed_out(pool_of):
    pool = pool_of(1)
    assert pool.wait_ready(PLAIN, "bwrap", timeout=60)
    assert pool.claim(SandboxOptions(network=True), "bwrap", "r:1") is None
    assert pool.claim(SandboxOptions(limits={"memory_mb": 512}), "bwrap", "r:1") is None
    assert pool.claim(SandboxOptions(env={"A": "1"}), "bwrap", "r:1") is None
    assert pool.claim(PLAIN, "singularity", "r:1") is None  # never pooled
    assert pool.ready_count(PLAIN) == 1
    limited = SandboxOptions(limits={"memory_mb": 512, "max_procs": 64})
    assert pool.wait_ready(limited, "bwrap", timeout=60)
    sb = pool.claim(limited, "bwrap", "r:1")
    assert sb is not None
    limits = [
        Path(c, "pids.max").read_text().strip() for c in sb.handle["cgroups"] if Path(c, "pids.max").exists()
    ] or [sb.bash("ulimit -u").output.strip()]
    assert limits == ["64"]


def test_a_dead_member_is_not_handed_out(pool_of):
    pool = pool_of(1)
    assert pool.wait_ready(PLAIN, "bwrap", timeout=60)
    [(_, member)] = list(pool._shapes.values())[0].ready
    os.kill(member["init_pid"], signal.SIGKILL)  # e.g. the OOM killer
    end = time.monotonic() + 10
    while pid_alive(member["server_pid"], member["server_start"]) and time.monotonic() < end:
        time.sleep(0.01)
    # never the dead one; a replacement the filler started meanwhile may be (a loaded node)
    claimed = pool.claim(PLAIN, "bwrap", "r:1")
    assert claimed is None or (claimed.handle["id"] != member["id"] and claimed.ping().version >= 1)
    assert not Path(member["workspace"]).exists()
    assert pool.wait_ready(PLAIN, "bwrap", timeout=60)
    assert pool.claim(PLAIN, "bwrap", "r:1") is not None


def test_an_unwanted_shape_is_let_go(pool_of, state_dir):
    pool = pool_of(1, idle_s=2.0)
    assert pool.wait_ready(PLAIN, "bwrap", timeout=60)

    def slots() -> list[str]:
        return [name for name in os.listdir(pool.slots_dir) if name.startswith("pool-")]

    # A member is stopped (its state goes) and then its folder is deleted: wait for all three.
    end = time.monotonic() + 30
    while time.monotonic() < end and (pool.ready_count() or list_sandboxes(state_dir) or slots()):
        time.sleep(0.1)
    assert pool.ready_count() == 0 and list_sandboxes(state_dir) == []
    assert slots() == []


POOL_PROCESS = """
import sys
from sandbox import SandboxOptions, SandboxSettings
from sandbox.pool import WarmPool
pool = WarmPool(SandboxSettings(state_dir=sys.argv[1]), sys.argv[2], 2)
assert pool.wait_ready(SandboxOptions(), "bwrap", timeout=60)
claimed = pool.claim(SandboxOptions(), "bwrap", "r:1")
print(claimed.handle["id"], flush=True)
sys.stdin.read()
"""


def test_members_of_a_killed_pool_process_are_stopped(state_dir, tmp_path):
    slots = tmp_path / "slots"
    owner = subprocess.Popen(
        [sys.executable, "-c", POOL_PROCESS, state_dir, str(slots)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        claimed_id = owner.stdout.readline().strip()
        assert claimed_id, "the pool process did not start"
        end = time.monotonic() + 60  # it makes up for the claim
        while (
            time.monotonic() < end
            and sum(h["label"] == POOL_LABEL and h["state"] == "ready" for h in read_handles(Path(state_dir))) < 2
        ):
            time.sleep(0.05)
        handles = read_handles(Path(state_dir))
        members = [h for h in handles if h["label"] == POOL_LABEL]
        assert len(members) >= 2 and not any(orphaned(h) for h in handles)
        trees = {h["id"]: [h["pid"], *descendants(h["pid"])] for h in handles}
        starts = {p: start_time(p) for tree in trees.values() for p in tree}
        assert set(slot_folders(slots).values()) == {"r:1"}  # a live pool keeps its own
        owner.kill()
        owner.wait()
        # the claimed sandbox is its rollout's now; the unclaimed ones are garbage
        assert all(orphaned(h) for h in members)
        live = list_sandboxes(state_dir)  # stops what is orphaned on the way
        assert [h["id"] for h in live] == [claimed_id]
        for member in members:
            assert not any(pid_alive(p, starts[p]) for p in trees[member["id"]])
        folders = slot_folders(slots)
        [claimed] = [h for h in handles if h["id"] == claimed_id]
        assert folders[claimed["workspace"]] == "r:1"
        unclaimed = {path for path, label in folders.items() if label is None}
        assert {m["workspace"] for m in members} <= unclaimed
        for path in unclaimed:
            remove_slot(path)
        assert sorted(os.listdir(slots)) == sorted(
            [Path(claimed["workspace"]).name, claim_file(claimed["workspace"]).name]
        )
    finally:
        if owner.poll() is None:
            owner.kill()
        for handle in list_sandboxes(state_dir, include_dead=True):
            stop_handle(handle)


def test_a_process_keeps_few_pools(state_dir, tmp_path):
    from sandbox.pool import MAX_POOLS, close_pools, pool_for

    settings = SandboxSettings(state_dir=state_dir)
    pools = [pool_for(settings, tmp_path / f"slots{n}", 1) for n in range(MAX_POOLS + 1)]
    try:
        assert pool_for(settings, tmp_path / "slots0", 1) is not pools[0]  # pushed out
        assert pools[0]._closed and not pools[-1]._closed
        assert pool_for(settings, tmp_path / f"slots{MAX_POOLS}", 1) is pools[-1]
    finally:
        close_pools()
