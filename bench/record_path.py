"""CPU cost of the rollout record on its path (issue 24): one pydantic type from the LLM layer
to the SDK, against the dataclass copies it replaced.

A synthetic long trajectory (default 32k response tokens, 2k prompt, 40 messages, 20 turns)
goes through each hop the record makes, timed per call (median of `--repeat`):

  * `end of RUN`: the loop's copy of the session's record (`agents.loop._result`'s way: list()
    per array) vs the baseline, the old field-by-field copy into `RunResult`, and vs a
    `model_copy(deep=True)` (what a naive one-type copy would cost);
  * `EVAL reads`: `tasks.writes.records.stored_record` (validates the row's columns into the record)
    vs the baseline, the old unvalidated `RunResult(...)` from the columns;
  * `gateway view`: `raas_client.models.RolloutView(**record_fields(row), ...)` (validated, as the
    old `RolloutView(...)` was);
  * `SDK parse`: `RolloutView.model_validate` of the JSON the gateway sends.

Ratios against the baseline are what to compare across runs (the machine is shared).
Run: `.venv/bin/python bench/record_path.py [--tokens 32000] [--repeat 15]`.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import statistics
import sys
import time
import types
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from raas_client.models import RolloutView, Trajectory  # noqa: E402

from tasks.writes.records import record_fields, stored_record  # noqa: E402


def synthetic(tokens: int) -> Trajectory:
    """A long record as the builder leaves it."""
    rng = random.Random(7)
    ids = [rng.randrange(49152) for _ in range(tokens)]
    return Trajectory(
        prompt_ids=ids[:2000],
        response_ids=ids,
        response_logprobs=[-rng.random() for _ in ids],
        loss_mask=[1] * tokens,
        policy_versions=["step-1"] * 20,
        token_exact=True,
        messages=[{"role": "user", "content": "x" * 400}] * 40,
        finish_reason="stop",
        extra={
            "turn_boundaries": [[i * 10, i * 10 + 5] for i in range(20)],
            "message_token_counts": [tokens // 40] * 40,
        },
    )


def timed(fn, repeat: int) -> float:
    """Median milliseconds of one call."""
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - started) * 1000)
    return statistics.median(runs)


def loop_copy(traj: Trajectory) -> Trajectory:
    """`agents.loop._result`'s copy of the session's record."""
    fresh = {name: list(value) for name, value in traj if isinstance(value, list)}
    fresh["messages"] = [dict(m) for m in traj.messages]
    return traj.model_copy(
        update={**fresh, "outcome": "completed", "extra": {"answer": "4", **copy.deepcopy(traj.extra)}}
    )


def old_copy(traj: Trajectory) -> dict:
    """The baseline: main's field-by-field copy into the `RunResult` dataclass (as a dict)."""
    return dict(
        prompt_ids=list(traj.prompt_ids),
        response_ids=list(traj.response_ids),
        response_logprobs=list(traj.response_logprobs),
        loss_mask=list(traj.loss_mask),
        policy_versions=list(traj.policy_versions),
        token_exact=traj.token_exact,
        messages=[dict(m) for m in traj.messages],
        extra={"answer": "4", **copy.deepcopy(traj.extra)},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    traj = synthetic(args.tokens)
    row = types.SimpleNamespace(**record_fields(traj))  # a rollout row: columns named alike
    now = datetime.now(timezone.utc)
    identity = dict(
        rollout_id="r",
        job_id="j",
        instance_id="i",
        sample_index=0,
        status="done",
        attempt=1,
        reward=1.0,
        timing={"run": 1.0},
        created_at=now,
    )
    view = RolloutView(**record_fields(row), **identity)
    wire = view.model_dump_json()
    figures = {
        "tokens": args.tokens,
        "end_of_run_ms": timed(lambda: loop_copy(traj), args.repeat),
        "end_of_run_baseline_ms": timed(lambda: old_copy(traj), args.repeat),
        "end_of_run_deep_copy_ms": timed(lambda: traj.model_copy(deep=True), args.repeat),
        "eval_reads_ms": timed(lambda: stored_record(row), args.repeat),
        "eval_reads_baseline_ms": timed(lambda: dict(vars(row)), args.repeat),
        "gateway_view_ms": timed(lambda: RolloutView(**record_fields(row), **identity), args.repeat),
        "sdk_parse_ms": timed(lambda: RolloutView.model_validate(json.loads(wire)), args.repeat),
    }
    figures = {k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}
    print(json.dumps(figures))
    print(f"\n| hop ({args.tokens} response tokens) | ms | baseline ms | ratio |")
    print("| --- | --- | --- | --- |")
    for hop, key, base in [
        ("end of RUN: copy of the record", "end_of_run_ms", "end_of_run_baseline_ms"),
        ("end of RUN: model_copy(deep=True), not used", "end_of_run_deep_copy_ms", "end_of_run_baseline_ms"),
        ("EVAL reads the row (validated)", "eval_reads_ms", "eval_reads_baseline_ms"),
        ("gateway view", "gateway_view_ms", None),
        ("SDK parse of the JSON", "sdk_parse_ms", None),
    ]:
        baseline = figures[base] if base else None
        ratio = f"{figures[key] / baseline:.1f}x" if baseline else "-"
        print(f"| {hop} | {figures[key]} | {baseline if baseline is not None else '-'} | {ratio} |")


if __name__ == "__main__":
    main()
