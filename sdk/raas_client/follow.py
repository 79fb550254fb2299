"""Following a job from the command line into a JSONL file that a later follow can resume.

`raas submit --wait --out F` and `raas results JOB --follow --out F` append one line per
finished rollout and flush it. If the command dies (gateway gone longer than the retry
budget, Ctrl-C, a crashed machine), running `raas results JOB --follow --out F` again reads F,
drops a torn last line, and appends only the rollouts F does not hold yet: every rollout ends
up in F exactly once, in completion order.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from raas_client.models import RolloutView

SUMMARY_FIELDS = ("outcome", "reward", "error")


class ResultsFileError(ValueError):
    """F cannot be resumed (another job's rows, a corrupt line in the middle)."""


def out_row(item: RolloutView) -> dict[str, Any]:
    """A finished rollout's line in the JSONL file: the record the results API returns, whole
    (`raas_client.models.RolloutView`: metrics, `group_complete`, `failure_class`, extra with the
    turn boundaries), so `RolloutView.model_validate(json.loads(line))` reads it back."""
    return item.model_dump(mode="json")


@dataclass
class ResultsFile:
    """A JSONL file of one job's finished rollouts, opened for appending what it lacks.

    `cursor` is the highest `seq` up to which F holds every rollout (results are numbered
    1, 2, ... in completion order), so the follow asks the gateway for what comes after it;
    `ids` skips any later row F already has. `repaired` counts the bytes of a torn last line
    that was cut off (the row is fetched again).
    """

    path: Path
    job_id: str
    ids: set[str] = field(default_factory=set)
    summary: list[dict[str, Any]] = field(default_factory=list)
    cursor: int = 0
    repaired: int = 0
    _sink: IO[str] | None = None

    @classmethod
    def open(cls, path: Path, job_id: str, fresh: bool = False) -> ResultsFile:
        """Open F to append to, resuming what it holds unless `fresh` (then it is emptied)."""
        out = cls(path, job_id)
        if fresh or not path.exists():
            path.write_text("")
        else:
            out._load()
        out._sink = path.open("a")
        return out

    def _load(self) -> None:
        data = self.path.read_bytes()
        cut = data.rfind(b"\n") + 1
        if cut < len(data):  # died mid-write: drop the torn line, it is fetched again
            self.repaired = len(data) - cut
            with self.path.open("r+b") as f:
                f.truncate(cut)
        seqs: set[int] = set()
        for n, line in enumerate(data[:cut].decode().splitlines(), 1):
            if not line.strip():
                continue
            row = self._parse(line, n)
            self._remember(row)
            if isinstance(row.get("seq"), int):
                seqs.add(row["seq"])
        while self.cursor + 1 in seqs:
            self.cursor += 1

    def _parse(self, line: str, n: int) -> dict[str, Any]:
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ResultsFileError(
                f"{self.path}:{n}: not JSON ({exc}); only a torn last line is repaired, so this file cannot be resumed"
            ) from None
        if not isinstance(row, dict) or "rollout_id" not in row:
            raise ResultsFileError(f"{self.path}:{n}: not a rollout row (no rollout_id)")
        if row.get("job_id") != self.job_id:
            raise ResultsFileError(
                f"{self.path} holds rollouts of job {row.get('job_id')}, not {self.job_id}: choose another --out file"
            )
        return row

    def _remember(self, row: dict[str, Any]) -> None:
        self.ids.add(row["rollout_id"])
        self.summary.append({k: row.get(k) for k in SUMMARY_FIELDS})

    def add(self, item: RolloutView) -> bool:
        """Append a finished rollout unless F has it; True when written."""
        row = out_row(item)
        if row["rollout_id"] in self.ids:
            return False
        if self._sink is None:
            raise RuntimeError(f"{self.path} is closed")
        self._sink.write(json.dumps(row) + "\n")
        self._sink.flush()  # a crash loses at most the line being written
        self._remember(row)
        return True

    def close(self) -> None:
        """Flush and close F."""
        if self._sink is not None:
            self._sink.close()
            self._sink = None
