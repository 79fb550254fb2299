"""py-spy for `bench/hot_path.py`: recording a RUN worker, and where its samples went.

`pip install py-spy` into the venv (not a dependency). Imported by the bench from its own
folder, so a baseline tree run with `--baseline-tree` uses this tree's copy.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# py-spy's sampling per `--profile-mode`: only the thread holding the GIL (where its Python
# CPU goes), every thread that is not idle (adds the work that released the GIL: the
# tokenizer's Rust, psycopg's C, socket calls), or every thread with its idle waits too.
PROFILE_MODES = {"gil": ["--gil"], "active": [], "idle": ["--idle"]}


def profile(pid: int, seconds: float, out: Path, mode: str = "gil") -> subprocess.Popen:
    """py-spy on the RUN worker (`mode`: PROFILE_MODES), as raw collapsed stacks."""
    spy = Path(sys.executable).with_name("py-spy")
    return subprocess.Popen(
        [
            str(spy),
            "record",
            "-p",
            str(pid),
            "-d",
            str(int(seconds)),
            "-r",
            "100",
            *PROFILE_MODES[mode],
            "-f",
            "raw",
            "-o",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


# Where a RUN worker's CPU can go, by a frame on the stack (inclusive shares of the samples).
PROFILE_FRAMES = {
    "new httpx.Client (SSL context)": "Client.__init__",
    "server acquisition": "RegisteredPool.acquire",
    "sticky take / lookup": "RegisteredPool.lookup",
    "generation mark + server read": "RegisteredPool.begin_generation",
    "cancel polling": "cancel_requested",
    "abort watcher threads": "abort_when",
    "record_turn (waiting thread)": "TurnWriter.record_turn",
    "turn writer thread": "TurnWriter._loop",
    "heartbeat thread": "Heartbeater._loop",
    "resume read (stored_turns)": "stored_turns",
    "claim": "claim",
    "hand-on to EVAL": "StageRun._hand_on",
    "LLM request (HTTP)": "LLMBackend._call",
    "tokenizer / template": "TrajectoryBuilder.add_messages",
    "prompt render": "TrajectoryBuilder.start",
    "drift audit": "TrajectoryBuilder.audit_drift",
    "search tool": "BM25Index.search",
    "session open (tokenizer load)": "LLMSession.open",
    "Celery consumer loop": "asynloop",
    "database (all)": "Session.execute",
    "SQLAlchemy Core execute (all)": "Connection.execute",
    "commit (all)": "Session.commit",
}


def profile_summary(path: Path) -> dict:
    """Share of GIL-holding samples under each of PROFILE_FRAMES, and the top leaves."""
    total, inclusive, leaves = 0, dict.fromkeys(PROFILE_FRAMES, 0), {}
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        frames = [f.split(" (")[0] for f in stack.split(";")[1:]]
        for label, frame in PROFILE_FRAMES.items():
            if frame in frames:
                inclusive[label] += n
        if frames:
            leaves[frames[-1]] = leaves.get(frames[-1], 0) + n
    top = sorted(leaves.items(), key=lambda kv: -kv[1])[:8]
    return {
        "samples": total,
        "share": {k: round(v / total, 3) for k, v in inclusive.items()} if total else {},
        "top_leaves": {k: round(v / total, 3) for k, v in top} if total else {},
    }
