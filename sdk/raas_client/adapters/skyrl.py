"""SkyRL adapter: a generator (`GeneratorInterface`) whose trajectories run in raas.

SkyRL's trainer calls `await generator.generate(GeneratorInput)` with a batch of prompts,
their environment extras and trajectory ids (`instance_id`, `repetition_id`: a GRPO group is
the rows of one instance id), and expects a `GeneratorOutput` in the same order: prompt and
response token ids, loss masks, per-trajectory rewards, logprobs, stop reasons. `RaasGenerator`
sends the whole batch to raas as ONE job (each instance id once, `n_samples` = its
repetitions), waits for its groups and returns SkyRL's own output type, rows in input order.

The raas instance of a row is `env_extras[i]["raas_instance"]` when present, else
`env_extras[i]` itself with the trajectory's instance id. A straggler cut (`spare`,
`group_timeout` in `job`) fills each instance's repetition slots with its group's members; a
short group, like any failed sample, follows `on_failure` (raise, or mask: loss mask 0).

A harness rollout whose program rewrote its history is several training sequences
(`RolloutView.samples`). SkyRL takes several sequences per trajectory in its step-wise mode
(`generator.step_wise_trajectories=true`): with `step_wise=True` every sample is a row of its
own, in order, with the trajectory's id repeated, `is_last_step` True on its last, and the
rollout's reward on each (SkyRL computes the advantage from each trajectory's last step and
gives it to all its steps). Without step-wise, SkyRL's trainer requires one row per prompt:
a split rollout then contributes its last sample, with a warning and the count of the others
in `rollout_metrics["raas/dropped_samples"]` (`on_split="raise"` refuses it instead).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import sys
import time
import typing
from types import ModuleType
from typing import Any, Literal

from raas_client.adapters.rows import OnFailure, RaasRolloutFailed, Sample, missing_sample, samples_of, sampling_of
from raas_client.models import RolloutView
from raas_client.sdk import RaasClient

__all__ = ["RaasGenerator", "RaasRolloutFailed", "skyrl_types"]

logger = logging.getLogger(__name__)


def _import_generators_base() -> ModuleType:
    """SkyRL's generator interface module.

    SkyRL targets Python 3.12 (skyrl-train pins it); on 3.11 its pydantic models built on
    `typing.TypedDict` are refused by pydantic ("use typing_extensions.TypedDict on Python <
    3.12") when `skyrl.backends` is imported. For that import only, `typing.TypedDict` is
    typing_extensions' (the same class on 3.12), then restored; nothing else changes.
    """
    if sys.version_info >= (3, 12) or "skyrl.train.generators.base" in sys.modules:
        return importlib.import_module("skyrl.train.generators.base")
    import typing_extensions

    saved = typing.TypedDict
    typing.TypedDict = typing_extensions.TypedDict  # type: ignore[misc]
    try:
        return importlib.import_module("skyrl.train.generators.base")
    finally:
        typing.TypedDict = saved  # type: ignore[misc]


_base = _import_generators_base()
GeneratorInterface = _base.GeneratorInterface
GeneratorInput = _base.GeneratorInput
GeneratorOutput = _base.GeneratorOutput


def skyrl_types() -> tuple[ModuleType, type, type]:
    """(SkyRL's generators.base module, TrajectoryID, BatchMetadata), for callers and tests."""
    return _base, _base.TrajectoryID, _base.BatchMetadata


class RaasGenerator(GeneratorInterface):
    """A SkyRL generator backed by a raas service."""

    def __init__(
        self,
        url: str,
        agent: str,
        *,
        job: dict[str, Any] | None = None,
        token: str | None = None,
        on_failure: OnFailure = "raise",
        timeout: float = 3600.0,
        step_wise: bool = False,
        on_split: Literal["last", "raise"] = "last",
    ) -> None:
        """`step_wise`: set it as SkyRL's `generator.step_wise_trajectories` is set (every
        sample of a split rollout a row); `on_split`: without it, keep a split rollout's last
        sample (warned, counted) or raise."""
        self.url, self.agent, self.token = url, agent, token
        self.job = dict(job or {})
        self.on_failure = on_failure
        self.timeout = timeout
        if on_split not in ("last", "raise"):
            raise ValueError(f"on_split must be last or raise, not {on_split!r}")
        self.step_wise = step_wise
        self.on_split = on_split

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
        """Run the batch as one raas job; SkyRL's output, rows in input order."""
        return await asyncio.to_thread(self._generate, input_batch)

    def _generate(self, batch: GeneratorInput) -> GeneratorOutput:
        if self.step_wise and not batch.get("trajectory_ids"):
            raise ValueError("step_wise=True needs the batch's trajectory_ids (SkyRL's step-wise rows name them)")
        keys = self._keys(batch)
        instances, counts = self._instances(batch, keys)
        job = {**self.job, "n_samples": max(counts.values())}
        job["sampling"] = {**sampling_of(batch.get("sampling_params")), **job.get("sampling", {})}
        started = time.monotonic()
        with RaasClient(self.url, token=self.token, timeout=60) as client:
            accepted = client.submit(self.agent, instances, **job)
            groups = {g[0].instance_id: g for g in client.groups(accepted.job_id, wait=min(self.timeout, 60))}
        trajectories = [self._slot(groups.get(iid, []), rep) for iid, rep in keys]
        return self._output(batch, trajectories, time.monotonic() - started)

    @staticmethod
    def _keys(batch: GeneratorInput) -> list[tuple[str, int]]:
        ids = batch.get("trajectory_ids")
        if ids:
            return [(str(t.instance_id), int(t.repetition_id)) for t in ids]
        return [(f"p{i}", 0) for i in range(len(batch["prompts"]))]

    @staticmethod
    def _instances(batch: GeneratorInput, keys: list[tuple[str, int]]) -> tuple[list[dict[str, Any]], dict[str, int]]:
        extras = batch.get("env_extras") or [{} for _ in keys]
        instances: dict[str, dict[str, Any]] = {}
        counts: dict[str, int] = {}
        for (iid, _), extra, prompt in zip(keys, extras, batch["prompts"]):
            counts[iid] = counts.get(iid, 0) + 1
            if iid not in instances:
                data = dict((extra or {}).get("raas_instance") or extra or {})
                data.setdefault("messages", prompt)
                instances[iid] = {**data, "instance_id": iid}
        return list(instances.values()), counts

    def _slot(self, group: list[RolloutView], repetition: int) -> list[Sample]:
        """Every training sample of one trajectory slot (one, unless the rollout was split)."""
        if repetition < len(group):
            return samples_of(group[repetition], self.on_failure)
        return [missing_sample(group[0].instance_id if group else None, repetition, self.on_failure)]

    def _rows(self, trajectories: list[list[Sample]]) -> tuple[list[Sample], list[int]]:
        """The output's rows and, for each, its trajectory's place in the input: every sample
        in step-wise mode, else each trajectory's last (a split one warned, or refused)."""
        if self.step_wise:
            return [s for t in trajectories for s in t], [i for i, t in enumerate(trajectories) for _ in t]
        split = [t for t in trajectories if len(t) > 1]
        if split:
            ids = ", ".join(str(t[-1].extra["raas_rollout_id"]) for t in split)
            message = (
                f"{len(split)} raas rollout(s) split into several training samples ({ids}); without "
                "step-wise training SkyRL takes one sequence per trajectory"
            )
            if self.on_split == "raise":
                raise RaasRolloutFailed(f"{message}: set generator.step_wise_trajectories and step_wise=True")
            logger.warning("%s: kept each one's last sample, dropped %d", message, sum(len(t) - 1 for t in split))
        return [t[-1] for t in trajectories], list(range(len(trajectories)))

    def _output(self, batch: GeneratorInput, trajectories: list[list[Sample]], seconds: float) -> GeneratorOutput:
        samples, owners = self._rows(trajectories)
        finals = [s.reward for s in samples if s.is_last]  # per trajectory, as SkyRL's own metrics
        ids = batch.get("trajectory_ids")
        return GeneratorOutput(
            prompt_token_ids=[s.prompt_ids for s in samples],
            response_ids=[s.response_ids for s in samples],
            rewards=[s.reward for s in samples],  # each sample: its rollout's reward
            loss_masks=[s.loss_mask for s in samples],
            stop_reasons=[s.finish_reason or "stop" for s in samples],
            rollout_metrics={
                "raas/avg_reward": sum(finals) / len(finals) if finals else 0.0,
                "raas/failed": sum(bool(s.extra["raas_failed"]) for s in samples if s.is_last),
                "raas/generate_seconds": seconds,
                "raas/split_rollouts": sum(len(t) > 1 for t in trajectories),
                "raas/dropped_samples": sum(len(t) for t in trajectories) - len(samples),
            },
            rollout_logprobs=[s.logprobs for s in samples],
            trajectory_ids=[ids[i] for i in owners] if ids else None,
            trajectory_generation_times=[s.seconds for s in samples],
            rollout_expert_indices=None,
            is_last_step=[s.is_last for s in samples] if self.step_wise else None,
            env_metrics=[s.extra for s in samples],
            pixel_values=None,
            image_grid_thw=None,
        )
