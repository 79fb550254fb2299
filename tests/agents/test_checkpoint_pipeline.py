"""Workspace checkpoints end to end (issue 41): real gateway, Celery worker processes, bwrap
sandboxes, the reaper, the LLM simulator (a fake vLLM, named as such).

A `swe` rollout on a generated repository of a few thousand files appends the date to a file
(not idempotent), applies the fix and prints a content hash of the workspace; the node is lost
while the next turn is generated. The new attempt restores the checkpoint of turn 1 instead of
replaying turns 0-1: its first new turn prints the same hash and the same single date line,
and the rollout ends with the reward of an uninterrupted run; its checkpoints are gone after.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from agents.handlers.swe.repo import commit_sources
from bench.support.pipeline_harness import start_service
from fakellm.server import start_simulator
from sandbox.checkpoint_restore import read_meta
from tests.agents.test_replay_pipeline import _turns, lose_node_mid_turn

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = str(REPO / "tests" / "fixtures" / "smollm2-tokenizer")
CSV = json.loads((REPO / "examples/swe/instances.jsonl").read_text().splitlines()[0])
assert CSV["instance_id"] == "raas-examples__csvlite-1"
MARK = "CKPT-41 doubled quotes are dropped."
FILLER = 2500  # files besides the package: a real-size repository
STATE = "cat log.txt; wc -l < log.txt; find . -type f -not -path './.git/*' | sort | xargs sha256sum | sha256sum"


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


SCRIPT = {
    "by_instance": {
        MARK: [
            call("bash", command="date +%s%N >> log.txt; echo noted"),
            call("bash", command=f"cat > /tmp/fix.diff <<'EOF'\n{CSV['patch']}EOF\ngit apply /tmp/fix.diff && {STATE}"),
            {"text": call("bash", command=STATE), "latency": 4},
            call("submit"),
        ]
    }
}


@pytest.fixture(scope="module")
def repos(tmp_path_factory) -> tuple[Path, str]:
    """`big`: the csvlite example plus FILLER files, committed deterministically."""
    root = tmp_path_factory.mktemp("repos")
    src = root / "src"
    shutil.copytree(REPO / CSV["repo"], src)
    for i in range(FILLER):
        folder = src / "vendor" / f"pkg{i // 100}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"mod{i}.py").write_text(f"VALUE = {i}\n" * (1 + i % 40))
    base = commit_sources(src, root / "big")
    shutil.rmtree(src)
    return root, base


@pytest.fixture(scope="module")
def service(tmp_path_factory, built_env, repos):
    home = tmp_path_factory.mktemp("checkpoint-pipeline")
    (home / "envs").mkdir()
    (home / "envs" / "pytest").symlink_to(built_env("pytest", ["pytest"]))
    svc = start_service(home, concurrency=2, extra={"repo_root": str(repos[0])})
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def llm():
    url, stop = start_simulator(SMOLLM2, SCRIPT)
    yield {"servers": [{"url": url}], "tokenizer": SMOLLM2, "max_model_len": 8192}
    stop()


def _submit(service, llm, repos, **job: Any) -> tuple[str, str]:
    data = {k: v for k, v in CSV.items() if k not in ("instance_id", "patch")}
    data.update(repo="big", base_commit=repos[1], problem_statement=f"{MARK}\n\n{CSV['problem_statement']}")
    accepted = service.client.submit(
        "swe",
        [{"instance_id": "big-1", "data": data}],
        limits={"max_turns": 6},
        llm=llm,
        **job,
    )
    return accepted.job_id, accepted.rollout_ids[0]


def test_a_lost_sandbox_is_restored_from_its_checkpoint_not_replayed(service, llm, repos) -> None:
    job, plain_id = _submit(service, llm, repos, resume={"checkpoints": True})
    service.wait_done(job, timeout=240)
    plain = service.client.rollout(plain_id)
    assert (plain.outcome, plain.reward) == ("completed", 1.0), plain.error
    assert plain.metrics["checkpoints"]["saved"] == 4 and plain.metrics["restored_turns"] == 0

    job, rid = _submit(service, llm, repos, resume={"checkpoints": True})
    checkpoint = service.settings.checkpoints / rid / "1" / "checkpoint.tar"
    deadline = time.monotonic() + 120
    while not (checkpoint.exists() and read_meta(checkpoint)["turn"] == 1):  # turn 2 takes 4 s
        assert time.monotonic() < deadline, service.log_tail()
        time.sleep(0.05)
    lose_node_mid_turn(service, rid)
    service.wait_done(job, timeout=240)
    view = service.client.rollout(rid)

    assert (view.outcome, view.reward, view.attempt) == ("completed", plain.reward, 2), [
        (a.error, a.metrics if hasattr(a, "metrics") else None) for a in view.earlier_attempts
    ]
    assert _turns(service, rid) == [(1, 0), (1, 1), (2, 0), (2, 1), (2, 2), (2, 3)]
    at_turn_1 = view.turns[1].observation  # attempt 1's, carried
    assert view.turns[2].observation == at_turn_1  # same date line, one line, same content hash
    assert at_turn_1.splitlines()[1].strip() == "1"  # turn 0's append did not run again
    assert view.metrics["restored_turns"] == 2 and "replayed_turns" not in view.metrics
    assert view.metrics["checkpoints"]["restored"]["turn"] == 1
    for turn in view.turns[:2]:
        assert turn.extra["restored_from_checkpoint"] == 1 and turn.extra["replayed_from_attempt"] == 1
    assert "restored_from_checkpoint" not in view.turns[2].extra
    assert not (service.settings.checkpoints / rid).exists()  # removed once RUN was over


def test_without_checkpoints_the_same_loss_replays_and_appends_again(service, llm, repos) -> None:
    job, rid = _submit(service, llm, repos, resume={"on_divergence": "continue"})
    lose_node_mid_turn(service, rid)
    service.wait_done(job, timeout=240)
    view = service.client.rollout(rid)
    assert (view.outcome, view.reward, view.attempt) == ("completed", 1.0, 2), view.error
    assert view.metrics["replayed_turns"] == 2 and "restored_turns" not in view.metrics
    [divergence] = view.metrics["replay_divergences"]  # the date was appended again, another one
    assert divergence["turn"] == 1 and view.turns[2].observation != view.turns[1].observation
    assert not (service.settings.checkpoints / rid).exists()


def test_checkpoint_options_are_validated_at_submission(service, llm, repos) -> None:
    from raas_client import RaasHTTPError

    with pytest.raises(RaasHTTPError) as bad:
        _submit(service, llm, repos, resume={"checkpoints": True, "checkpoint_max_bytes": 0})
    assert "resume.checkpoint_max_bytes" in str(bad.value)
