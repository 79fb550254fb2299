"""Copy-on-write workspaces (`sandbox.overlay`): real bwrap forks of one prepared lower layer.

Each fork sees the lower's files, writes only to its own upper layer, never sees a sibling's
writes and never changes the lower; when it stops, the host reads the merged view it saw.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from sandbox import SandboxOptions, SandboxSettings, SandboxStartError, get_runtime, stop_handle
from sandbox.bwrap import unprivileged_uid
from sandbox.handles import give_workspace
from sandbox.overlay import copy_lower, remove_tree, settle
from sandbox.pool import WarmPool, remove_slot, slot_of
from sandbox.workspace import disk_usage, walk
from tests.sandbox.conftest import fork_fields, shared_lower

pytestmark = pytest.mark.skipif(
    get_runtime("bwrap").overlay_unavailable_reason() is not None, reason="bwrap cannot mount overlays here"
)


def tree_digest(root: str) -> str:
    """A hash of every regular file's path and bytes below `root` (links never followed)."""
    digest = hashlib.sha256()
    for rel in sorted(walk(root).files):
        digest.update(rel.encode() + b"\0" + Path(root, rel).read_bytes() + b"\0")
    return digest.hexdigest()


@pytest.fixture
def lower(tmp_path) -> str:
    return shared_lower(tmp_path)


def fork(start, tmp_path, lower: str, name: str):
    return start("bwrap", label=f"fork:{name}", **fork_fields(tmp_path / name, lower))


def test_forks_share_reads_and_keep_writes_private(start, tmp_path, lower):
    before = tree_digest(lower)
    a, b = fork(start, tmp_path, lower, "a"), fork(start, tmp_path, lower, "b")
    assert a.bash("cat pkg/mod.py README").output == "VALUE = 1\nshared\n"
    assert a.bash("echo 'VALUE = 2' > pkg/mod.py && echo new > added.txt").exit_code == 0
    assert b.bash("cat pkg/mod.py; ls -1").output == "VALUE = 1\nREADME\npkg\n"
    # the host sees only the fork's own changes while it runs: its upper layer
    assert sorted(walk(a.workspace).files) == ["added.txt", "pkg/mod.py"]
    assert walk(b.workspace).files == {}
    assert tree_digest(lower) == before


def test_a_fork_that_wipes_its_workspace_changes_nothing_for_its_siblings(start, tmp_path, lower):
    before = tree_digest(lower)
    wiper, sibling = fork(start, tmp_path, lower, "wiper"), fork(start, tmp_path, lower, "sibling")
    r = wiper.bash("rm -rf ./* .[!.]* 2>/dev/null; ls -A | wc -l; echo junk > README; chmod -R 000 . ; true")
    assert r.output.splitlines()[0] == "0"
    wiper.bash("chmod 700 . && rm -rf ./* && mkdir pkg && echo 'VALUE = 666' > pkg/mod.py")
    assert sibling.bash("cat pkg/mod.py README").output == "VALUE = 1\nshared\n"
    assert tree_digest(lower) == before
    # the shared layer is not even reachable: the sandbox sees its overlay, nothing else
    assert "lower" not in wiper.bash("cat /proc/self/mountinfo | grep -v overlay; ls /").output


def test_the_host_reads_the_merged_view_once_the_fork_stops(start, tmp_path, lower):
    sb = fork(start, tmp_path, lower, "m")
    sb.bash("echo 'VALUE = 3' > pkg/mod.py && rm README && mkdir -p docs && echo d > docs/x.md")
    sb.bash("mkdir gone && echo g > gone/f && rm -rf pkg && mkdir pkg && echo only > pkg/new.py")
    inside = sb.bash("find . -type f | sort | xargs sha256sum").output
    sb.stop()
    view = sb.workspace
    assert sorted(walk(view).files) == ["docs/x.md", "gone/f", "pkg/new.py"]  # pkg/ was opaque
    files = sorted(walk(view).files)
    host = "".join(f"{hashlib.sha256(Path(view, r).read_bytes()).hexdigest()}  ./{r}\n" for r in files)
    assert host == inside
    settle(sb.handle)  # again (a release stops once more): nothing changes
    assert sorted(walk(view).files) == ["docs/x.md", "gone/f", "pkg/new.py"]
    assert Path(lower, "README").read_text() == "shared\n"


def test_a_fork_costs_only_its_own_changes_on_disk(start, tmp_path):
    lower = tmp_path / "big"
    lower.mkdir()
    for i in range(200):
        (lower / f"f{i}.bin").write_bytes(os.urandom(16384))
    from sandbox.bwrap import unprivileged_uid
    from sandbox.handles import give_workspace
    from sandbox.settings import SandboxSettings

    uid = unprivileged_uid(SandboxSettings())
    if uid is not None:
        give_workspace(str(lower), uid)
    sb = fork(start, tmp_path, str(lower), "d")
    sb.bash("echo changed > f7.bin")
    used, entries = disk_usage(sb.workspace)
    assert entries == 1 and used <= 8192
    sb.stop()  # the merged view links the lower's data, it copies none
    assert Path(sb.workspace, "f8.bin").stat().st_ino == (lower / "f8.bin").stat().st_ino
    assert Path(sb.workspace, "f7.bin").read_text() == "changed\n"


def test_the_warm_pool_starts_forks_of_a_layer_ahead(tmp_path, state_dir):
    lower = shared_lower(tmp_path)
    pool = WarmPool(SandboxSettings(state_dir=state_dir), tmp_path / "slots", 1)
    try:
        assert pool.claim(SandboxOptions(), "bwrap", "r:1", lower=lower) is None  # a miss teaches
        end = time.monotonic() + 60
        while pool.stats()["ready"] < 1 and time.monotonic() < end:
            time.sleep(0.05)
        t0 = time.monotonic()
        sb = pool.claim(SandboxOptions(), "bwrap", "r:1", lower=lower)
        claimed_ms = (time.monotonic() - t0) * 1000
        assert sb is not None and sb.label == "r:1" and claimed_ms < 1000
        assert pool.claim(SandboxOptions(), "bwrap", "r:2") is None  # a plain shape is another
        sb.bash("echo mine > README")
        assert Path(lower, "README").read_text() == "shared\n"
        sb.stop()
        assert Path(sb.workspace, "README").read_text() == "mine\n"
        assert Path(sb.workspace, "pkg", "mod.py").read_text() == "VALUE = 1\n"
        stop_handle(sb.handle)
        remove_slot(slot_of(sb.handle))
        assert not Path(slot_of(sb.handle)).exists()
        remove_tree(lower)  # the group is past RUN: the next group's layer takes a slot too
        other = tmp_path / "other"
        other.mkdir()
        (other / "NEXT").write_text("next group\n")
        uid = unprivileged_uid(SandboxSettings())
        if uid is not None:
            give_workspace(str(other), uid)
        end = time.monotonic() + 60
        while pool.stats()["ready"] < 1 and time.monotonic() < end:
            time.sleep(0.05)
        nxt = pool.claim(SandboxOptions(), "bwrap", "r:3", lower=str(other))
        assert nxt is not None and nxt.bash("cat NEXT; ls").output == "next group\nNEXT\n"
        nxt.stop()
        stop_handle(nxt.handle)
        remove_slot(slot_of(nxt.handle))
    finally:
        pool.close()


def test_runtimes_without_overlays_refuse_a_fork_and_the_copy_fallback_is_whole(start, tmp_path, lower):
    with pytest.raises(SandboxStartError, match="copy-on-write"):
        start("local", **fork_fields(tmp_path / "l", lower))
    target = tmp_path / "copy"
    target.mkdir()
    copy_lower(lower, str(target))
    assert tree_digest(str(target)) == tree_digest(lower)


def test_a_workspace_shown_at_another_path_is_the_same_folder_there(start, tmp_path, lower):
    """A branch's sandbox (`workspace_inside`): its own workspace, plain or a fork, at the path
    its parent's prompt names; the host path is not there, the local runtime refuses."""
    shown = str(tmp_path / "parent-1")  # the parent's workspace: gone from the host
    plain = tmp_path / "own"
    plain.mkdir()
    (plain / "f.txt").write_text("mine\n")
    sb = start("bwrap", workspace=str(plain), workspace_inside=shown)
    assert sb.bash("pwd; cat f.txt; echo w > new.txt").output == f"{shown}\nmine\n"
    assert (plain / "new.txt").read_text() == "w\n" and not os.path.exists(shown)
    assert sb.bash(f"test -e {plain} && echo there || echo absent").output.strip() == "absent"
    forked = start("bwrap", workspace_inside=shown, **fork_fields(tmp_path / "f", lower))
    assert forked.bash("pwd; cat README").output == f"{shown}\nshared\n"
    with pytest.raises(SandboxStartError, match="cannot show workspace"):
        start("local", workspace=str(plain), workspace_inside=shown)
