"""The SkyRL adapter against the real SkyRL package (CPU): SkyRL's `GeneratorInterface`
implemented by raas, a batch of two GRPO groups run through the real pipeline with the
simulator, and the `GeneratorOutput` checked by SkyRL's own validator."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("skyrl", reason="needs the skyrl extra (make test-adapters)")

from tests.adapters.conftest import TOOL_REPLY

pytestmark = pytest.mark.adapters


def test_skyrl_generator_output_from_raas(raas_service) -> None:
    from raas_client.adapters.skyrl import RaasGenerator, skyrl_types

    base, TrajectoryID, BatchMetadata = skyrl_types()
    generator = RaasGenerator(raas_service.url, "test-chat", job={"agent_config": {"observation_words": 10}})
    assert isinstance(generator, base.GeneratorInterface)
    ids = [TrajectoryID("a", 0), TrajectoryID("a", 1), TrajectoryID("b", 0), TrajectoryID("b", 1)]
    batch = base.GeneratorInput(
        prompts=[[{"role": "user", "content": f"task {t.instance_id}"}] for t in ids],
        env_classes=["raas"] * 4,
        env_extras=[{"raas_instance": {"turns": 2}}] * 4,
        sampling_params={"temperature": 1.0, "max_tokens": 256},
        trajectory_ids=ids,
        batch_metadata=BatchMetadata(global_step=0, training_phase="train"),
    )
    out = asyncio.run(generator.generate(batch))
    from skyrl.train.utils.trainer_utils import validate_generator_output

    validate_generator_output(len(ids), out)  # SkyRL's own check of a generator's output
    assert set(base.GeneratorOutput.__annotations__) <= set(out)
    assert out["trajectory_ids"] == ids and out["rewards"] == [1.0] * 4
    for response, mask, logprobs in zip(out["response_ids"], out["loss_masks"], out["rollout_logprobs"]):
        assert len(response) == len(mask) == len(logprobs) > 0
        spans = "".join(str(m) for m in mask)
        assert spans.startswith("1") and spans.count("01") == 1  # model, observation, model
    assert all(p for p in out["prompt_token_ids"])
    assert out["stop_reasons"] and out["rollout_metrics"]["raas/failed"] == 0
    # one raas job for the batch: each instance once, two samples each
    jobs = raas_service.client.jobs().jobs
    assert jobs[0].n_instances == 2 and jobs[0].n_samples == 2
    assert TOOL_REPLY  # the simulator's turn-0 reply is what the masks cover
