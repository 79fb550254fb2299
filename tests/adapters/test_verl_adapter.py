"""The verl adapter against the real verl package (CPU): verl's own agent-loop registry and
instantiation, raas running the rollout through the real pipeline with the simulator, and
verl's `AgentLoopOutput` (ids, mask, logprobs, reward) checked, down to `as_dict` tensors."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

verl_loop = pytest.importorskip(
    "verl.experimental.agent_loop.agent_loop", reason="needs the verl extra (make test-adapters)"
)

from fakellm.server import BUNDLED_TOKENIZER  # noqa: E402
from tests.adapters.conftest import SPLIT_CONFIG, SPLIT_INSTANCE, TOOL_REPLY  # noqa: E402

pytestmark = pytest.mark.adapters


def make_loop(raas_url: str, use_v1: bool | None = None, **raas: object):
    """The adapter as verl's AgentLoopWorker makes one: hydra.instantiate of the registry
    entry with the worker's constructor arguments (`use_v1`: the trainer's setting, if any)."""
    import hydra
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    import raas_client.adapters.verl  # noqa: F401 - registers "raas"

    entry = verl_loop._agent_loop_registry["raas"]
    assert entry["_target_"] == "raas_client.adapters.verl.RaasAgentLoop"
    config = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"prompt_length": 2048, "response_length": 2048}}, "data": {}}
    )
    if use_v1 is not None:
        config.trainer = {"use_v1": use_v1}
    return hydra.utils.instantiate(
        config={**entry, "raas_url": raas_url, "raas_agent": "test-chat", **raas},
        trainer_config=verl_loop.DictConfigWrap(config=config),
        server_manager=None,
        tokenizer=AutoTokenizer.from_pretrained(str(BUNDLED_TOKENIZER)),
        processor=None,
        hf_model_type=None,
        dataset_cls=None,
        data_config=verl_loop.DictConfigWrap(config.data),
        tools=verl_loop.ToolListWrap([]),
    )


def test_verl_agent_loop_output_from_raas(raas_service) -> None:
    loop = make_loop(raas_service.url, raas_job={"agent_config": {"observation_words": 10}})
    assert isinstance(loop, verl_loop.AgentLoopBase)
    out = asyncio.run(
        loop.run(
            {"temperature": 1.0, "top_p": 1.0, "logprobs": True},
            raw_prompt=[{"role": "user", "content": "go"}],
            index=3,
            extra_info={"raas_instance": {"instance_id": "v3", "turns": 2}},
        )
    )
    assert isinstance(out, verl_loop.AgentLoopOutput)
    assert out.prompt_ids and out.response_ids
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs)
    # mask 1 exactly on the model's two turns, 0 on the observation between them
    spans = "".join(str(m) for m in out.response_mask)
    assert spans.count("01") == 1 and spans.startswith("1") and set(spans) == {"0", "1"}
    generated = [t for t, m in zip(out.response_ids, out.response_mask) if m]
    assert loop.tokenizer.decode(generated).startswith(TOOL_REPLY)  # the model's own tokens
    assert all(lp <= 0 for lp in out.response_logprobs)
    assert out.reward_score == 1.0 and out.num_turns >= 4
    assert out.extra_fields["raas_outcome"] == "completed"
    tensors = out.as_dict()  # what verl's worker pads and batches
    assert tensors["responses"].shape == tensors["response_mask"].shape
    assert tensors["rollout_log_probs"].shape == tensors["responses"].shape


def test_verl_failure_rule(raas_service) -> None:
    from raas_client.adapters.rows import RaasRolloutFailed
    from raas_client.adapters.verl import to_agent_loop_output

    from raas_client.models import RolloutView

    failed = {
        "rollout_id": "r",
        "job_id": "j",
        "attempt": 1,
        "timing": {},
        "created_at": "2026-01-01T00:00:00Z",
        "instance_id": "i",
        "sample_index": 0,
        "status": "failed",
        "outcome": "infra_error",
        "error": "node lost",
        "reward": None,
        "prompt_ids": [1],
        "response_ids": [2, 3],
        "loss_mask": [1, 1],
        "response_logprobs": [-0.1, -0.2],
    }
    failed = RolloutView.model_validate(failed)
    with pytest.raises(RaasRolloutFailed):
        to_agent_loop_output(failed)
    masked = to_agent_loop_output(failed, on_failure="mask")
    assert masked.response_mask == [0, 0] and masked.reward_score == 0.0


def split_instance(name: str) -> dict:
    """The split harness instance under its own id (`v1_wrong`: gold answer 8, the harness writes 7)."""
    data = {**SPLIT_INSTANCE["data"], **({"answer": "8"} if name == "v1_wrong" else {})}
    return {"instance_id": f"split-{name}", "data": data}


@pytest.fixture(scope="module")
def split_runs(raas_service) -> dict[str, object]:
    """The split harness rollout through `run()` four ways, at once: verl's V1 trainer (the
    default: a list), again with a wrong gold answer (reward 0: its GRPO group mate), the
    legacy worker (`trainer.use_v1=false`: one output) and the legacy worker told to refuse;
    each value the output(s) or the exception."""
    job = {"agent_config": SPLIT_CONFIG, "sampling": {"max_tokens": 64}}
    loops = {
        "v1": make_loop(raas_service.url, raas_agent="harness", raas_job=job, use_v1=True),
        "v1_wrong": make_loop(raas_service.url, raas_agent="harness", raas_job=job, use_v1=True),
        "legacy": make_loop(raas_service.url, raas_agent="harness", raas_job=job, use_v1=False),
        "refuse": make_loop(raas_service.url, raas_agent="harness", raas_job=job, use_v1=False, raas_on_split="raise"),
    }

    async def run_all() -> list[object]:
        return await asyncio.gather(
            *(
                loop.run(
                    {"temperature": 1.0, "logprobs": True},
                    raw_prompt=[{"role": "user", "content": "What is 3 + 4?"}],
                    extra_info={"raas_instance": split_instance(name)},
                )
                for name, loop in loops.items()
            ),
            return_exceptions=True,
        )

    return dict(zip(loops, asyncio.run(run_all()), strict=True))


def stored_samples(raas_service, rollout_id: str):
    """The rollout's samples as raas recorded them."""
    return raas_service.client.rollout(rollout_id).samples


def test_verl_v1_receives_every_sample_of_a_split_rollout(raas_service, split_runs) -> None:
    outputs = split_runs["v1"]
    assert isinstance(outputs, list) and len(outputs) == 2, outputs
    assert all(isinstance(o, verl_loop.AgentLoopOutput) for o in outputs)
    samples = stored_samples(raas_service, outputs[0].extra_fields["raas_rollout_id"])
    tokenizer = make_loop(raas_service.url).tokenizer
    for k, (out, sample) in enumerate(zip(outputs, samples, strict=True)):
        assert out.prompt_ids == sample.prompt_ids and out.response_ids == sample.response_ids
        assert out.response_mask == sample.loss_mask and out.response_logprobs == sample.response_logprobs
        assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs) > 0
        assert out.reward_score == 1.0  # the rollout's reward (the math EVAL graded its answer), on each
        assert out.extra_fields["raas_sample"] == k and out.extra_fields["raas_samples"] == 2
        assert out.extra_fields["reward_extra_info"] == {}  # V1 copies the last one's to the others
        tensors = out.as_dict()  # what verl's V1 worker stores per output
        assert tensors["rm_scores"][-1] == 1.0 and tensors["rollout_log_probs"].shape == tensors["responses"].shape
    first, second = outputs
    assert first.prompt_ids != second.prompt_ids  # the rewritten history
    assert second.extra_fields["raas_split_reason"] == "history_rewritten"
    generated = [[t for t, m in zip(o.response_ids, o.response_mask) if m] for o in outputs]
    assert tokenizer.decode(generated[0]).startswith("Reading it.")  # the simulator's turn 0
    assert tokenizer.decode(generated[1]).startswith("Done.")  # its turn 1
    assert all(lp <= 0 for o in outputs for lp in o.response_logprobs) and any(lp < 0 for lp in first.response_logprobs)


def test_verl_legacy_worker_gets_the_last_sample_and_the_others_beside_it(raas_service, split_runs) -> None:
    out = split_runs["legacy"]
    assert isinstance(out, verl_loop.AgentLoopOutput), out
    first, last = stored_samples(raas_service, out.extra_fields["raas_rollout_id"])
    assert out.response_ids == last.response_ids and out.response_mask == last.loss_mask
    assert out.response_logprobs == last.response_logprobs and out.prompt_ids == last.prompt_ids
    assert out.reward_score == 1.0 and out.extra_fields["raas_sample"] == 1
    [earlier] = out.extra_fields["raas_earlier_samples"]
    assert earlier["prompt_ids"] == first.prompt_ids and earlier["response_ids"] == first.response_ids
    assert earlier["response_mask"] == first.loss_mask and earlier["response_logprobs"] == first.response_logprobs
    assert earlier["reward_score"] == 1.0
    refused = split_runs["refuse"]
    from raas_client.adapters.rows import RaasRolloutFailed

    assert isinstance(refused, RaasRolloutFailed) and "trainer.use_v1=true" in str(refused)
    assert refused.row is not None and len(refused.row.samples) == 2


def test_verl_v1_worker_stores_each_sample_and_grpo_gives_them_the_rollouts_advantage(split_runs, monkeypatch) -> None:
    """verl's own V1 code on the lists `run()` returned: `AgentLoopWorkerTQ._agent_loop_postprocess`
    (each output stored as `{uid}_{session}_{i}`, the last one's reward given to all) and
    `compute_advantage_for_multi_trajectories` (GRPO over each session's last output,
    broadcast to the others). The TransferQueue store, a Ray-actor service, is the one fake:
    its put records what it is given."""
    import torch
    from verl.protocol import DataProto
    from verl.trainer.ppo.core_algos import AdvantageEstimator
    from verl.trainer.ppo.v1 import agent_loop_tq
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    stored: dict[str, dict] = {}

    async def put(keys, fields, tags, partition_id):  # fake TransferQueue: records the puts
        stored.update({k: fields[i] for i, k in enumerate(keys)})

    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_batch_put", put)
    worker = object.__new__(agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__)
    worker.processor, worker.reward_loop_worker_handles, worker.distillation_enabled = None, None, False
    right, wrong = split_runs["v1"], split_runs["v1_wrong"]
    assert isinstance(wrong, list) and [o.reward_score for o in wrong] == [0.0, 0.0], wrong
    for session, outputs in enumerate((right, wrong)):
        prompt = {"uid": "u1", "session_id": session, "global_steps": 1, "raw_prompt": []}
        asyncio.run(worker._agent_loop_postprocess(outputs, False, **prompt))
    keys = sorted(stored)
    assert keys == ["u1_0_0", "u1_0_1", "u1_1_0", "u1_1_1"]  # every sample of both rollouts
    assert stored["u1_0_0"]["responses"].tolist() == right[0].response_ids

    rows = [stored[k] for k in keys]
    width = max(len(r["responses"]) for r in rows)

    def padded(name: str) -> torch.Tensor:
        return torch.stack([torch.nn.functional.pad(r[name], (0, width - len(r[name]))) for r in rows])

    data = DataProto.from_dict(
        tensors={"response_mask": padded("response_mask"), "token_level_rewards": padded("rm_scores")},
        non_tensors={"uid": np.array([r["uid"] for r in rows], dtype=object)},
    )
    advantages = compute_advantage_for_multi_trajectories(data, keys, AdvantageEstimator.GRPO).batch["advantages"]
    masks = data.batch["response_mask"].bool()
    per_row = [advantages[i][masks[i]].unique().tolist() for i in range(len(rows))]
    assert all(len(v) == 1 for v in per_row)  # one advantage per row, on its generated tokens
    assert per_row[0] == per_row[1] and per_row[2] == per_row[3]  # each sample: its rollout's advantage
    assert per_row[0][0] > 0 > per_row[2][0]  # reward 1 above its group, reward 0 below
