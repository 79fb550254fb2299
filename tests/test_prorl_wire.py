"""ProRL's dataset rows and sampling_params mapped onto raas jobs (no service needed)."""

from __future__ import annotations

import json

import pytest

from app.api.prorl_datasets import io_cases, map_instance
from app.api.prorl_wire import IGNORED_KEYS, ProRLSampling
from core.errors import InvalidRequest


def test_sampling_params_map_to_sampling_limits_and_llm() -> None:
    parts = ProRLSampling.model_validate(
        {
            "temperature": 0.6,
            "top_p": 0.9,
            "max_iterations": 7,
            "max_output_tokens": 512,
            "max_input_tokens": 2048,
            "max_model_len": 4096,
            "enable_thinking": False,
            "stop": "</answer>",
            "model": "hosted_vllm/x",
            "api_key": "k",
        }
    ).job_parts()
    assert parts == {
        "sampling": {"temperature": 0.6, "top_p": 0.9, "stop": ["</answer>"], "max_tokens": 512},
        "limits": {"max_turns": 7},
        "llm": {"max_model_len": 2560, "chat_template_kwargs": {"enable_thinking": False}},
    }
    assert ProRLSampling.model_validate({}).job_parts() == {"sampling": {}, "limits": {}, "llm": {}}


def test_unknown_sampling_key_lists_the_accepted_ones() -> None:
    with pytest.raises(InvalidRequest) as err:
        ProRLSampling.model_validate({"max_ouput_tokens": 5, "temperature": 1}).job_parts()
    message = err.value.message
    assert "'max_ouput_tokens'" in message and "max_output_tokens" in message
    assert all(key in message for key in IGNORED_KEYS)


@pytest.mark.parametrize(
    "source, agent",
    [
        (None, "swe"),
        ("swe-gym", "swe"),
        ("SWEBench", "swe"),
        ("r2e-gym", "swe"),
        ("deepscaler", "math"),
        ("deepcoder_lcb", "code"),
        ("codecontests", "code"),
        ("apps", "code"),
        ("taco", "code"),
        ("codeforces", "code"),
        ("test-sleepy", "test-sleepy"),
    ],
)
def test_data_sources_pick_agents(source, agent) -> None:
    row = {
        "prompt": [{"role": "user", "content": "Print the sum."}],
        "reward_model": {"ground_truth": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})},
        "repo": "a/b",
        "instance_id": "i-1",
    }
    if source is not None:
        row["data_source"] = source
    if source == "deepscaler":
        row["reward_model"] = {"ground_truth": "3"}
    assert map_instance(row).agent == agent


def test_deepscaler_row_becomes_a_math_instance() -> None:
    row = {
        "data_source": "deepscaler",
        "prompt": json.dumps(
            [
                {
                    "role": "user",
                    "content": "Find x. Let's think step by step and output the final answer within \\boxed{}.",
                }
            ]
        ),
        "reward_model": json.dumps({"ground_truth": "\\frac{1}{2}", "style": "rule"}),
        "extra_info": {"split": "train", "index": 9},
    }
    mapped = map_instance(row)
    assert mapped.data == {"problem": "Find x.", "answer": "\\frac{1}{2}", "extra_info": {"split": "train", "index": 9}}
    assert mapped.instance_id == "deepscaler_unknown_train_9"  # ProRL's get_instance_id


def test_code_rows_in_both_published_test_shapes() -> None:
    assert io_cases({"inputs": ["1\n", ["2", "3"]], "outputs": ["1\n", "5"]}) == [
        {"input": "1\n", "output": "1\n"},
        {"input": "2\n3", "output": "5"},
    ]
    assert io_cases(json.dumps([{"input": "x", "output": "y", "testtype": "stdin"}])) == [{"input": "x", "output": "y"}]
    for bad in ({"fn_name": "f", "inputs": [], "outputs": []}, [], "nope", {"inputs": []}):
        with pytest.raises(InvalidRequest):
            io_cases(bad)
    with pytest.raises(InvalidRequest, match="reward_model.ground_truth"):
        map_instance({"data_source": "taco", "prompt": [{"content": "p"}]})
