"""What recovery cost a job, read on both databases (`app.recovery_costs.job_cost`): the token
counts come from SQL (`json_array_length` / `jsonb_array_length`), a turn without generated ids
counts 0 (a JSON null on PostgreSQL is no array), and only rollouts past attempt 1 are read."""

from __future__ import annotations

from app.recovery_costs import job_cost
from core.db import session_scope
from core.models import Job, Rollout, Turn
from migrations.runner import upgrade


def test_job_cost_counts_tokens_generated_again_in_sql(any_db_url) -> None:
    upgrade(any_db_url)
    with session_scope(any_db_url) as s:
        job = Job(agent="math", n_instances=2, n_samples=1, config={})
        s.add(job)
        s.flush()
        retried = Rollout(job_id=job.id, instance_id="a", status="done", attempt=2)
        first = Rollout(job_id=job.id, instance_id="b", status="done", attempt=1)
        s.add_all([retried, first])
        s.flush()
        s.add_all(
            [
                Turn(rollout_id=retried.id, attempt=1, index=0, generated_ids=[1, 2, 3], extra={}),
                Turn(rollout_id=retried.id, attempt=1, index=1, generated_ids=[4, 5], extra={}),
                Turn(rollout_id=retried.id, attempt=1, index=2, generated_ids=None, extra={}),
                Turn(
                    rollout_id=retried.id,
                    attempt=2,
                    index=0,
                    generated_ids=[1, 2, 3],
                    extra={"replayed_from_attempt": 1},
                ),
                Turn(rollout_id=retried.id, attempt=2, index=1, generated_ids=[9], extra={}),
                Turn(rollout_id=first.id, attempt=1, index=0, generated_ids=[7, 7, 7, 7], extra={}),
            ]
        )
        job_id = job.id
    with session_scope(any_db_url) as s:
        cost = job_cost(s, job_id)
    # attempt 1's turn 0 was carried by replay; its turns 1 (2 tokens) and 2 (none) were not
    assert (cost.rollouts_retried, cost.replayed_turns, cost.regenerated_turns, cost.regenerated_tokens) == (1, 1, 2, 2)
