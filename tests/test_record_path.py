"""One rollout's record has one type from generation to the SDK (issue 24).

A real pipeline: the gateway over real HTTP, Celery worker processes for INIT, RUN and EVAL,
the real agent loop and tokenizer on the LLM simulator (a scripted fake of vLLM: the one fake
here), SQLite. The handler (`tests/record_handlers.py`) notes, inside the workers, the class
that carried the record at each boundary and a digest of its token arrays; the gateway's
serving function is watched in this process; the SDK parses the answer. Every boundary must
name `raas_client.models.Trajectory` (the gateway's and the SDK's `RolloutView` extends it), and
the arrays must be the same tokens all the way.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import app.jobs
import app.rollouts
from fakellm.server import start_simulator
from raas_client import RaasClient
from raas_client.models import Trajectory, RolloutView
from bench.support.pipeline_harness import start_service
from tests.record_handlers import arrays_digest
from bench.support.waiting import wait_for

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`
SMOLLM2 = str(Path(__file__).resolve().parent / "fixtures" / "smollm2-tokenizer")
RECORD = "raas_client.models.Trajectory"


@pytest.fixture
def served(monkeypatch) -> list[object]:
    """Every object the gateway's rollout view returns (it runs in this process's thread)."""
    seen: list[object] = []
    original = app.jobs.rollout_view

    def watched(*args, **kwargs):
        view = original(*args, **kwargs)
        seen.append(view)
        return view

    monkeypatch.setattr(app.jobs, "rollout_view", watched)
    monkeypatch.setattr(app.rollouts, "rollout_view", watched)
    return seen


def test_one_record_type_from_generation_to_the_sdk(tmp_path, served) -> None:
    svc = start_service(tmp_path, concurrency=1, handler_modules="tests.record_handlers", extra={"max_attempts": 1})
    url, stop = start_simulator(SMOLLM2, {"default": ["So it is \\boxed{4}."]})
    try:
        svc.client.add_llm_server(url, weight_version="step-1")
        job = svc.client.submit("test-record-path", [{"instance_id": "q", "data": {}}])
        [row] = list(svc.client.results(job.job_id, wait=60))  # the SDK's typed rows

        # The trainer side: the SDK parsed the wire into the record's subclass.
        assert type(row) is RolloutView and isinstance(row, Trajectory), svc.log_tail()
        assert (row.outcome, row.reward) == ("completed", 1.0), svc.log_tail()
        assert row.response_ids and sum(row.loss_mask) > 0 and row.policy_versions == ["step-1"]
        assert row.turn_boundaries and row.message_token_counts

        # Inside the workers: the LLM layer built it, RUN returned it, EVAL read it back.
        seen = row.extra["boundaries"]
        assert seen["llm_session"] == seen["run_returns"] == RECORD
        assert row.extra["eval_reads"] == RECORD
        assert seen["run_context"].endswith("contexts.RunContext")
        assert row.extra["eval_context"].endswith("contexts.EvalContext")
        assert row.extra["eval_outcome"] == "completed"

        # The same tokens at every boundary: session, RUN, the database (EVAL), the SDK.
        digest = arrays_digest(row)
        assert seen["llm_session_digest"] == seen["run_digest"] == digest
        assert row.extra["eval_digest"] == digest

        # The gateway served the record's own subclass (the very class the SDK parses).
        assert served and all(type(view) is RolloutView for view in served)
        assert RolloutView.__mro__[1] is Trajectory  # no copy of its fields in between

        # Re-evaluation reads the same record from the row and grades it the same.
        svc.client.reevaluate(row.rollout_id)
        client = RaasClient(svc.url, timeout=60)
        wait_for(lambda: client.rollout(row.rollout_id).extra.get("reevaluations"), 60, "the re-evaluation")
        [again] = client.rollout(row.rollout_id).extra["reevaluations"]
        assert again.get("reward") == 1.0, again
        assert again["extra"]["eval_reads"] == RECORD
        assert again["extra"]["eval_digest"] == digest
        client.close()
    finally:
        stop()
        svc.stop()
