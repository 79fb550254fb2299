"""From finished rollouts to a training step: whole groups, a batch of K of them, advantages.

`Collector.collect(groups=K, timeout=T, max_staleness=S)` returns a `Batch` of the first K
groups (all samples of one instance) that complete, or what completed within T seconds. Each
sample's `failure_class` (`raas_client.models`) decides its place:

- `none` and `policy` samples form the group's statistics (a policy failure is a real bad
  sample: its reward is 0 when the grader gave none);
- `infra` and `input` samples are excluded by default (`include_infra=True` counts infra
  failures as reward 0, as some trainers do): the group is reported *short* (fewer usable
  samples than the job's `n_samples`), with a count;
- samples a straggler cut removed from their group (`cut_reason`: spares, a group deadline)
  are neither samples nor failures;
- a sample whose oldest turn was generated more than S policy versions before the current
  version is dropped and reported (`Group.stale`, `Batch.stale`).

Policy versions are the servers' `weight_version` strings; their number is the integer they
end with (`"step-42"` -> 42, `"7"` -> 7). The current version is `current_version=` when
given, else the highest one among the pool's servers, else the highest one seen in the batch.

`Batch.health` is the job's live health when the batch was taken (`raas_client.health_models`:
parse failures, truncation, turns per rollout, reward without tool calls, infra, alerts).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from raas_client.arrays import to_arrays
from raas_client.health_models import HealthView
from raas_client.models import JobView, LLMServerView, ResultsPage, RolloutView, version_number

AdvantageMethod = Literal["grpo", "rloo"]


class ResultsSource(Protocol):
    """What a Collector reads from (a `RaasClient`)."""

    def results_page(self, job_id: str, after: int = 0, wait: float = 0, limit: int = 100) -> ResultsPage: ...

    def llm_servers(self) -> list[LLMServerView]: ...

    def job(self, job_id: str) -> JobView: ...


def oldest_version(rollout: RolloutView) -> int | None:
    """The oldest policy version among a sample's generated turns (None if none is known)."""
    numbers = [n for n in map(version_number, rollout.policy_versions or []) if n is not None]
    return min(numbers) if numbers else None


def advantages(rewards: list[float], method: AdvantageMethod = "grpo", eps: float = 1e-6) -> list[float]:
    """Per-sample advantages of one group.

    `grpo`: (r - mean) / (std + eps), std the unbiased sample standard deviation (as verl);
    `rloo`: r minus the mean of the other samples' rewards. A group of one gets 0.
    """
    n = len(rewards)
    if n < 2:
        return [0.0] * n
    mean = sum(rewards) / n
    if method == "grpo":
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (n - 1))
        return [(r - mean) / (std + eps) for r in rewards]
    if method == "rloo":
        return [(r - mean) * n / (n - 1) for r in rewards]
    raise ValueError(f"unknown advantage method {method!r}: grpo or rloo")


class Group(BaseModel):
    """All samples of one instance, as delivered, and the ones its statistics use."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    instance_id: str
    rollouts: list[RolloutView] = Field(description="Every sample of the instance, by sample_index")
    stale: list[str] = Field(default_factory=list, description="Rollout ids dropped for max_staleness")
    include_infra: bool = Field(False, description="Infra failures count as reward 0")
    expected: int | None = Field(
        None, description="Samples the group should have (the job's n_samples); None: every delivered sample not cut"
    )

    def _used(self, r: RolloutView) -> bool:
        if r.rollout_id in self.stale or r.cut_reason is not None:
            return False
        return r.failure_class in ("none", "policy") or (self.include_infra and r.failure_class == "infra")

    @property
    def samples(self) -> list[RolloutView]:
        """The samples that enter the group's statistics and the batch's arrays."""
        return [r for r in self.rollouts if self._used(r)]

    @property
    def rewards(self) -> list[float]:
        """Training rewards of `samples` (policy and, if included, infra failures: 0)."""
        return [r.train_reward if r.train_reward is not None else 0.0 for r in self.samples]

    @property
    def cut(self) -> list[RolloutView]:
        """Samples a straggler cut removed from the group (not failures)."""
        return [r for r in self.rollouts if r.cut_reason is not None]

    @property
    def n_infra(self) -> int:
        """Samples whose failure was the infrastructure's (or an unsampleable prompt)."""
        return sum(r.failure_class in ("infra", "input") and r.cut_reason is None for r in self.rollouts)

    @property
    def short(self) -> bool:
        """Fewer usable samples than the group should have (infra failures, stale samples)."""
        wanted = self.expected if self.expected is not None else len(self.rollouts) - len(self.cut)
        return len(self.samples) < wanted

    def advantages(self, method: AdvantageMethod = "grpo", eps: float = 1e-6) -> list[float]:
        """Advantages of `samples`, in their order."""
        return advantages(self.rewards, method, eps)


class Batch(BaseModel):
    """The groups of one training step and what was left out of them."""

    model_config = ConfigDict(frozen=True)

    groups: list[Group]
    stale: list[str] = Field(default_factory=list, description="Rollouts dropped as stale")
    current_version: int | None = Field(None, description="Version staleness was measured from")
    timed_out: bool = Field(False, description="Fewer than K groups completed within T")
    job_done: bool = Field(False, description="The job has no more groups to give")
    seconds: float = Field(0.0, description="Time collect() took")
    health: HealthView | None = Field(
        None, description="The job's live health when the batch was taken (None: the gateway has none)"
    )

    @property
    def samples(self) -> list[RolloutView]:
        """Every used sample (rollout), group after group."""
        return [r for g in self.groups for r in g.samples]

    @property
    def rows(self) -> list[RolloutView]:
        """The rows of `to_arrays`: each sample's `training_rows()` (one per rollout, or one
        per split sample of a harness rollout), in `samples` order."""
        return [row for r in self.samples for row in r.training_rows()]

    @property
    def rewards(self) -> list[float]:
        """Training rewards of `samples`."""
        return [x for g in self.groups for x in g.rewards]

    @property
    def n_infra(self) -> int:
        """Infra (and input) failures left out of the groups' statistics."""
        return sum(g.n_infra for g in self.groups)

    @property
    def short_groups(self) -> int:
        """Groups with fewer usable samples than requested."""
        return sum(g.short for g in self.groups)

    def advantages(self, method: AdvantageMethod = "grpo", eps: float = 1e-6) -> list[float]:
        """Per-sample advantages, each group normalised on its own, aligned with `samples`."""
        return [a for g in self.groups for a in g.advantages(method, eps)]

    def to_arrays(
        self,
        pad_id: int = 0,
        advantage: AdvantageMethod | None = "grpo",
        backend: Literal["auto", "numpy", "torch"] = "auto",
    ) -> dict[str, Any]:
        """Padded arrays of `rows` (see `raas_client.arrays.to_arrays`): a rollout split into
        several samples gives several rows, each with the rollout's reward and advantage."""
        adv = self.advantages(advantage) if advantage else None
        repeat = [len(r.training_rows()) for r in self.samples]
        rewards = [x for x, k in zip(self.rewards, repeat) for _ in range(k)]
        expanded = [x for x, k in zip(adv, repeat) for _ in range(k)] if adv else None
        return to_arrays(self.rows, pad_id=pad_id, rewards=rewards, advantages=expanded, backend=backend)


class Collector:
    """Collects one job's groups across training steps: each `collect` goes on from where
    the previous one stopped (its cursor), and a group completed beyond K waits for the next."""

    def __init__(self, client: ResultsSource, job_id: str, after: int = 0) -> None:
        self.client = client
        self.job_id = job_id
        self.cursor = after
        self.pending: dict[str, list[RolloutView]] = defaultdict(list)
        self.closed: set[str] = set()  # instances whose group closed: later rows were cut
        self.ready: list[list[RolloutView]] = []
        self.done = False
        self.expected: int | None = None  # the job's n_samples, read once

    def collect(
        self,
        groups: int,
        timeout: float = 600.0,
        max_staleness: int | None = None,
        current_version: Any = None,
        include_infra: bool = False,
        poll: float = 30.0,
    ) -> Batch:
        """K complete groups or what completed within `timeout` seconds, whichever first."""
        if groups < 1:
            raise ValueError(f"groups={groups}: ask for at least one group")
        started = time.monotonic()
        deadline = started + timeout
        while len(self.ready) < groups and not self.done:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self._read(min(poll, remaining))
        taken, self.ready = self.ready[:groups], self.ready[groups:]
        if taken and self.expected is None:
            self.expected = self.client.job(self.job_id).n_samples
        current = self._current(current_version, taken) if max_staleness is not None else None
        built = [self._group(rows, max_staleness, current, include_infra, self.expected) for rows in taken]
        return Batch(
            groups=built,
            stale=[i for g in built for i in g.stale],
            current_version=current,
            timed_out=len(built) < groups and not self.done,
            job_done=self.done and not self.ready,
            seconds=round(time.monotonic() - started, 3),
            health=self._health(),
        )

    def _health(self) -> HealthView | None:
        """The job's health (`GET /v1/jobs/{id}/health`); None from a source without it."""
        read = getattr(self.client, "job_health", None)
        if read is None:
            return None
        try:
            return read(self.job_id)
        except Exception:  # noqa: BLE001 - an older gateway: the batch is still the batch
            return None

    def _read(self, wait: float) -> None:
        page = self.client.results_page(self.job_id, self.cursor, wait=wait, limit=1000)
        for row in page.items:
            if row.instance_id in self.closed:
                continue  # a sample a straggler cut stopped after its group closed
            self.pending[row.instance_id].append(row)
            if row.group_complete:
                rows = self.pending.pop(row.instance_id)
                self.closed.add(row.instance_id)
                if row.group is not None:  # a straggler cut: the group is its record's members
                    members = set(row.group.members)
                    rows = [r for r in rows if r.rollout_id in members or r.cut_reason]
                self.ready.append(sorted(rows, key=lambda r: r.sample_index))
        self.cursor = page.cursor
        self.done = page.done

    def _current(self, given: Any, taken: list[list[RolloutView]]) -> int | None:
        if given is not None:
            number = version_number(given)
            if number is None:
                raise ValueError(f"current_version={given!r} has no version number")
            return number
        try:
            versions = [version_number(s.weight_version) for s in self.client.llm_servers()]
        except Exception:  # noqa: BLE001 - a tenant may not see the pool: fall back below
            versions = []
        versions += [version_number(v) for rows in taken for r in rows for v in (r.policy_versions or [])]
        known = [v for v in versions if v is not None]
        return max(known) if known else None

    @staticmethod
    def _group(
        rows: list[RolloutView],
        max_staleness: int | None,
        current: int | None,
        include_infra: bool,
        expected: int | None,
    ) -> Group:
        stale = []
        if max_staleness is not None and current is not None:
            for r in rows:
                oldest = oldest_version(r)
                if oldest is not None and current - oldest > max_staleness:
                    stale.append(r.rollout_id)
        return Group(
            job_id=rows[0].job_id,
            instance_id=rows[0].instance_id,
            rollouts=rows,
            stale=stale,
            include_infra=include_infra,
            expected=expected,
        )
