"""Workspace checkpoints (`sandbox.checkpoint`, `sandbox.checkpoint_restore`): a save after
edits restored into a fresh copy gives the same tree, and what the agent controls (names,
symlinks, sizes, a tampered checkpoint file) cannot write or read outside the workspace."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from sandbox.checkpoint import META, CheckpointError, changes, save, scan
from sandbox.checkpoint_restore import restore

MAX = 10 * 2**20


def tree(root: Path) -> dict[str, str]:
    """Each entry's kind and content (a symlink's target), without following symlinks."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "-> " + os.readlink(path)
            elif path.is_dir():
                out[rel] = f"dir {oct(path.stat().st_mode & 0o777)}"
            else:
                mode = oct(path.stat().st_mode & 0o777)
                out[rel] = f"{mode} {hashlib.sha256(path.read_bytes()).hexdigest()}"
    return out


def fresh(base: Path, name: str) -> Path:
    """A copy of the INIT workspace `base` (what a new attempt's INIT makes)."""
    dest = base.parent / name
    shutil.copytree(base, dest, symlinks=True)
    return dest


@pytest.fixture
def init_ws(tmp_path) -> Path:
    ws = tmp_path / "ws1"
    for i in range(50):
        (ws / "pkg" / f"m{i // 10}").mkdir(parents=True, exist_ok=True)
        (ws / "pkg" / f"m{i // 10}" / f"f{i}.py").write_text(f"x = {i}\n")
    (ws / "README").write_text("hello\n")
    (ws / "link").symlink_to("README")
    (ws / "gone").mkdir()
    (ws / "gone" / "a.txt").write_text("a")
    return ws


def test_a_restored_checkpoint_is_the_workspace_at_its_turn(init_ws, tmp_path) -> None:
    base = fresh(init_ws, "base")  # pristine copy for the next attempt
    manifest = scan(init_ws)
    (init_ws / "pkg" / "m0" / "f0.py").write_text("x = 'edited'\n")
    (init_ws / "new" / "deep").mkdir(parents=True)
    (init_ws / "new" / "deep" / "n.sh").write_text("#!/bin/sh\n")
    os.chmod(init_ws / "new" / "deep" / "n.sh", 0o755)
    shutil.rmtree(init_ws / "gone")
    (init_ws / "README").unlink()
    (init_ws / "README").mkdir()  # a file became a folder
    (init_ws / "link").unlink()
    (init_ws / "link").symlink_to("/etc/passwd")  # a symlink out is stored as a symlink
    (init_ws / "pkg" / "m1" / "f10.py").write_text("x = 10\n")  # same size, same content, new ctime
    dest = tmp_path / "ckpt.tar"
    saved = save(init_ws, manifest, dest, turn=3, max_bytes=MAX)
    assert saved.written and saved.deleted == 2 and saved.entries <= 10
    target = fresh(base, "ws2")
    done = restore(target, dest)
    assert done.turn == 3 and tree(target) == tree(init_ws)
    assert os.readlink(target / "link") == "/etc/passwd"


def test_a_forged_mtime_is_still_seen(init_ws, tmp_path) -> None:
    manifest = scan(init_ws)
    path = init_ws / "pkg" / "m0" / "f1.py"
    st = path.stat()
    path.write_text("x = 9\n")  # same size
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back; ctime cannot be
    changed, _ = changes(manifest, scan(init_ws))
    assert "pkg/m0/f1.py" in changed


def test_a_checkpoint_over_the_bound_is_skipped_and_the_last_good_one_stays(init_ws, tmp_path) -> None:
    manifest = scan(init_ws)
    dest = tmp_path / "ckpt.tar"
    (init_ws / "small").write_text("s")
    assert save(init_ws, manifest, dest, 1, max_bytes=1000).written
    with open(init_ws / "huge.bin", "wb") as f:
        f.truncate(5000)  # sparse: costs nothing on disk, counts its size
    skipped = save(init_ws, manifest, dest, 2, max_bytes=1000)
    assert not skipped.written and skipped.skipped == "over_bound" and skipped.bytes >= 5000
    target = fresh(fresh(init_ws, "unused"), "ws2")
    assert restore(target, dest).turn == 1  # the previous checkpoint, intact


def test_a_symlink_in_the_workspace_is_never_read_through(init_ws, tmp_path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("host secret")
    manifest = scan(init_ws)
    (init_ws / "out").symlink_to(secret)
    (init_ws / "keylink").symlink_to(secret / "key")
    dest = tmp_path / "ckpt.tar"
    assert save(init_ws, manifest, dest, 0, MAX).written
    with tarfile.open(dest) as tar:
        names = {m.name: m for m in tar.getmembers()}
        assert names["out"].issym() and names["keylink"].issym()
        assert not any(n.startswith("out/") for n in names)
        assert all(b"host secret" not in (tar.extractfile(m).read() if m.isfile() else b"") for m in names.values())


def _tampered(dest: Path, members: list[tuple[tarfile.TarInfo, bytes]], deleted=()) -> Path:
    meta = json.dumps({"version": 1, "turn": 0, "deleted": list(deleted)}).encode()
    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(META)
        info.size = len(meta)
        tar.addfile(info, io.BytesIO(meta))
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return dest


def _file(name: str) -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), b"pwned"


def _link(name: str, target: str) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, target
    return info, b""


@pytest.mark.parametrize(
    "members, deleted",
    [
        ([_file("../escaped")], []),
        ([_file("/tmp/absolute-escape")], []),
        ([_file("a/../../escaped")], []),
        ([_file("ok")], ["../outside"]),
        ([_file("ok")], ["/etc"]),
        ([_link("d", "/OUTSIDE"), _file("d/escaped")], []),  # through a symlink it made
        ([_file("./dot")], []),
    ],
    ids=["dotdot", "absolute", "nested-dotdot", "delete-dotdot", "delete-absolute", "via-symlink", "dot"],
)
def test_a_tampered_checkpoint_is_refused_and_writes_nothing_outside(init_ws, tmp_path, members, deleted) -> None:
    outside = tmp_path / "OUTSIDE"
    outside.mkdir()
    members = [
        (_link("d", str(outside))[0], b"") if m[0].issym() and m[0].linkname == "/OUTSIDE" else m for m in members
    ]
    dest = _tampered(tmp_path / "bad.tar", members, deleted)
    before = tree(tmp_path / "OUTSIDE"), sorted(os.listdir(tmp_path))
    with pytest.raises(CheckpointError):
        restore(init_ws, dest)
    assert (tree(outside), sorted(os.listdir(tmp_path))) == before
    assert not (tmp_path / "escaped").exists() and not Path("/tmp/absolute-escape").exists()


def test_a_symlink_already_in_the_workspace_is_not_written_through(init_ws, tmp_path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (init_ws / "sub").symlink_to(outside)  # say INIT (or a tampered restore) left one
    dest = _tampered(tmp_path / "bad.tar", [_file("sub/x")])
    with pytest.raises(CheckpointError):
        restore(init_ws, dest)
    assert list(outside.iterdir()) == []
    (init_ws / "victim").symlink_to(outside / "victim")  # a file member over a symlink replaces it
    restore(init_ws, _tampered(tmp_path / "ok.tar", [_file("victim")]))
    assert not (outside / "victim").exists() and (init_ws / "victim").read_bytes() == b"pwned"


def test_hard_links_and_devices_are_refused(init_ws, tmp_path) -> None:
    hard = tarfile.TarInfo("h")
    hard.type, hard.linkname = tarfile.LNKTYPE, "/etc/passwd"
    dev = tarfile.TarInfo("dev")
    dev.type = tarfile.CHRTYPE
    for member in (hard, dev):
        with pytest.raises(CheckpointError, match="type"):
            restore(init_ws, _tampered(tmp_path / "bad.tar", [(member, b"")]))


def test_a_setuid_bit_is_not_restored(init_ws, tmp_path) -> None:
    info, data = _file("suid")
    info.mode = 0o4755
    restore(init_ws, _tampered(tmp_path / "s.tar", [(info, data)]))
    assert (init_ws / "suid").stat().st_mode & 0o7777 == 0o755


def test_not_a_checkpoint_is_refused(init_ws, tmp_path) -> None:
    with tarfile.open(tmp_path / "plain.tar", "w") as tar:
        tar.addfile(*_file("x")[:1])
    with pytest.raises(CheckpointError, match="meta"):
        restore(init_ws, tmp_path / "plain.tar")
