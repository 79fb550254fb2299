"""A harness rollout's record (`Trajectory`): its samples as training data, its counters as metrics.

Shape (the results API, the SDK's `Batch` and the ProRL routes read it): the rollout's main
arrays (`prompt_ids`, `response_ids`, `response_logprobs`, `loss_mask`, `policy_versions`,
`messages`) are its *last* sample; when the harness rewrote its history there are several
samples and `extra["samples"]` lists every one in order (the last one included), each with
its own arrays, `split_reason` (why the sample before it ended) and `calls`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agents.abstract import Trajectory
from agents.harness.samples import Sample

if TYPE_CHECKING:
    from agents.harness.calls import CallRunner


def versions(traj: Any) -> list[Any]:
    """Each generated turn's weight version (`policy_versions` on the record type that
    replaces the builder's dataclass, `weight_versions` on it today)."""
    found = getattr(traj, "policy_versions", None)
    return list(found if found is not None else traj.weight_versions)


def sample_dict(sample: Sample) -> dict[str, Any]:
    """One sample's arrays (the wire's `SampleArrays`)."""
    traj = sample.trajectory
    return {
        "prompt_ids": list(traj.prompt_ids),
        "response_ids": list(traj.response_ids),
        "response_logprobs": list(traj.response_logprobs),
        "loss_mask": list(traj.loss_mask),
        "policy_versions": versions(traj),
        "turn_boundaries": [list(b) for b in traj.turn_boundaries],
        "finish_reason": traj.finish_reason,
        "split_reason": sample.split_reason,
        "calls": sample.calls,
    }


def run_result(runner: CallRunner, counters: dict[str, Any], outcome: str, finish_reason: str | None) -> Trajectory:
    """The record of the rollout (see the module docstring)."""
    samples = runner.tracker.training_samples()
    metrics: dict[str, Any] = dict(counters)
    extra: dict[str, Any] = {}
    if not samples:
        return Trajectory.build(outcome=outcome, finish_reason=finish_reason, metrics=metrics, extra=extra)
    metrics.update(_drift(samples))
    last = samples[-1].trajectory
    if len(samples) > 1:
        extra["samples"] = [sample_dict(s) for s in samples]
    extra["turn_boundaries"] = [list(b) for b in last.turn_boundaries]
    extra["message_token_counts"] = list(last.message_token_counts)
    extra["tools"] = list(samples[-1].builder.tools or [])  # what the harness offered the model
    seen = [v for s in samples for v in versions(s.trajectory)]
    metrics["weight_versions"] = list(dict.fromkeys(seen))
    metrics["response_tokens"] = sum(len(s.trajectory.response_ids) for s in samples)
    metrics["context_length"] = runner.session.context_length
    return Trajectory.build(
        outcome=outcome,
        finish_reason=finish_reason,
        prompt_ids=list(last.prompt_ids),
        response_ids=list(last.response_ids),
        response_logprobs=list(last.response_logprobs),
        loss_mask=list(last.loss_mask),
        policy_versions=versions(last),
        token_exact=last.token_exact,
        messages=[dict(m) for m in last.messages],
        metrics=metrics,
        extra=extra,
    )


def _drift(samples: list[Sample]) -> dict[str, Any]:
    """The drift audit over every sample: positions that differ from a full re-render."""
    reports = [s.builder.audit_drift() for s in samples]
    return {
        "retokenization_drift": sum(r["retokenization_drift"] for r in reports),
        "drift_samples": [i for i, r in enumerate(reports) if r["retokenization_drift"]],
        "forged_control_tokens": sum(r.get("forged_control_tokens", 0) for r in reports),
    }
