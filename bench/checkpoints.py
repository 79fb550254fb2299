"""What workspace checkpoints cost (issue 41): the per-turn save and the restore, on a real-size
git repository, for a few edit patterns an agent makes.

A repository of `--files` Python files (sizes 10 B - 4 KiB, in folders of 100) is committed with
git; INIT's manifest is taken of it (`sandbox.checkpoint.scan`). Each pattern then makes
`--turns` turns of edits, and after each one a checkpoint is saved exactly as RUN saves it
(`sandbox.checkpoint.save`, one tar, fsynced and renamed). The last checkpoint is restored into
a fresh copy of the repository (`sandbox.checkpoint_restore.restore`) and the restored tree is
checked to hash like the edited one. Prints one JSON record, then a table.

    python bench/checkpoints.py [--files 3000] [--turns 10]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox.checkpoint import save, scan
from sandbox.checkpoint_restore import restore

MAX_BYTES = 256 * 2**20  # the job default (`resume.checkpoint_max_bytes`)
GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid", "-c", "commit.gpgsign=false"]


def make_repo(root: Path, files: int) -> None:
    """`files` Python sources in folders of 100, committed and packed (as a swe INIT leaves a
    repository: `agents.handlers.swe.repo`)."""
    for i in range(files):
        folder = root / "src" / f"pkg{i // 100}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * (1 + (i * 7919) % 120))
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=root, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=root, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", "import"], cwd=root, check=True)
    subprocess.run(["git", "gc", "-q", "--prune=now"], cwd=root, check=True)  # packed, as swe INIT leaves it


def tree_hash(root: Path) -> str:
    """Every entry's path, kind and content (a symlink's target), hashed."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            digest.update(str(path.relative_to(root)).encode())
            if path.is_symlink():
                digest.update(b"L" + os.readlink(path).encode())
            elif path.is_file():
                digest.update(b"F" + path.read_bytes())
    return digest.hexdigest()


def edit_one_file(ws: Path, turn: int) -> None:
    path = ws / "src" / "pkg3" / f"mod{300 + turn}.py"
    path.write_text(path.read_text() + f"# turn {turn}\n")


def add_files(ws: Path, turn: int) -> None:
    folder = ws / "tests" / f"t{turn}"
    folder.mkdir(parents=True, exist_ok=True)
    for k in range(20):
        (folder / f"test_{k}.py").write_text(f"def test_{k}():\n    assert {k} == {k}\n")


def edit_and_commit(ws: Path, turn: int) -> None:
    edit_one_file(ws, turn)
    subprocess.run([*GIT, "commit", "-qam", f"turn {turn}"], cwd=ws, check=True)


def compile_all(ws: Path, turn: int) -> None:
    """Turn 0 byte-compiles the whole tree (an agent running the tests makes __pycache__)."""
    if turn == 0:
        subprocess.run([sys.executable, "-m", "compileall", "-q", "src"], cwd=ws, check=True)
    edit_one_file(ws, turn)


def delete_folders(ws: Path, turn: int) -> None:
    shutil.rmtree(ws / "src" / f"pkg{turn}", ignore_errors=True)
    (ws / f"moved{turn}").symlink_to(f"src/pkg{turn + 1}")


PATTERNS: dict[str, Callable[[Path, int], None]] = {
    "edit one file per turn": edit_one_file,
    "20 new files per turn": add_files,
    "edit + git commit per turn": edit_and_commit,
    "compileall once (3000 .pyc), then edits": compile_all,
    "delete a folder + add a symlink per turn": delete_folders,
}


def run_pattern(base: Path, scratch: Path, name: str, edit: Callable[[Path, int], None], turns: int) -> dict:
    ws, fresh = scratch / "ws", scratch / "fresh"
    for path in (ws, fresh):
        shutil.rmtree(path, ignore_errors=True)
        shutil.copytree(base, path, symlinks=True)
    started = time.monotonic()
    manifest = scan(ws)
    manifest_seconds = time.monotonic() - started
    dest = scratch / "checkpoint.tar"
    saves = []
    for turn in range(turns):
        edit(ws, turn)
        saves.append(save(ws, manifest, dest, turn, MAX_BYTES))
    done = restore(fresh, dest)
    same = tree_hash(ws) == tree_hash(fresh)
    seconds = [s.seconds * 1000 for s in saves]
    return {
        "pattern": name,
        "entries": len(manifest),
        "manifest_ms": round(manifest_seconds * 1000, 1),
        "save_ms_p50": round(statistics.median(seconds), 1),
        "save_ms_max": round(max(seconds), 1),
        "last_bytes": saves[-1].bytes,
        "last_tar_bytes": dest.stat().st_size,
        "last_entries": saves[-1].entries,
        "restore_ms": round(done.seconds * 1000, 1),
        "restored_equal": same,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--turns", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="raas-bench-ckpt-") as tmp:
        scratch = Path(tmp)
        base = scratch / "repo"
        make_repo(base, args.files)
        rows = [run_pattern(base, scratch, name, edit, args.turns) for name, edit in PATTERNS.items()]
    print(json.dumps({"files": args.files, "turns": args.turns, "load": os.getloadavg()[0], "rows": rows}))
    print()
    print(
        "| pattern | entries | manifest ms | save ms p50 | save ms max | last checkpoint (content / tar) "
        "| restore ms | equal |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        size = f"{r['last_bytes'] / 1024:.1f} KiB / {r['last_tar_bytes'] / 1024:.1f} KiB ({r['last_entries']} entries)"
        print(
            f"| {r['pattern']} | {r['entries']} | {r['manifest_ms']} | {r['save_ms_p50']} | {r['save_ms_max']} "
            f"| {size} | {r['restore_ms']} | {r['restored_equal']} |"
        )


if __name__ == "__main__":
    main()
