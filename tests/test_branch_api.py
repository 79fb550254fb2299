"""`POST /v1/rollouts/{id}/branches` through the real gateway (issue 38): what it writes for a
valid request, and the 4xx naming the problem for each invalid one. No workers: branches stay
queued, and the parent rollouts are rows written here as a finished and a running RUN leave
them. The SDK's tree advantages are checked on typed rows.
"""

from __future__ import annotations

from datetime import datetime, timezone

import httpx
import pytest
from sqlalchemy import select

from core.db import session_scope
from core.models import Job, Rollout, Turn
from core.settings import Settings
from raas_client.branch_models import RolloutTree
from raas_client.models import RolloutView
from tests.test_api import serve

ALICE, BOB = "alice-token-0001", "bob-token-00002"


def _turn(rollout_id: str, index: int, finish: str | None = None) -> Turn:
    return Turn(
        rollout_id=rollout_id,
        attempt=1,
        index=index,
        generated_ids=[10 + index, 2],
        logprobs=[-0.5, -0.1],
        text=f"turn {index}",
        tool_calls=[{"name": "python", "arguments": {"code": f"print({index})"}}],
        observation=str(index),
        observation_ids=[7, index],
        observation_messages=[{"role": "tool", "name": "python", "content": str(index)}],
        loop_state={"turns": index + 1, "finish_reason": finish, "prompt_digest": "d"},
        extra={"context_length": 4096},
    )


@pytest.fixture
def gateway(tmp_path):
    settings = Settings(
        home=tmp_path,
        handler_modules="bench.support.pipeline_handlers",
        api_tokens={ALICE: {"owner": "alice"}, BOB: {"owner": "bob"}},
    )
    server, anon = serve(settings)
    url = f"http://127.0.0.1:{server.server_port}"
    ids = {}
    with session_scope(settings.db_url) as s:
        for agent, status, turns, finish in (
            ("math", "done", 3, "finish"),  # turns 0..2, the last one ended the episode
            ("math", "run", 2, None),  # still running: turns 0..1 so far
            ("test-trivial", "done", 1, None),  # a handler whose RUN is not the shared loop
        ):
            job = Job(owner="alice", agent=agent, config={"labels": {"prorl_job_id": "x"}}, n_instances=1)
            s.add(job)
            s.flush()
            row = Rollout(job_id=job.id, instance_id="i", instance={"problem": "1+1"}, status=status)
            s.add(row)
            s.flush()
            s.add_all(_turn(row.id, i, finish if i == turns - 1 else None) for i in range(turns))
            ids[(agent, status)] = row.id
    clients = {
        name: httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {token}"})
        for name, token in (("alice", ALICE), ("bob", BOB))
    }
    yield settings, clients, ids
    for c in (*clients.values(), anon):
        c.close()
    server.shutdown()


def test_a_branch_request_makes_a_child_job_of_n_branches_with_the_inherited_turns(gateway) -> None:
    settings, clients, ids = gateway
    parent = ids[("math", "done")]
    answer = clients["alice"].post(f"/v1/rollouts/{parent}/branches", json={"turn": 1, "n": 3})
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert (body["parent_rollout_id"], body["branch_turn"], body["created"]) == (parent, 1, True)
    with session_scope(settings.db_url) as s:
        job = s.get(Job, body["job_id"])
        assert (job.owner, job.agent, job.n_instances, job.n_samples) == ("alice", "math", 1, 3)
        assert job.config["labels"] == {"branch_of": parent, "branch_turn": "1"}  # not the parent's labels
        rows = s.scalars(select(Rollout).where(Rollout.job_id == job.id).order_by(Rollout.sample_index)).all()
        assert [r.id for r in rows] == body["rollout_ids"]
        assert {(r.parent_rollout_id, r.branch_turn, r.instance_id, r.status) for r in rows} == {
            (parent, 1, "i", "pending")
        }
        inherited = s.scalars(select(Turn).where(Turn.rollout_id == rows[0].id).order_by(Turn.index)).all()
        assert [(t.attempt, t.index, t.generated_ids) for t in inherited] == [(0, 0, [10, 2]), (0, 1, [11, 2])]
    view = clients["alice"].get(f"/v1/rollouts/{body['rollout_ids'][0]}").json()
    assert (view["parent_rollout_id"], view["branch_turn"]) == (parent, 1)
    listed = clients["alice"].get(f"/v1/rollouts/{parent}/branches").json()
    assert [b["rollout_id"] for b in listed["branches"]] == body["rollout_ids"]
    # the running parent may be branched at a turn it has logged
    running = ids[("math", "run")]
    assert clients["alice"].post(f"/v1/rollouts/{running}/branches", json={"turn": 1}).status_code == 202


def test_the_branch_command_prints_the_answer_or_the_problem(gateway) -> None:
    from click.testing import CliRunner

    from raas_client.cli import branch

    settings, clients, ids = gateway
    url, parent = str(clients["alice"].base_url), ids[("math", "done")]
    env = {"RAAS_TOKEN": ALICE}
    ok = CliRunner().invoke(branch, [parent, "--turn", "0", "-n", "2", "--url", url], env=env)
    assert ok.exit_code == 0, ok.output
    assert '"branch_turn": 0' in ok.output and ok.output.count('"rollout_ids"') == 1
    bad = CliRunner().invoke(branch, [parent, "--turn", "7", "--url", url], env=env)
    assert bad.exit_code != 0 and "turn 7 is out of range" in bad.output and "field: turn" in bad.output


@pytest.mark.parametrize(
    "who, parent, body, status, needles",
    [
        ("alice", ("math", "done"), {"turn": 3, "n": 2}, 400, ["turn 3 is out of range", "turns 0..2"]),
        ("alice", ("math", "done"), {"turn": 2, "n": 2}, 400, ["ended the episode", "(0..1)"]),
        ("alice", ("math", "run"), {"turn": 2, "n": 2}, 409, ["not logged yet", "turns 0..1"]),
        ("alice", ("math", "done"), {"turn": -1}, 400, ["turn"]),
        ("alice", ("math", "done"), {"turn": 0, "n": 0}, 400, ["n"]),
        ("alice", ("math", "done"), {"turn": 0, "n": 257}, 400, ["n"]),
        ("alice", ("math", "done"), {"turn": 0, "m": 2}, 400, ["m"]),
        ("alice", ("math", "done"), {"n": 2}, 400, ["turn"]),
        ("alice", ("test-trivial", "done"), {"turn": 0}, 400, ["cannot be branched"]),
        ("bob", ("math", "done"), {"turn": 0}, 404, ["not found"]),  # another tenant's rollout
        ("alice", None, {"turn": 0}, 404, ["not found"]),
    ],
)
def test_bad_branch_requests_get_a_4xx_naming_the_problem(gateway, who, parent, body, status, needles) -> None:
    settings, clients, ids = gateway
    rollout = ids[parent] if parent else "0" * 32
    answer = clients[who].post(f"/v1/rollouts/{rollout}/branches", json=body)
    assert answer.status_code == status, answer.text
    for needle in needles:
        assert needle in answer.text, answer.text
    with session_scope(settings.db_url) as s:  # nothing was written
        assert not s.scalars(select(Rollout).where(Rollout.parent_rollout_id.is_not(None))).all()
    if who == "bob":
        assert clients["bob"].get(f"/v1/rollouts/{rollout}/branches").status_code == 404


def _view(rid: str, reward: float | None, outcome: str = "completed", turn: int | None = 2) -> RolloutView:
    return RolloutView(
        rollout_id=rid,
        job_id="j",
        instance_id="i",
        sample_index=0,
        status="done" if outcome == "completed" else "failed",
        attempt=1,
        timing={},
        created_at=datetime.now(timezone.utc),
        outcome=outcome,
        reward=reward,
        parent_rollout_id="p" if turn is not None else None,
        branch_turn=turn,
    )


def test_tree_advantages_score_each_branch_against_its_siblings_at_its_turn() -> None:
    tree = RolloutTree(
        parent=_view("p", 0.0, turn=None),
        branches=[
            _view("a", 1.0),
            _view("b", 1.0),
            _view("c", 0.0),
            _view("d", None, outcome="infra_error"),  # neither a sample nor a baseline
            _view("e", 0.0, turn=4),  # alone at its turn
            _view("f", None, outcome="agent_error", turn=4),  # a policy failure: reward 0
        ],
    )
    assert sorted(tree.by_turn()) == [2, 4]
    adv = tree.advantages()  # rloo: reward minus the mean of the usable siblings
    assert adv["a"] == pytest.approx(1.0 - 0.5) and adv["b"] == pytest.approx(0.5)
    assert adv["c"] == pytest.approx(0.0 - 1.0) and adv["d"] is None
    assert adv["e"] == pytest.approx(0.0) and adv["f"] == pytest.approx(0.0)
    with_parent = tree.advantages(include_parent=True)  # the parent's 0.0 joins each baseline
    assert with_parent["a"] == pytest.approx(1.0 - (1.0 + 0.0 + 0.0) / 3)
    grpo = tree.advantages(baseline="grpo")
    assert grpo["a"] > 0 > grpo["c"] and grpo["d"] is None


def test_every_attempt_of_a_branch_starts_from_the_inherited_prefix_never_from_turn_0(gateway) -> None:
    """`turns_to_resume` for a branch: attempt 1 replays the inherited turns (attempt 0), even
    under `resume.replay: false`; a later attempt replays its predecessor's turns, or the
    inherited ones again once that predecessor's replay diverged (`replay: false` noted)."""
    from types import SimpleNamespace

    from tasks.recovery.resume import replayed_workspace, turns_to_resume

    settings, clients, ids = gateway
    parent = ids[("math", "done")]
    body = clients["alice"].post(f"/v1/rollouts/{parent}/branches", json={"turn": 1, "n": 1}).json()
    rid = body["rollout_ids"][0]
    with session_scope(settings.db_url) as s:
        s.add_all(_turn(rid, i) for i in range(3))  # attempt 1 replayed 0..1 and went on to 2
        s.execute(
            Turn.__table__.update()
            .where(Turn.rollout_id == rid, Turn.attempt == 0)
            .values(extra={"workspace": "/w/p-1"})
        )

    def row(history):
        return SimpleNamespace(id=rid, parent_rollout_id=parent, resumes=None, attempt_history=history)

    first = turns_to_resume(settings.db_url, row([]), 1, replay=False)
    assert [(t["attempt"], t["index"]) for t in first] == [(0, 0), (0, 1)]
    lost = turns_to_resume(settings.db_url, row([{"attempt": 1}]), 2, replay=False)
    assert [(t["attempt"], t["index"]) for t in lost] == [(1, 0), (1, 1), (1, 2)]
    diverged = turns_to_resume(settings.db_url, row([{"attempt": 1, "replay": False}]), 2, replay=True)
    assert [(t["attempt"], t["index"]) for t in diverged] == [(0, 0), (0, 1)]
    assert replayed_workspace(settings.db_url, row([]), 1, replay=False) == {"workspace_inside": "/w/p-1"}
    plain = SimpleNamespace(id=parent, parent_rollout_id=None, resumes=None, attempt_history=[])
    assert replayed_workspace(settings.db_url, plain, 1, replay=True) == {}  # a first attempt replays nothing
    assert turns_to_resume(settings.db_url, plain, 1, replay=True) is None  # not a branch: turn 0
