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
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
import typing
from types import ModuleType
from typing import Any

from raas_client.adapters.rows import OnFailure, RaasRolloutFailed, Sample, missing_sample, sample_of, sampling_of
from raas_client.models import RolloutView
from raas_client.sdk import RaasClient

__all__ = ["RaasGenerator", "RaasRolloutFailed", "skyrl_types"]


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
    ) -> None:
        self.url, self.agent, self.token = url, agent, token
        self.job = dict(job or {})
        self.on_failure = on_failure
        self.timeout = timeout

    async def generate(self, input_batch: GeneratorInput) -> GeneratorOutput:
        """Run the batch as one raas job; SkyRL's output, rows in input order."""
        return await asyncio.to_thread(self._generate, input_batch)

    def _generate(self, batch: GeneratorInput) -> GeneratorOutput:
        keys = self._keys(batch)
        instances, counts = self._instances(batch, keys)
        job = {**self.job, "n_samples": max(counts.values())}
        job["sampling"] = {**sampling_of(batch.get("sampling_params")), **job.get("sampling", {})}
        started = time.monotonic()
        with RaasClient(self.url, token=self.token, timeout=60) as client:
            accepted = client.submit(self.agent, instances, **job)
            groups = {g[0].instance_id: g for g in client.groups(accepted.job_id, wait=min(self.timeout, 60))}
        samples = [self._slot(groups.get(iid, []), rep) for iid, rep in keys]
        return self._output(batch, samples, time.monotonic() - started)

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

    def _slot(self, group: list[RolloutView], repetition: int) -> Sample:
        if repetition < len(group):
            return sample_of(group[repetition], self.on_failure)
        return missing_sample(group[0].instance_id if group else None, repetition, self.on_failure)

    @staticmethod
    def _output(batch: GeneratorInput, samples: list[Sample], seconds: float) -> GeneratorOutput:
        rewards = [s.reward for s in samples]
        return GeneratorOutput(
            prompt_token_ids=[s.prompt_ids for s in samples],
            response_ids=[s.response_ids for s in samples],
            rewards=rewards,
            loss_masks=[s.loss_mask for s in samples],
            stop_reasons=[s.finish_reason or "stop" for s in samples],
            rollout_metrics={
                "raas/avg_reward": sum(rewards) / len(rewards) if rewards else 0.0,
                "raas/failed": sum(bool(s.extra["raas_failed"]) for s in samples),
                "raas/generate_seconds": seconds,
            },
            rollout_logprobs=[s.logprobs for s in samples],
            trajectory_ids=batch.get("trajectory_ids"),
            trajectory_generation_times=[s.seconds for s in samples],
            rollout_expert_indices=None,
            is_last_step=None,
            env_metrics=[s.extra for s in samples],
            pixel_values=None,
            image_grid_thw=None,
        )
