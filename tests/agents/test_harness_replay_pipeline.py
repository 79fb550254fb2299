"""A lost harness RUN starts the harness over and answers its calls from the log, end to end:
real gateway, Celery worker processes, bwrap sandboxes, the reaper, real HTTP, the example
harness on the official `openai` SDK (unmodified) and the LLM simulator (a fake vLLM, named as
such), scripted per task.

The harness's third call takes 4 s to "generate"; once two calls are logged the RUN worker is
SIGKILLed (and, for a lost node, the rollout's sandbox with it). The reaper gives the rollout a
new attempt from INIT; its harness starts over in a fresh sandbox, and the endpoint answers the
calls that match the logged ones from the log (the task text names the workspace: the new
attempt's is shown at the logged path, so they match token for token), then generates live.

- The deterministic episode ends with the reward and the trajectory of an uninterrupted run, and
  the simulator generated at most one call twice (the one in flight).
- A harness that sees another observation (the time) diverges at the next call: recorded, live
  from there, and still a whole, rewarded episode.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from core.db import session_scope
from core.harnesses import EXAMPLE_AGENT
from core.models import Rollout, Turn
from fakellm.server import start_simulator
from bench.support.pipeline_harness import start_service

pytestmark = [pytest.mark.service, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures"
SMOLLM2 = str(FIXTURES / "smollm2-tokenizer")
QWEN_TEMPLATE = (FIXTURES / "qwen-style-template" / "chat_template.jinja").read_text()
KEPT = "[replay-kept] Start from 20, add 1, then double it."
NODE = "[replay-node] Start from 20, add 1, then double it."
CLOCK = "[replay-clock] Look at the clock, then answer 7."
ANSWERS = {KEPT: "42", NODE: "42", CLOCK: "7"}
SLOW = 4  # seconds the third call takes to "generate": the loss comes in the middle of it


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def counted(problem: str) -> list:
    return [
        call("bash", command="echo 20 > x"),
        call("bash", command="echo $(( $(cat x) + 1 )) > x"),
        {"text": call("bash", command="echo $(( $(cat x) * 2 )) > answer.txt"), "latency": SLOW},
        call("submit"),
    ]


SCRIPT = {
    "turn_marker": "<|im_start|>user",  # the tool results come back as user turns (Qwen template)
    "by_instance": {
        KEPT: counted(KEPT),
        NODE: counted(NODE),
        CLOCK: [
            call("bash", command="date +%s%N"),
            call("bash", command="echo 7 > answer.txt"),
            {"text": call("bash", command="cat answer.txt"), "latency": SLOW},
            call("submit"),
        ],
    },
}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    from sandbox.environments import build_environment

    home = tmp_path_factory.mktemp("harness-replay")
    (home / "envs").mkdir()
    built = build_environment("harness-openai-agent", ["openai", "anthropic", "pytest", EXAMPLE_AGENT])
    (home / "envs" / "openai-agent").symlink_to(built)
    svc = start_service(home, concurrency=2)
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def llm():
    url, stop = start_simulator(SMOLLM2, SCRIPT)
    yield {"servers": [{"url": url}], "tokenizer": SMOLLM2, "max_model_len": 8192, "chat_template_text": QWEN_TEMPLATE}
    stop()


def stats(llm: dict) -> dict[str, int]:
    return httpx.get(f"{llm['servers'][0]['url']}/sim/stats").json()


def submit(service, llm, problem: str) -> tuple[str, str]:
    accepted = service.client.submit(
        "harness",
        [{"instance_id": "p", "data": {"problem": problem, "answer": ANSWERS[problem]}}],
        llm=llm,
        sampling={"max_tokens": 256},
        agent_config={"harness": "openai-agent", "task": "math"},
    )
    return accepted.job_id, accepted.rollout_ids[0]


def logged(service, rollout_id: str) -> list[tuple[int, int]]:
    with session_scope(service.settings.db_url) as s:
        rows = s.execute(sa.select(Turn.attempt, Turn.index).where(Turn.rollout_id == rollout_id).order_by(Turn.id))
        return [tuple(r) for r in rows]


def lose_run(service, rollout_id: str, sandbox_too: bool, calls: int = 2, settle: Any = None) -> int:
    """Once `calls` calls are logged, SIGKILL the RUN pool (and the rollout's sandbox: bwrap and
    the init inside it, as a lost node does); the pool comes back empty, after `settle()` if
    given (a real server finishing the lost call first). The calls logged."""
    deadline = time.monotonic() + 120
    while len(logged(service, rollout_id)) < calls:
        assert time.monotonic() < deadline, service.log_tail()
        time.sleep(0.05)
    with session_scope(service.settings.db_url) as s:
        handle = s.get(Rollout, rollout_id).sandbox
    service.kill_worker("run", "node-a")
    for key in ("init_pid", "pid") if sandbox_too else ():
        try:
            os.kill(int(handle[key]), signal.SIGKILL)
        except (ProcessLookupError, KeyError, TypeError):
            pass
    before = len(logged(service, rollout_id))
    if settle is not None:
        settle()
    service.start_worker("run", "node-a", 2)
    return before


def generations(llm: dict, before: dict, problem: str) -> tuple[int, list[int]]:
    """(requests the simulator started for `problem`'s job since `before`, answers per call)."""
    now = stats(llm)
    per_call = [now.get(f"turn:{problem}:{t}", 0) - before.get(f"turn:{problem}:{t}", 0) for t in range(4)]
    return now.get("started", 0) - before.get("started", 0), per_call


def masked_text(view: Any, tok: Any) -> str:
    """The rollout's whole token sequence as text, its workspace path made a placeholder."""
    text = tok.decode(view.prompt_ids + view.response_ids)
    return text.replace(view.turns[0].extra["workspace"], "<workspace>")


def run_uninterrupted(service, llm, problem: str) -> Any:
    job, rid = submit(service, llm, problem)
    service.wait_done(job, timeout=300)
    view = service.client.rollout(rid)
    assert (view.outcome, view.reward, view.attempt) == ("completed", 1.0, 1), (view.error, service.log_tail())
    return view


@pytest.mark.parametrize(("problem", "sandbox_too"), [(KEPT, False), (NODE, True)], ids=["worker", "node"])
def test_a_lost_harness_run_is_answered_from_its_log_and_generates_only_the_call_in_flight(
    service, llm, problem, sandbox_too
) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(f"{SMOLLM2}/tokenizer.json")
    plain = run_uninterrupted(service, llm, problem)

    before = stats(llm)
    job, rid = submit(service, llm, problem)
    calls_logged = lose_run(service, rid, sandbox_too)
    service.wait_done(job, timeout=300)
    view = service.client.rollout(rid)
    started, per_call = generations(llm, before, problem)

    assert (view.outcome, view.reward) == ("completed", plain.reward), (view.error, service.log_tail())
    assert view.attempt == 2 and "stopped beating" in view.earlier_attempts[0].error  # INIT again
    assert calls_logged >= 2
    assert view.metrics["replayed_calls"] >= calls_logged and view.metrics["replay_divergences"] == []
    # the task text names the workspace: the new attempt's is shown at the logged path
    # (`workspace_inside`), so every logged call matched token for token, none by masking
    assert view.metrics["replay_masked_calls"] == 0
    logged = view.earlier_attempts[0].turns[0].extra["workspace"]
    assert all(t.extra["workspace"] == logged for t in view.turns)
    assert [t.extra.get("replayed_from_attempt") for t in view.turns][:calls_logged] == [1] * calls_logged
    # the same episode as the uninterrupted run: generated ids, observations, mask (the
    # simulator's logprobs depend on the position, which the workspace path's length moves)
    assert (view.response_ids, view.loss_mask) == (plain.response_ids, plain.loss_mask)
    assert masked_text(view, tok) == masked_text(plain, tok)
    # the replayed calls are the logged ones, logprobs and tool-call ids included
    for old, new in zip(view.earlier_attempts[0].turns, view.turns[:calls_logged]):
        assert (new.generated_ids, new.logprobs) == (old.generated_ids, old.logprobs)
        assert new.extra["tool_call_ids"] == old.extra["tool_call_ids"]
    assert view.metrics["turns"] == 4 and len(view.turns) == 4
    assert per_call[:calls_logged] == [1] * calls_logged  # the logged calls were never generated again
    assert started - 4 <= 1, (started, per_call)  # 4 calls + at most the one in flight
    print(
        f"FIGURES {'node' if sandbox_too else 'worker'}: logged before the loss {calls_logged}, "
        f"replayed {view.metrics['replayed_calls']}, generated twice {started - 4}, "
        f"per call {per_call}, reward {view.reward} (uninterrupted {plain.reward})"
    )


def test_a_harness_that_sees_another_observation_goes_live_at_that_call(service, llm) -> None:
    before = stats(llm)
    job, rid = submit(service, llm, CLOCK)
    calls_logged = lose_run(service, rid, sandbox_too=True)
    service.wait_done(job, timeout=300)
    view = service.client.rollout(rid)
    started, per_call = generations(llm, before, CLOCK)

    assert (view.outcome, view.reward, view.attempt) == ("completed", 1.0, 2), (view.error, service.log_tail())
    assert view.metrics["replayed_calls"] == 1  # the clock call; its output differs from then on
    [divergence] = view.metrics["replay_divergences"]
    assert (divergence["call"], divergence["logged_attempt"], divergence["reason"]) == (1, 1, "prompt_differs")
    assert view.turns[1].extra["replay_divergence"] == divergence
    assert "replayed_from_attempt" not in view.turns[1].extra  # generated live
    # the record is this attempt's: the earlier attempt's later calls are not in it
    assert [t.attempt for t in view.turns] == [2, 2, 2, 2] and view.metrics["turns"] == 4
    first = view.earlier_attempts[0].turns
    assert view.turns[0].generated_ids == first[0].generated_ids
    assert per_call[0] == 1 and per_call[1] == 2  # the diverged call was generated again, live
    print(
        f"FIGURES divergence: logged before the loss {calls_logged}, replayed {view.metrics['replayed_calls']}, "
        f"diverged at call {divergence['call']}, generated twice {started - 4}, per call {per_call}, "
        f"reward {view.reward}"
    )
