"""Resume instead of restart: a lost RUN continues in its live sandbox from its logged turns.

A RUN is lost when its worker dies (the reaper of the sandbox's node sees the lease stop
beating, `Reaper.reclaim_lost`) or when RUN raises a retryable error (`StageRun`). Either
way, when
- the handler's `run` is the shared loop (`resumable`),
- the rollout's sandbox still answers on this node (checked here, on the node that holds it:
  a handle is only meaningful where its processes run), and
- the attempt was resumed fewer than `max_resumes` times,
the rollout is queued for RUN again in the *same attempt* on the same node: its turns,
workspace and sandbox label stay valid, and the next RUN worker rebuilds the LLM session from
the logged turns and continues at the next turn index (`agents.loop`). Nothing is initialised
again and no logged turn is generated or executed again; only the turn in flight is (it was
never logged; its half-run tool call may have left traces in the sandbox, as any shell would).
Otherwise the rollout restarts from INIT as a new attempt, as before. Turns are group-committed
per RUN process (`tasks.writes.turn_log`), and each loop waits for its turns' batches before its next
tool calls run: a batch lost with its process holds at most that in-flight turn per rollout
whose tool calls ran.

A lost EVAL is graded again the same way (same attempt, EVAL queue of the rollout's node,
within the same `max_resumes` budget): the artifact and the token arrays are stored, and
grading starts from a fresh sandbox anyway, so nothing of RUN is redone. The dead worker's
grading sandbox is released first.

Replay (issue 41): when the sandbox itself is gone (node loss, `scancel`, a time limit, a
preemption), the rollout gets a new attempt from INIT, and that attempt's RUN receives the
logged turns of the latest earlier attempt that logged any (`turns_to_resume`): their tool
calls are replayed into the rebuilt sandbox and the loop goes on after them
(`agents.loop_replay`), so only the turn in flight is generated again. An attempt that ended
on a `ResumeError` (turns that cannot rebuild the session, or a replay that diverged under
`resume.on_divergence: restart`) is noted `replay: false` in the attempt history: nothing up to
it is replayed again, the next attempt starts over. A job with `resume.replay: false` never
replays.

A harness rollout (`AgentHandler.replays_calls`) is never resumed in place (its program cannot
be re-attached, and starting it over in the sandbox it changed would run its commands on their
own effects): a lost RUN is always a new attempt, whose RUN gets the same `turns_to_resume` and
whose endpoint answers the restarted harness's matching calls from them (`agents.harness.replay`).
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import bindparam, func, select

from core.db import session_scope
from core.models import Turn
from core.settings import Settings
from tasks.writes import lifecycle
from tasks.sandboxing import sandboxes
from tasks.writes.db_retry import retrying

log = logging.getLogger(__name__)

INHERITED_ATTEMPT = 0  # a branch's copy of its parent's turns 0..k (`app.branches`)


@retrying
def stored_turns(db_url: str, rollout_id: str, attempt: int) -> list[dict[str, Any]]:
    """The logged turns of one attempt in index order, as plain dicts (what resume reads)."""
    with session_scope(db_url) as s:
        rows = s.connection().execute(_STORED_TURNS, {"rollout": rollout_id, "attempt": attempt}).all()
    return [dict(row._mapping) for row in rows]


# Built once, run on the Core connection: every RUN asks it (almost always for nothing), and
# building the 17-column select and running it through the ORM was ~5 % of a RUN's CPU.
_STORED_TURNS = (
    select(*[c for c in Turn.__table__.columns if c.name not in ("id", "rollout_id")])
    .where(Turn.rollout_id == bindparam("rollout"), Turn.attempt == bindparam("attempt"))
    .order_by(Turn.index)
)


@retrying
def turn_count(db_url: str, rollout_id: str, attempt: int) -> int:
    """How many turns the attempt has logged (where a resumed RUN goes on)."""
    with session_scope(db_url) as s:
        return (
            s.scalar(
                select(func.count()).select_from(Turn).where(Turn.rollout_id == rollout_id, Turn.attempt == attempt)
            )
            or 0
        )


def turns_to_resume(db_url: str, rollout: Any, attempt: int, replay: bool) -> list[dict[str, Any]] | None:
    """The logged turns a RUN of `attempt` continues after (None: it starts at turn 0): its
    own, if it was queued again in place, then those of an earlier attempt whose sandbox was
    lost, from the first index it has not logged itself (`replay`: the job's
    `resume.replay`).

    A branch (`app.branches`) always replays: its parent's turns 0..k are logged as its
    attempt 0 (`INHERITED_ATTEMPT`), the source when no later attempt of its own logged any
    that may be replayed, so every attempt of a branch starts from the parent's prefix and
    never from turn 0 (a prefix that diverges under `resume.on_divergence: restart` is
    replayed again by the next attempt, until the attempts run out)."""
    branch = getattr(rollout, "parent_rollout_id", None) is not None
    own = stored_turns(db_url, rollout.id, attempt) if run_resumed(rollout.resumes, attempt) else []
    source = None
    if (replay or branch) and attempt > 1:
        source = replay_source(db_url, rollout.id, attempt, rollout.attempt_history)
    if source is None and branch:
        source = INHERITED_ATTEMPT
    if source is not None:
        own += [turn for turn in replayed_log(db_url, rollout.id, source) if turn["index"] >= len(own)]
    return own or None


def replays(handler: Any, config: Any, rollout: Any, calls: bool = False) -> bool:
    """Whether a new attempt of this rollout replays its logged turns (the loop's tool calls;
    with `calls`, a harness's logged model calls too): the job's `resume.replay`, and always
    for a branch (`turns_to_resume`)."""
    branch = getattr(rollout, "parent_rollout_id", None) is not None
    kind = handler.resumable or (calls and handler.replays_calls)
    return bool(kind) and (config.resume.replay or branch)


def replayed_workspace(db_url: str, rollout: Any, attempt: int, replay: bool) -> dict[str, Any]:
    """The sandbox option of an attempt that will replay logged turns: its workspace shown at
    the path those turns were logged in (`workspace_inside`), so a prompt that names the
    workspace (swe's does) renders to the logged tokens and the replayed outputs name the same
    paths; {} when nothing will be replayed or the turns named no workspace. A branch's source
    is its parent's turns (`INHERITED_ATTEMPT`) until an attempt of its own logged some."""
    if attempt <= 1 and getattr(rollout, "parent_rollout_id", None) is None:
        return {}
    branch = getattr(rollout, "parent_rollout_id", None) is not None
    source = None
    if (replay or branch) and attempt > 1:
        source = replay_source(db_url, rollout.id, attempt, rollout.attempt_history)
    if source is None and branch:
        source = INHERITED_ATTEMPT
    if source is None:
        return {}
    path = _logged_workspace(db_url, rollout.id, source)
    return {"workspace_inside": path} if path else {}


@retrying
def _logged_workspace(db_url: str, rollout_id: str, attempt: int) -> str | None:
    """The workspace path the last logged turn of `attempt` names (`extra.workspace`)."""
    with session_scope(db_url) as s:
        extra = s.scalar(
            select(Turn.extra)
            .where(Turn.rollout_id == rollout_id, Turn.attempt == attempt)
            .order_by(Turn.index.desc())
            .limit(1)
        )
    return (extra or {}).get("workspace")


def replayed_log(db_url: str, rollout_id: str, source: int) -> list[dict[str, Any]]:
    """`source`'s logged turns, and when the last one was replayed from an earlier attempt
    (`source` was lost mid-replay: its log is a prefix of that attempt's), the earlier attempt's
    turns after them: what `source` would have replayed had it gone on, never generated again."""
    turns = stored_turns(db_url, rollout_id, source)
    seen = {source}
    while turns:
        earlier = (turns[-1].get("extra") or {}).get("replayed_from_attempt")
        if not isinstance(earlier, int) or earlier in seen or earlier > source:
            return turns
        seen.add(earlier)
        rest = [turn for turn in stored_turns(db_url, rollout_id, earlier) if turn["index"] >= len(turns)]
        if not rest:
            return turns
        turns += rest
    return turns


@retrying
def replay_source(db_url: str, rollout_id: str, attempt: int, history: list[dict[str, Any]] | None) -> int | None:
    """The latest attempt before `attempt` with logged turns that may be replayed: after every
    attempt the history marks `replay: false`. None when there is none."""
    barrier = max((h.get("attempt", 0) for h in history or [] if h.get("replay") is False), default=0)
    with session_scope(db_url) as s:
        return s.scalar(
            select(func.max(Turn.attempt)).where(
                Turn.rollout_id == rollout_id, Turn.attempt < attempt, Turn.attempt > barrier
            )
        )


def run_resumed(resumes: list[dict[str, Any]] | None, attempt: int) -> bool:
    """Whether a RUN of `attempt` was queued again in place: the only way a RUN claim can
    find turns of its attempt logged (a claim needs an unleased row, and `lifecycle.resume`
    is the one write that unleases a RUN row without starting a new attempt). A first RUN
    skips the read of its turns on this: it has none."""
    return any(entry.get("attempt") == attempt and entry.get("stage", "run") == "run" for entry in resumes or [])


def resumes_of_attempt(resumes: list[dict[str, Any]] | None, attempt: int) -> int:
    """How many times a stage of `attempt` was resumed already (RUN and EVAL together; an
    EVAL moved off a node that drained or lost its pool is not counted: tasks.recovery.handback)."""
    return sum(1 for entry in resumes or [] if entry.get("attempt") == attempt and not entry.get("moved"))


def sandbox_alive_here(settings: Settings, handle: dict[str, Any] | None) -> bool:
    """True when the sandbox behind `handle` lives on this node and its tool server answers
    (no sandbox at all, runtime "none", has nothing to lose: True)."""
    if not handle:
        return True
    if handle.get("node", settings.node) != settings.node:
        return False
    try:
        sandboxes.attach(settings, handle).close()
    except Exception as exc:  # noqa: BLE001 - gone, or not ours: either way not resumable
        log.info("sandbox %s is not usable for a resume: %s", handle.get("label"), exc)
        return False
    return True


def resumable(
    settings: Settings, agent: str, attempt: int, resumes: list[dict[str, Any]] | None, handle: dict[str, Any] | None
) -> bool:
    """May this lost RUN continue in place? (Budget, handler, then the sandbox on this node.)"""
    from agents.registry import get_handler

    if resumes_of_attempt(resumes, attempt) >= settings.max_resumes:
        return False
    try:
        handler = get_handler(agent)
    except Exception:  # noqa: BLE001 - a handler this process did not load: restart instead
        return False
    if not handler.resumable:
        return False
    return sandbox_alive_here(settings, handle)


def requeue(
    settings: Settings,
    rollout_id: str,
    attempt: int,
    error: str,
    *,
    lease: str | None = None,
    expect_lease: str | None = None,
) -> int | None:
    """Queue the lost RUN again in place; the turn index it resumes at, or None if the fence
    failed (another reaper or a cancel got there first). The caller publishes RUN."""
    from_turn = turn_count(settings.db_url, rollout_id, attempt)
    if not lifecycle.resume(
        settings.db_url, rollout_id, from_turn=from_turn, lease=lease, expect_lease=expect_lease, error=error
    ):
        return None
    log.warning(
        "rollout %s: RUN of attempt %s lost (%s); resuming at turn %d in its sandbox",
        rollout_id,
        attempt,
        error[:200],
        from_turn,
    )
    return from_turn


def regrade(
    settings: Settings,
    rollout_id: str,
    attempt: int,
    resumes: list[dict[str, Any]] | None,
    grading_handle: dict[str, Any] | None,
    error: str,
    *,
    lease: str | None = None,
    expect_lease: str | None = None,
) -> bool:
    """Queue a lost EVAL again in place (its grading sandbox released); False when over
    budget or the fence failed. The caller publishes EVAL."""
    if resumes_of_attempt(resumes, attempt) >= settings.max_resumes:
        return False
    if grading_handle and grading_handle.get("node", settings.node) == settings.node:
        sandboxes.release(grading_handle)
    if not lifecycle.resume(
        settings.db_url, rollout_id, stage="eval", lease=lease, expect_lease=expect_lease, error=error, sandbox=None
    ):
        return False
    log.warning("rollout %s: EVAL of attempt %s lost (%s); grading it again", rollout_id, attempt, error[:200])
    return True
