"""Branches of a rollout, typed once: the request, the gateway's answers, and the tree a
trainer collects (`RaasClient.branch`, `RaasClient.branches`, `RaasClient.tree`).

`POST /v1/rollouts/{id}/branches` with `{"turn": k, "n": m}` starts m continuations of the
rollout from its turn k (0-based): each branch is a rollout of its own (its own sample, reward
and record) whose trajectory begins with the parent's turns 0..k token for token, run in a
sandbox rebuilt to the parent's workspace as it was after turn k, and sampled live from turn
k+1 on. The m branches of one request are one child job (one instance, `n_samples` m): the
branches of one state are one group, collected like any job's group, and the parent's job and
its groups stay as they were.
"""

from __future__ import annotations

import time
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from raas_client.batch import advantages
from raas_client.models import Answer, RolloutView

MAX_BRANCHES = 256  # per request: a group of continuations, not a job's worth of samples

TreeBaseline = Literal["rloo", "grpo"]
FINISHED = frozenset({"done", "failed", "cancelled"})


class BranchCreate(BaseModel):
    """POST /v1/rollouts/{id}/branches: `n` continuations of the rollout after its turn `turn`."""

    model_config = ConfigDict(extra="forbid")

    turn: int = Field(ge=0, description="0-based index of the parent's last kept turn: branches sample from turn+1")
    n: int = Field(1, ge=1, le=MAX_BRANCHES, description="How many branches (one child job of n samples)")
    idempotency_key: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        description="Same key + same parent, turn and n: the same child job and ids; another request: 409",
    )


class BranchesAccepted(Answer):
    """202 answer to a branch request (also returned again for a repeated idempotency key)."""

    job_id: str = Field(description="The child job holding the branches (one group)")
    rollout_ids: list[str] = Field(description="The branches, by sample_index")
    parent_rollout_id: str
    branch_turn: int = Field(description="The parent's turn the branches continue after")
    created: bool = Field(description="False when the idempotency key matched a branch request")


class BranchList(Answer):
    """GET /v1/rollouts/{id}/branches: every branch of the rollout, by turn then creation."""

    parent_rollout_id: str
    branches: list[RolloutView] = Field(description="Without turns (GET /v1/rollouts/{id} has them)")


class RolloutTree(BaseModel):
    """A rollout and its branches, as a trainer collects them (`RaasClient.tree`).

    `advantages()` scores each branch against its siblings: the branches of the same parent
    at the same turn, which all continue one state (the parent's prefix up to that turn).
    """

    model_config = ConfigDict(frozen=True)

    parent: RolloutView
    branches: list[RolloutView] = Field(description="By branch_turn, then sample_index")

    def by_turn(self) -> dict[int, list[RolloutView]]:
        """The branches grouped by the turn they continue after (each group one state)."""
        groups: dict[int, list[RolloutView]] = {}
        for b in self.branches:
            groups.setdefault(int(b.branch_turn or 0), []).append(b)
        return groups

    def advantages(self, baseline: TreeBaseline = "rloo", include_parent: bool = False) -> dict[str, float | None]:
        """Per-branch advantage, by rollout id.

        Siblings are the branches of one turn; only usable samples enter (failure_class
        `none` or `policy`, `train_reward`: an infrastructure failure is neither a sample nor
        a baseline, and gets None). `rloo` (the default): the branch's reward minus the mean
        of its usable siblings' rewards; `grpo`: (reward - mean) / (std + eps) over the group.
        `include_parent=True` counts the parent as one more sample of each state (its own
        continuation from turn k+1 was sampled from the same prefix), in the baseline only.
        A branch with no usable sibling gets 0.
        """
        out: dict[str, float | None] = {b.rollout_id: None for b in self.branches}
        for _turn, group in sorted(self.by_turn().items()):
            usable = [b for b in group if b.train_reward is not None]
            rewards = [float(b.train_reward) for b in usable]
            extra = self.parent.train_reward if include_parent else None
            if extra is not None:
                rewards.append(float(extra))
            scores = advantages(rewards, baseline) if rewards else []
            for b, score in zip(usable, scores):
                out[b.rollout_id] = score
        return out


class TreeSource(Protocol):
    """What `wait_tree` reads from (a `RaasClient`)."""

    def rollout(self, rollout_id: str) -> RolloutView: ...

    def branches(self, rollout_id: str) -> BranchList: ...


def wait_tree(client: TreeSource, rollout_id: str, timeout: float = 600.0, poll: float = 1.0) -> RolloutTree:
    """The rollout and its branches once every one of them has finished, or as they stand
    when `timeout` seconds have passed (check `status` then)."""
    deadline = time.monotonic() + timeout
    while True:
        parent = client.rollout(rollout_id)
        branches = client.branches(rollout_id).branches
        rows = [parent, *branches]
        if all(r.status in FINISHED for r in rows) or time.monotonic() >= deadline:
            return RolloutTree(parent=parent, branches=branches)
        time.sleep(poll)
