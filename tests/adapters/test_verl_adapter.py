"""The verl adapter against the real verl package (CPU): verl's own agent-loop registry and
instantiation, raas running the rollout through the real pipeline with the simulator, and
verl's `AgentLoopOutput` (ids, mask, logprobs, reward) checked, down to `as_dict` tensors."""

from __future__ import annotations

import asyncio

import pytest

verl_loop = pytest.importorskip(
    "verl.experimental.agent_loop.agent_loop", reason="needs the verl extra (make test-adapters)"
)

from fakellm.server import BUNDLED_TOKENIZER  # noqa: E402
from tests.adapters.conftest import TOOL_REPLY  # noqa: E402

pytestmark = pytest.mark.adapters


def make_loop(raas_url: str, **raas: object):
    """The adapter as verl's AgentLoopWorker makes one: hydra.instantiate of the registry
    entry with the worker's constructor arguments."""
    import hydra
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    import raas_client.adapters.verl  # noqa: F401 - registers "raas"

    entry = verl_loop._agent_loop_registry["raas"]
    assert entry["_target_"] == "raas_client.adapters.verl.RaasAgentLoop"
    config = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"prompt_length": 2048, "response_length": 2048}}, "data": {}}
    )
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
