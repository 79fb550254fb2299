"""The SkyRL adapter against the real SkyRL package (CPU): SkyRL's `GeneratorInterface`
implemented by raas, a batch of two GRPO groups run through the real pipeline with the
simulator, and the `GeneratorOutput` checked by SkyRL's own validator."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("skyrl", reason="needs the skyrl extra (make test-adapters)")

from tests.adapters.conftest import SPLIT_CONFIG, SPLIT_INSTANCE, TOOL_REPLY

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


def split_batch(base, TrajectoryID, BatchMetadata, instance_id: str, repetitions: int):
    """A batch of the split harness instance, `repetitions` trajectories of it."""
    ids = [TrajectoryID(instance_id, r) for r in range(repetitions)]
    return base.GeneratorInput(
        prompts=[[{"role": "user", "content": "What is 3 + 4?"}] for _ in ids],
        env_classes=["raas"] * len(ids),
        env_extras=[{"raas_instance": dict(SPLIT_INSTANCE["data"])}] * len(ids),
        sampling_params={"max_tokens": 64},
        trajectory_ids=ids,
        batch_metadata=BatchMetadata(global_step=0, training_phase="train"),
    )


@pytest.fixture(scope="module")
def split_outputs(raas_service) -> dict[str, object]:
    """The split harness rollout through `generate()` three ways, at once: step-wise (two
    trajectories of it), one row per trajectory, and one row per trajectory told to refuse;
    each value the `GeneratorOutput` or the exception."""
    from raas_client.adapters.skyrl import RaasGenerator, skyrl_types

    base, TrajectoryID, BatchMetadata = skyrl_types()
    job = {"agent_config": SPLIT_CONFIG}
    runs = {
        "step_wise": (RaasGenerator(raas_service.url, "harness", job=job, step_wise=True), 2),
        "last": (RaasGenerator(raas_service.url, "harness", job=job), 1),
        "refuse": (RaasGenerator(raas_service.url, "harness", job=job, on_split="raise"), 1),
    }

    async def run_all() -> list[object]:
        return await asyncio.gather(
            *(
                generator.generate(split_batch(base, TrajectoryID, BatchMetadata, f"split-{name}", n))
                for name, (generator, n) in runs.items()
            ),
            return_exceptions=True,
        )

    return dict(zip(runs, asyncio.run(run_all()), strict=True))


def test_skyrl_step_wise_receives_every_sample_of_a_split_rollout(raas_service, split_outputs) -> None:
    from raas_client.adapters.skyrl import skyrl_types
    from skyrl.train.utils.trainer_utils import validate_generator_output

    _, TrajectoryID, _ = skyrl_types()
    out = split_outputs["step_wise"]
    assert isinstance(out, dict), out
    validate_generator_output(2, out, step_wise=True)  # SkyRL's own check of step-wise rows
    # two trajectories, two samples each: contiguous, the last of each marked
    assert out["trajectory_ids"] == [TrajectoryID("split-step_wise", r) for r in (0, 0, 1, 1)]
    assert out["is_last_step"] == [False, True, False, True]
    assert out["rewards"] == [1.0] * 4  # each sample: its rollout's reward (the math EVAL's)
    rollout_ids = [m["raas_rollout_id"] for m in out["env_metrics"]]
    assert rollout_ids[0] == rollout_ids[1] != rollout_ids[2] == rollout_ids[3]
    for row in (0, 2):
        samples = raas_service.client.rollout(rollout_ids[row]).samples
        assert len(samples) == 2 and samples[1].split_reason == "history_rewritten"
        for k, sample in enumerate(samples):
            assert out["prompt_token_ids"][row + k] == sample.prompt_ids
            assert out["response_ids"][row + k] == sample.response_ids
            assert out["loss_masks"][row + k] == sample.loss_mask
            assert out["rollout_logprobs"][row + k] == sample.response_logprobs
            assert sum(sample.loss_mask) > 0 and out["env_metrics"][row + k]["raas_sample"] == k
    assert out["response_ids"][0] != out["response_ids"][1]  # the two samples are different turns
    assert out["rollout_metrics"]["raas/split_rollouts"] == 2
    assert out["rollout_metrics"]["raas/dropped_samples"] == 0 and out["rollout_metrics"]["raas/avg_reward"] == 1.0


def test_skyrl_without_step_wise_keeps_the_last_sample_counted_or_refuses(split_outputs) -> None:
    from skyrl.train.utils.trainer_utils import validate_generator_output

    out = split_outputs["last"]
    assert isinstance(out, dict), out
    validate_generator_output(1, out)
    assert out["is_last_step"] is None and out["rewards"] == [1.0]
    assert out["env_metrics"][0]["raas_sample"] == 1 and out["env_metrics"][0]["raas_samples"] == 2
    assert out["rollout_metrics"]["raas/dropped_samples"] == 1
    stepwise = split_outputs["step_wise"]
    assert len(out["response_ids"][0]) == len(stepwise["response_ids"][1])  # the last sample's arrays
    from raas_client.adapters.rows import RaasRolloutFailed

    refused = split_outputs["refuse"]
    assert isinstance(refused, RaasRolloutFailed) and "step_wise_trajectories" in str(refused)
