"""verl adapter: an agent loop (`AgentLoopBase`) whose rollouts run in raas.

verl's agent-loop workers call `run(sampling_params, **dataset_fields)` once per sample and
expect an `AgentLoopOutput` (prompt ids, response ids, response mask 1 on generated tokens,
logprobs, reward). `RaasAgentLoop` submits that sample to raas as a one-instance job (the raas
handler runs the multi-turn loop against the inference servers registered with raas, in its
sandbox, and grades it), waits for the row, and returns verl's own output type. Registered
under the agent name `raas`; configure it in the agent-loop config file
(`actor_rollout_ref.rollout.agent.agent_loop_config_path`)::

    - name: raas
      _target_: raas_client.adapters.verl.RaasAgentLoop
      raas_url: http://raas-gateway:8000
      raas_agent: math
      raas_job: {limits: {max_turns: 8}}        # any other job field
      raas_on_failure: raise                    # or mask
      raas_samples: auto                        # or all / last: a split rollout (below)

or with `RAAS_URL` / `RAAS_TOKEN` in the workers' environment. A dataset row's
`extra_info.raas_instance` (a dict with `instance_id` and the handler's fields) is the raas
instance; without it the row's `raw_prompt` is sent as `{"messages": ...}`.

A harness rollout whose program rewrote its history is several training sequences
(`RolloutView.samples`). verl's V1 trainer (`trainer.use_v1`, verl's default) takes a list of
`AgentLoopOutput` from one `run()` (its TransferQueue worker stores each as `{uid}_{session}_{i}`,
gives the last one's reward to all, and GRPO broadcasts the last one's advantage to every
output of the session): `run()` then returns every sample, in order, each with the rollout's
reward. The legacy worker (`trainer.use_v1=false`) takes exactly one output per `run()`: the
last sample is returned (as before), the earlier ones ride in its
`extra_fields["raas_earlier_samples"]` (verl puts extra fields in the batch's
`non_tensor_batch`, unused by its trainer), with a warning; `raas_on_split: raise` refuses
instead. `raas_samples` forces `all` or `last`; `auto` follows `trainer.use_v1`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import uuid
from typing import Any, Literal

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    register,
)

from raas_client.adapters.rows import OnFailure, RaasRolloutFailed, Sample, sample_of, samples_of, sampling_of
from raas_client.models import RolloutView
from raas_client.sdk import RaasClient

__all__ = ["RaasAgentLoop", "RaasRolloutFailed", "to_agent_loop_output", "to_agent_loop_outputs"]

logger = logging.getLogger(__name__)

SamplesMode = Literal["auto", "all", "last"]


def to_agent_loop_output(
    row: RolloutView, on_failure: OnFailure = "raise", max_response: int | None = None
) -> AgentLoopOutput:
    """verl's output type for one finished raas row's main arrays (a split rollout: its last
    sample; `to_agent_loop_outputs` gives them all)."""
    return _output(row, sample_of(row, on_failure, max_response))


def to_agent_loop_outputs(
    row: RolloutView, on_failure: OnFailure = "raise", max_response: int | None = None
) -> list[AgentLoopOutput]:
    """verl's outputs for every training sample of one finished raas row, in order, each
    with the rollout's reward (one output unless the rollout was split)."""
    return [_output(row, s) for s in samples_of(row, on_failure, max_response)]


def _output(row: RolloutView, sample: Sample) -> AgentLoopOutput:
    # reward_extra_info: verl's V1 worker copies the last output's to the others of a list
    extra = {**sample.extra, "reward_extra_info": {}}
    return AgentLoopOutput(
        prompt_ids=sample.prompt_ids,
        response_ids=sample.response_ids,
        response_mask=sample.loss_mask,
        response_logprobs=sample.logprobs,
        reward_score=sample.reward,
        num_turns=len(row.messages or []) or sample.turns,
        metrics=AgentLoopMetrics(
            generate_sequences=row.timing.run or 0.0,
            compute_score=row.timing.eval or 0.0,
        ),
        extra_fields=extra,
    )


def _plain(value: Any) -> Any:
    """A config value as plain Python (OmegaConf containers resolved)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return dict(value) if isinstance(value, dict) else value


@register("raas")
class RaasAgentLoop(AgentLoopBase):
    """A verl agent loop that runs each sample as a raas rollout."""

    def __init__(
        self,
        *args: Any,
        raas_url: str | None = None,
        raas_agent: str | None = None,
        raas_job: dict[str, Any] | None = None,
        raas_token: str | None = None,
        raas_on_failure: OnFailure = "raise",
        raas_timeout: float = 3600.0,
        raas_samples: SamplesMode = "auto",
        raas_on_split: Literal["warn", "raise"] = "warn",
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.raas_url = raas_url or os.environ.get("RAAS_URL", "http://127.0.0.1:8000")
        self.raas_agent = raas_agent or os.environ.get("RAAS_AGENT", "math")
        # hydra hands config values over as DictConfig: the job goes out as plain JSON
        self.raas_job = _plain(raas_job or {})
        self.raas_token = raas_token or os.environ.get("RAAS_TOKEN")
        self.raas_on_failure = raas_on_failure
        self.raas_timeout = raas_timeout
        if raas_samples not in ("auto", "all", "last"):
            raise ValueError(f"raas_samples must be auto, all or last, not {raas_samples!r}")
        if raas_on_split not in ("warn", "raise"):
            raise ValueError(f"raas_on_split must be warn or raise, not {raas_on_split!r}")
        self.raas_samples = raas_samples
        self.raas_on_split = raas_on_split

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        """Submit this sample to raas, wait for it, return verl's output (a list of them for a
        split rollout when the trainer takes one, see the module docstring)."""
        instance = self.raas_instance(kwargs)
        row = await asyncio.to_thread(self._rollout, instance, sampling_params)
        outputs = to_agent_loop_outputs(row, self.raas_on_failure, self.rollout_config.get("response_length"))
        if len(outputs) == 1:
            return outputs[0]
        if self.takes_lists():
            return outputs
        return self._last_only(row, outputs)

    def takes_lists(self) -> bool:
        """Whether the calling worker accepts a list of outputs: verl's V1 one does."""
        if self.raas_samples != "auto":
            return self.raas_samples == "all"
        trainer = self.config.get("trainer") or {}
        return bool(trainer.get("use_v1", True))  # verl's default since 0.9

    def _last_only(self, row: RolloutView, outputs: list[AgentLoopOutput]) -> AgentLoopOutput:
        """The legacy worker's one output: the last sample, the earlier ones in its extra fields."""
        message = (
            f"raas rollout {row.rollout_id} has {len(outputs)} training samples (its harness rewrote its "
            "history) and verl's legacy agent-loop worker takes one output per run"
        )
        if self.raas_on_split == "raise":
            raise RaasRolloutFailed(f"{message}: use verl's V1 trainer (trainer.use_v1=true)", row)
        logger.warning("%s: returning the last, the others in extra_fields['raas_earlier_samples']", message)
        last = outputs[-1]
        last.extra_fields["raas_earlier_samples"] = [
            {
                "prompt_ids": o.prompt_ids,
                "response_ids": o.response_ids,
                "response_mask": o.response_mask,
                "response_logprobs": o.response_logprobs,
                "reward_score": o.reward_score,
            }
            for o in outputs[:-1]
        ]
        return last

    def raas_instance(self, fields: dict[str, Any]) -> dict[str, Any]:
        """The raas instance of a dataset row (override for another mapping)."""
        extra = fields.get("extra_info") or {}
        if isinstance(extra, dict) and isinstance(extra.get("raas_instance"), dict):
            return dict(extra["raas_instance"])
        return {
            "instance_id": str(fields.get("index", uuid.uuid4().hex)),
            "messages": list(fields.get("raw_prompt") or []),
        }

    def _rollout(self, instance: dict[str, Any], sampling_params: dict[str, Any]) -> RolloutView:
        job = {**self.raas_job}
        job["sampling"] = {**sampling_of(sampling_params), **job.get("sampling", {})}
        with RaasClient(self.raas_url, token=self.raas_token, timeout=60) as client:
            accepted = client.submit(self.raas_agent, [instance], n_samples=1, **job)
            for row in client.results(accepted.job_id, wait=min(self.raas_timeout, 60)):
                return row
        raise TimeoutError(f"raas job {accepted.job_id} returned no row")
