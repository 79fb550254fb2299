"""Fork slots (`sandbox/toolserver/attach.py`): warm bwrap sandboxes whose workspace becomes a
copy-on-write fork of a group's layer only when they are claimed.

Real bwrap, real overlays. What must hold: a slot serves nothing before its claim and mounts
exactly the layer named, once; no process inside keeps the mounter's capabilities after the
claim; the agent reaches neither another layer nor the slot's staging folders; a slot that
cannot take its layer is stopped (its rollout starts cold) and leaves nothing behind; a
group's first ask starts a slot per sample to come, so its samples all start warm.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sandbox import SandboxOptions, SandboxSettings, get_runtime, list_sandboxes, stop_handle
from sandbox.bwrap import unprivileged_uid
from sandbox.errors import ProtocolError, SandboxError
from sandbox.handles import POOL_LABEL, give_workspace
from sandbox.overlay import fork_folder
from sandbox.pool import WarmPool, remove_slot, slot_of
from sandbox.spec import ForkSlot, SandboxSpec
from sandbox.toolserver.procs import descendants

pytestmark = pytest.mark.skipif(
    get_runtime("bwrap").fork_slots_unavailable_reason() is not None, reason="no fork slots here"
)
CAP_SYS_ADMIN = 1 << 21


def make_layer(layers: Path, name: str, files: dict[str, str]) -> str:
    """A prepared layer as a group's preparer leaves it: owned by the sandboxes' uid."""
    path = layers / name
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    uid = unprivileged_uid(SandboxSettings())
    if uid is not None:
        give_workspace(str(path), uid)
    return str(path)


@pytest.fixture
def layers(tmp_path) -> Path:
    folder = tmp_path / "layers"
    folder.mkdir(mode=0o711)
    make_layer(folder, "L1", {"README": "layer one\n", "pkg/mod.py": "VALUE = 1\n"})
    make_layer(folder, "L2", {"SECRET-OF-L2": "another group's\n"})
    return folder


@pytest.fixture
def slot(tmp_path, state_dir, layers):
    """A fork slot started by hand (not yet claimed); stopped at teardown."""
    ws, work = fork_folder(tmp_path / "slot")
    spec = SandboxSpec(workspace=ws, fork_slot=ForkSlot(layers=str(layers), work=work))
    sb = get_runtime("bwrap", state_dir=state_dir).start(spec, label="slot:1")
    yield sb
    stop_handle(sb.handle)


@pytest.fixture
def pool(tmp_path, state_dir):
    pool = WarmPool(SandboxSettings(state_dir=state_dir), tmp_path / "slots", 1)
    yield pool
    pool.close()
    for handle in list_sandboxes(state_dir, include_dead=True):
        stop_handle(handle)


def caps_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no CapEff for {pid}")


def wait_ready(pool: WarmPool, count: int) -> None:
    end = time.monotonic() + 90
    while pool.stats()["ready"] < count and time.monotonic() < end:
        time.sleep(0.05)
    assert pool.stats()["ready"] >= count, pool.stats()


def test_nothing_is_served_before_the_claim_and_a_slot_attaches_once(slot):
    with pytest.raises(ProtocolError, match="before the fork slot's layer is attached"):
        slot.bash("ls")
    with pytest.raises(ProtocolError, match="before the fork slot's layer is attached"):
        slot.read_file("README")
    for bad in ("..", "L1/../L2", ".hidden", "", "a,lowerdir=/", "L1:L2"):
        with pytest.raises(ProtocolError, match="not a layer name"):
            slot.attach_layer(bad)
    assert slot.ping().version >= 1  # still there, still unattached
    slot.attach_layer("L1")
    assert slot.bash("cat README pkg/mod.py; pwd").output == f"layer one\nVALUE = 1\n{slot.workspace}\n"
    with pytest.raises(ProtocolError, match="already a fork of 'L1'"):
        slot.attach_layer("L2")
    assert "SECRET" not in slot.bash("ls -A").output


def test_a_missing_layer_is_an_error_and_nothing_is_mounted(slot):
    with pytest.raises(ProtocolError, match="no layer 'gone'"):
        slot.attach_layer("gone")
    # the one-shot mounter is spent: the slot is of no further use (the pool stops it)
    with pytest.raises(SandboxError):
        slot.attach_layer("L1")


def test_no_capability_outlives_the_claim(slot):
    init = slot.handle["init_pid"]
    before = {pid: caps_of(pid) for pid in descendants(init)}
    assert any(caps & ~CAP_SYS_ADMIN for caps in before.values()), "the mounter holds the mount's capabilities"
    assert caps_of(slot.handle["server_pid"]) == CAP_SYS_ADMIN  # the server lowered its own at once
    slot.attach_layer("L1")
    assert slot.bash("grep CapEff /proc/self/status").output.split() == ["CapEff:", "0000000000000000"]
    after = {pid: caps_of(pid) for pid in descendants(init)}
    assert all(caps & ~CAP_SYS_ADMIN == 0 for caps in after.values()), after  # the mounter is gone
    assert set(before) - set(after), "the mounter exited"


def test_the_agent_reaches_no_other_layer_and_no_staging_folder(slot, layers):
    slot.attach_layer("L1")
    r = slot.bash(
        "find / -xdev -name 'SECRET-OF-L2' 2>/dev/null; cat /run/raas-layers/L2/SECRET-OF-L2; "
        "ls /run/raas-fork/work; umount /run/raas-layers; umount -l /run/raas-layers; "
        "mount -t tmpfs none /tmp/x 2>&1 | head -1; echo end"
    )
    assert "another group's" not in r.output and r.output.endswith("end\n")
    assert r.output.count("Permission denied") >= 2 and "must be superuser" in r.output, r.output
    assert slot.bash("echo mine > README; rm -rf pkg; ls -A").output == "README\n"
    assert Path(layers, "L1", "README").read_text() == "layer one\n"
    assert Path(layers, "L1", "pkg", "mod.py").is_file()


def test_a_group_asks_ahead_and_every_sample_claims_a_started_slot(pool, layers):
    options = SandboxOptions()
    pool.want(options, "bwrap", str(layers), group="job/i1", samples=3)
    wait_ready(pool, 4)  # size 1, plus one per fork to come
    lower = str(layers / "L1")
    forks = []
    for k in range(3):
        t0 = time.monotonic()
        sb = pool.claim(options, "bwrap", f"r{k}:1", lower=lower, group="job/i1")
        forks.append((sb, time.monotonic() - t0))
        assert sb is not None and sb.handle["overlay"] == {"lower": lower, "work": sb.handle["overlay"]["work"]}
    assert pool.stats()["claims"] == 3 and pool.stats()["misses"] == 0
    (a, _), (b, _), (c, _) = forks
    assert a.bash("echo A > README; touch only-a").exit_code == 0
    assert b.bash("cat README; ls -A1").output == "layer one\nREADME\npkg\n"
    assert c.bash("rm -rf ./* ./.[!.]*; ls -A | wc -l").output == "0\n"
    assert b.bash("cat pkg/mod.py").output == "VALUE = 1\n"  # a sibling's wipe changes nothing
    for sb, _ in forks:
        sb.stop()
        assert Path(sb.workspace, "README").exists() == (sb is not c)  # settled: what it saw
        remove_slot(slot_of(sb.handle))
    assert Path(layers, "L1", "README").read_text() == "layer one\n"
    # the group has taken its forks: the shape goes back to `size`
    end = time.monotonic() + 30
    while pool.stats()["ready"] > 1 and time.monotonic() < end:
        time.sleep(0.1)
    assert pool.stats()["ready"] == 1


def test_a_slot_that_cannot_take_its_layer_is_stopped_and_the_claim_misses(pool, layers, state_dir):
    options = SandboxOptions()
    pool.want(options, "bwrap", str(layers))
    wait_ready(pool, 1)
    assert pool.claim(options, "bwrap", "r:1", lower=str(layers / "no-such-layer")) is None
    time.sleep(0.5)
    members = [h for h in list_sandboxes(state_dir) if h.get("label") in (POOL_LABEL, "r:1")]
    claimed = [h for h in members if h.get("label") == "r:1"]
    assert claimed == []  # stopped, its slot folder removed
    for handle in members:
        assert os.path.isdir(slot_of(handle))
    assert not any(Path(pool.slots_dir).glob("*.claim"))


def test_a_claim_waits_for_a_slot_being_started_rather_than_start_cold(pool, layers):
    options = SandboxOptions()
    pool.want(options, "bwrap", str(layers))
    end = time.monotonic() + 30
    while not any(s.starting for s in pool._shapes.values()) and time.monotonic() < end:
        time.sleep(0.005)  # the filler has begun the slot's start
    assert pool.stats()["ready"] == 0
    sb = pool.claim(options, "bwrap", "r:1", lower=str(layers / "L1"))
    assert sb is not None and pool.stats()["misses"] == 0
    assert sb.bash("cat README").output == "layer one\n"
    sb.stop()
    remove_slot(slot_of(sb.handle))


def test_a_workdir_inside_the_workspace_is_there_after_the_claim(tmp_path, state_dir, layers):
    ws, work = fork_folder(tmp_path / "wd")
    spec = SandboxSpec(workspace=ws, workdir=f"{ws}/pkg/deep", fork_slot=ForkSlot(layers=str(layers), work=work))
    sb = get_runtime("bwrap", state_dir=state_dir).start(spec, label="slot:wd")
    try:
        sb.attach_layer("L1")
        assert sb.bash("pwd; ls -1 ..").output == f"{ws}/pkg/deep\ndeep\nmod.py\n"
    finally:
        stop_handle(sb.handle)


def test_the_operator_caps_the_slots_a_process_keeps_for_its_groups(tmp_path, layers):
    """`RAAS_SANDBOX_FORK_SLOTS` (here 2, pool size 1): a group of 6 samples gets one slot
    beyond the pool's size, not six; the claims past it start cold (forks still work)."""
    from core.settings import Settings
    from tasks.sandboxing.sandboxes import warm_pool

    settings = Settings(home=tmp_path / "home", sandbox_pool_size=1, sandbox_fork_slots=2)
    pool = warm_pool(settings)
    try:
        assert pool.max_slots == 2 and pool.size == 1
        pool.want(SandboxOptions(), "bwrap", str(layers), group="job/i1", samples=6)
        wait_ready(pool, 2)
        time.sleep(1.0)  # nothing more is started
        assert pool.stats()["ready"] == 2, pool.stats()
    finally:
        pool.close()
        for handle in list_sandboxes(settings.sandbox_dir, include_dead=True):
            stop_handle(handle)
