"""What recovery cost a rollout and a job: attempts, turns replayed, tokens generated twice.

A re-run is cheap to count and says little: a rollout that got a second attempt may have lost
nothing (its turns were replayed into the rebuilt sandbox, `agents.loop_replay`) or every
turn (it started over from INIT). What costs a trainer inference time is the tokens generated
again, so the dashboard shows those, read from the turn log:

- a logged turn was *generated* unless it carries `extra.replayed_from_attempt` (a replayed
  turn is the earlier attempt's, logged again under the new one); a carried turn that also
  carries `extra.restored_from_checkpoint` was restored from a workspace checkpoint (nothing of
  it ran again), counted as restored rather than replayed;
- the current attempt's turns *use* the generated turns they descend from (a replayed turn's
  origin is followed back through the attempts that replayed it);
- every generated turn no current turn uses was generated for nothing: its tokens were (or
  will be) generated again, or thrown away with its attempt.

The turn in flight at a loss was never logged, so it is not counted here (the fault campaign
and the Slurm tier count it from the simulator's side: at most one per interrupted rollout).
A resume in the same attempt (a RUN worker died, its sandbox still answers) logs nothing
twice and costs nothing here either.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from core.models import Rollout, Turn


@dataclass
class RecoveryCost:
    """Figures for one rollout or summed over a job's."""

    rollouts_retried: int = 0  # rollouts on a second or later attempt
    replayed_turns: int = 0  # turns carried into a later attempt by replay (not generated again)
    restored_turns: int = 0  # carried by a workspace checkpoint instead (nothing run again)
    regenerated_turns: int = 0  # logged turns generated for nothing
    regenerated_tokens: int = 0  # their generated tokens

    def add(self, other: RecoveryCost) -> None:
        self.rollouts_retried += other.rollouts_retried
        self.replayed_turns += other.replayed_turns
        self.restored_turns += other.restored_turns
        self.regenerated_turns += other.regenerated_turns
        self.regenerated_tokens += other.regenerated_tokens


def rollout_cost(attempt: int, turns: Iterable[Any]) -> RecoveryCost:
    """The cost for a rollout now on `attempt`, from its logged turns of every attempt (rows
    with `attempt`, `index`, `extra`, and `n_generated` or `generated_ids`)."""
    by_key = {(t.attempt, t.index): t for t in turns}
    cost = RecoveryCost(rollouts_retried=int(attempt > 1))
    if not by_key:
        return cost

    def origin(key: tuple[int, int]) -> tuple[int, int]:
        seen = set()
        while key in by_key and key not in seen:
            seen.add(key)
            source = (by_key[key].extra or {}).get("replayed_from_attempt")
            if source is None:
                return key
            key = (int(source), key[1])
        return key

    used = {origin(key) for key in by_key if key[0] == attempt}
    for key, turn in by_key.items():
        if key[0] == attempt and (turn.extra or {}).get("replayed_from_attempt") is not None:
            if (turn.extra or {}).get("restored_from_checkpoint") is not None:
                cost.restored_turns += 1
            else:
                cost.replayed_turns += 1
        generated = (turn.extra or {}).get("replayed_from_attempt") is None
        if generated and key not in used:
            cost.regenerated_turns += 1
            counted = getattr(turn, "n_generated", None)
            cost.regenerated_tokens += (
                counted if counted is not None else len(getattr(turn, "generated_ids", None) or ())
            )
    return cost


def job_cost(s: Session, job_id: str) -> RecoveryCost:
    """The cost summed over a job's rollouts. Only rollouts past their first attempt can have
    any (a first attempt's turns are all its own), so only their turns are read."""
    retried = dict(
        s.execute(select(Rollout.id, Rollout.attempt).where(Rollout.job_id == job_id, Rollout.attempt > 1)).all()
    )
    total = RecoveryCost()
    if not retried:
        return total
    turns: dict[str, list[Any]] = defaultdict(list)
    ids = list(retried)
    # the token counts, not the tokens: a job page refreshes every few seconds, and a node lost
    # under a thousand long rollouts would otherwise ship every generated id to the gateway
    ids_column = Turn.generated_ids
    if s.get_bind().dialect.name == "postgresql":  # jsonb; a JSON null is no array there
        length = case((func.jsonb_typeof(ids_column) == "array", func.jsonb_array_length(ids_column)), else_=0)
    else:  # SQLite: 0 for a JSON null, NULL for SQL's
        length = func.json_array_length(ids_column)
    n_generated = func.coalesce(length, 0).label("n_generated")
    for start in range(0, len(ids), 500):
        rows = s.execute(
            select(Turn.rollout_id, Turn.attempt, Turn.index, Turn.extra, n_generated).where(
                Turn.rollout_id.in_(ids[start : start + 500])
            )
        ).all()
        for row in rows:
            turns[row.rollout_id].append(row)
    for rollout_id, attempt in retried.items():
        total.add(rollout_cost(attempt, turns.get(rollout_id, ())))
    return total
