"""The ProRL routes driven the way ProRL's clients drive them, through the real pipeline.

Request shapes and the fields read are those of NeMo RL's ProRL environment (its full
`sampling_params`, `trajectory_id` per sample, `score`, and `Results2BatchedDataDict`, which
rebuilds prompt and response by concatenating the messages' `token_ids`), NeMo Gym's
`prorl_agent` adapter (`job_id` = instance id; assistant `token_ids`/`input_ids`/`logprobs`,
flattened `tool_calls` with JSON-string arguments, `tools` in ChatCompletion format) and
ProRL's own token test scripts (every message has `token_ids`, the last one is the assistant's).
The converter checks below are written here, not copied. The LLM is the simulator (a fake vLLM,
named as such) registered through `/add_llm_server`; sandboxes are real bwrap.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from fakellm.server import start_simulator
from bench.support.pipeline_harness import start_service

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = str(REPO / "tests" / "fixtures" / "smollm2-tokenizer")


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def deepscaler(problem: str, answer: str, index: int) -> dict[str, Any]:
    """A DeepScaleR row as ProRL's datasets carry it."""
    return {
        "data_source": "deepscaler",
        "prompt": [
            {
                "role": "user",
                "content": problem + " Let's think step by step and output the final answer within \\boxed{}.",
            }
        ],
        "reward_model": {"ground_truth": answer, "style": "rule"},
        "extra_info": {"split": "train", "index": index, "name": "deepscaler"},
        "instance_id": f"deepscaler-{index}",
    }


SOLVED = deepscaler("What is 17 + 25?", "42", 1)
RAMBLING = deepscaler("Name every prime below one hundred.", "25", 2)
LOOPING = deepscaler("How many edges has a cube?", "12", 3)
SLOW = deepscaler("What is the 1000th prime?", "7919", 4)
LONG_TEXT = " ".join(["two three five seven eleven thirteen"] * 20)
CODE_HINT = "Write Python code to solve the problem. Present the code in \n```python\nYour code\n```\nat the end."
SUM = {
    "data_source": "codecontests",
    "instance_id": "cc-sum",
    "prompt": [{"role": "user", "content": "Read two integers and print their sum.\n\n" + CODE_HINT}],
    "reward_model": {
        "ground_truth": json.dumps({"inputs": ["1 2\n", "5 7\n"], "outputs": ["3\n", "12\n"]}),
        "style": "rule",
    },
}
MAX = {
    "data_source": "deepcoder",
    "instance_id": "dc-max",
    "prompt": [{"role": "user", "content": "Print the largest of three integers."}],
    "reward_model": {
        "ground_truth": json.dumps(
            [
                {"input": "1 9 3\n", "output": "9\n", "testtype": "stdin"},
                {"input": "-5 -2 -9\n", "output": "-2\n", "testtype": "stdin"},
            ]
        )
    },
}

SWE_FIX = [
    call(
        "str_replace_editor",
        command="str_replace",
        path="intervals/core.py",
        old_str="merged[-1][1] = end\n",
        new_str="merged[-1][1] = max(merged[-1][1], end)\n",
    ),
    call("submit"),
]


def first_line(text: str) -> str:
    return text.strip().splitlines()[0]


def script(swe_rows: dict[str, dict]) -> dict[str, Any]:
    return {
        "by_instance": {
            "What is 17 + 25?": [call("python", code="print(17 + 25)"), call("finish", answer="42")],
            "Name every prime": [LONG_TEXT],
            "How many edges": [call("python", code="print(12)")],
            "1000th prime": [{"text": "thinking", "latency": 60}],
            "two integers and print their sum": [
                call(
                    "str_replace_editor",
                    command="create",
                    path="solution.py",
                    file_text="a, b = map(int, input().split())\nprint(a + b)\n",
                ),
                call("submit"),
            ],
            "largest of three": [  # wrong on negatives: max of the absolute values
                call(
                    "str_replace_editor",
                    command="create",
                    path="solution.py",
                    file_text="xs = list(map(int, input().split()))\nprint(max(xs, key=abs))\n",
                ),
                call("submit"),
            ],
            first_line(swe_rows["raas-examples__intervals-1"]["problem_statement"]): SWE_FIX,
        }
    }


# What NeMo RL's ProRL environment sends with every /process call.
NEMO_RL_SAMPLING = {
    "model": "hosted_vllm/HuggingFaceTB/SmolLM2-135M-Instruct",
    "api_key": "dummy_key",
    "modify_params": False,
    "log_completions": False,
    "native_tool_calling": True,
    "temperature": 1.0,
    "top_p": 1.0,
    "max_iterations": 4,
    "max_input_tokens": 2048,
    "max_output_tokens": 256,
    "token_level_generation": True,
    "custom_tokenizer": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "max_model_len": 3072,
    "ensure_thinking_end_properly": False,
    "strict_loop_detector": True,
    "is_reasoning_task": False,
}
NO_ENV = {"python_env": None}  # the agent's config, sent with the request: system python


@pytest.fixture(scope="module")
def mirror(tmp_path_factory, built_env) -> dict[str, Any]:
    """The example repos as a SWE-Gym mirror + per-instance images (examples/swe/make_mirror)."""
    import sys

    sys.path.insert(0, str(REPO / "examples" / "swe"))
    from make_mirror import build_mirror

    out = tmp_path_factory.mktemp("swegym")
    rows = build_mirror(out, Path(built_env("pytest", ["pytest"])))
    return {"root": out, "rows": {r["instance_id"]: r for r in rows}}


@pytest.fixture(scope="module")
def service(tmp_path_factory, mirror):
    home = tmp_path_factory.mktemp("prorl")
    svc = start_service(
        home,
        concurrency={"init": 2, "run": 3, "eval": 2},
        extra={"repo_mirror_root": mirror["root"] / "mirror", "image_root": mirror["root"] / "images"},
    )
    url, stop = start_simulator(SMOLLM2, script(mirror["rows"]))
    client = httpx.Client(base_url=svc.url, timeout=300)
    assert client.post("/start").status_code == 200
    # ProRL's docs register the OpenAI base URL (with /v1); NeMo RL registers each once
    assert client.post("/add_llm_server", json={"address": f"{url}/v1"}).status_code == 200
    yield {"svc": svc, "http": client, "sim": url}
    client.post("/stop")
    client.close()
    stop()
    svc.stop()


def process(service: dict, instance: dict, sampling: dict, **extra: Any) -> dict[str, Any]:
    response = service["http"].post("/process", json={"instance": instance, "sampling_params": sampling, **extra})
    assert response.status_code == 200, (response.text, service["svc"].log_tail())
    return response.json()


def rebuild_like_nemo_rl(result: dict[str, Any]) -> tuple[list[int], list[int]]:
    """Prompt = messages before the first assistant one, response = the rest, each the
    concatenation of the messages' token_ids (what Results2BatchedDataDict computes)."""
    messages = result["messages"]
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    prompt = [t for m in messages[:first] for t in m["token_ids"]]
    response = [t for m in messages[first:] for t in m["token_ids"]]
    return prompt, response


def check_token_shape(result: dict[str, Any]) -> None:
    """What ProRL's scripts and NeMo RL's converter need of every result."""
    messages = result["messages"]
    assert messages[-1]["role"] == "assistant"  # ProRL's result checker
    assert all(isinstance(m["token_ids"], list) and isinstance(m["content"], str) for m in messages)
    prompt, response = rebuild_like_nemo_rl(result)
    assert prompt == result["prompt_ids"] and response == result["response_ids"]
    assert len(result["loss_mask"]) == len(response) == len(result["response_logprobs"])
    at = 0
    for m in messages[next(i for i, m in enumerate(messages) if m["role"] == "assistant") :]:
        mask = result["loss_mask"][at : at + len(m["token_ids"])]
        if m["role"] == "assistant":  # generated: trained on, logprobs are the server's
            assert set(mask) <= {1} and len(m["logprobs"]) == len(m["token_ids"])
            assert m["input_ids"] == (prompt + response)[: len(prompt) + at]
            assert all(isinstance(c["arguments"], str) for c in m["tool_calls"])
        else:
            assert set(mask) <= {0} and "logprobs" not in m
        at += len(m["token_ids"])


def test_nemo_rl_math_batch_matches_prorl_result_shape(service) -> None:
    """Two samples of one DeepScaleR row, as NeMo RL sends them; plus what its converter and
    ProRL's checker read."""
    results = []
    for trajectory_id in (0, 1):
        row = copy.deepcopy(SOLVED)
        row["trajectory_id"] = trajectory_id
        results.append(process(service, row, NEMO_RL_SAMPLING, agent_config=NO_ENV))
    for trajectory_id, result in enumerate(results):
        assert result["instance_id"] == "deepscaler-1"
        assert result["trajectory_id"] == trajectory_id
        assert result["success"] is True and result["filter"] is False
        assert result["critical_error"] is None and result["error"] is None
        assert result["finish"] is True and result["finish_reason"] == "finish"
        assert result["resolved"] is True and result["score"] == 1.0 and result["reward"] == 1.0
        assert result["end_properly"] is True
        assert [m["role"] for m in result["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
        check_token_shape(result)
        first_call = result["messages"][2]["tool_calls"][0]
        assert first_call["name"] == "python"
        assert json.loads(first_call["arguments"]) == {"code": "print(17 + 25)"}
        assert "42" in result["messages"][3]["content"]
        names = {t["function"]["name"] for t in result["tools"]}
        assert {"python", "finish"} <= names and all(t["type"] == "function" for t in result["tools"])
        timing = result["timing"]
        assert timing["counted_elapsed"] == pytest.approx(
            timing["init_time"] + timing["run_time"] + timing["eval_time"]
        )
        assert timing["others_time"] >= 0 and timing["timeout_triggered"] is False


def test_limits_as_prorl_clients_send_them(service) -> None:
    """max_output_tokens caps every turn (Gym sends only temperature, top_p and it);
    max_iterations caps the turns."""
    gym = process(
        service,
        RAMBLING,
        {"temperature": 0.6, "top_p": 0.9, "max_output_tokens": 16},
        job_id=RAMBLING["instance_id"],
        agent_config=NO_ENV,
    )
    assistant = [m for m in gym["messages"] if m["role"] == "assistant"]
    assert {len(m["token_ids"]) for m in assistant} == {16}  # not the ~140-token reply
    assert gym["finish"] is False
    check_token_shape(gym)
    looping = process(service, LOOPING, {**NEMO_RL_SAMPLING, "max_iterations": 2}, agent_config=NO_ENV)
    assert [m["role"] for m in looping["messages"]].count("assistant") == 2
    assert looping["finish"] is False and looping["finish_reason"] == "max_turns"
    # the last observation (mask 0) is dropped with its tokens: the list ends on the model
    check_token_shape(looping)
    assert looping["success"] is True and looping["resolved"] is False


def test_cancel_aborts_the_generation_in_flight(service) -> None:
    """/cancel of a job_id stops its rollout mid-generation: the request to the inference
    server is closed (the server counts an abort) instead of waiting out the 60 s turn."""
    answer: dict[str, Any] = {}

    def run() -> None:
        answer["result"] = process(service, SLOW, {"max_output_tokens": 32}, job_id="batch-7", agent_config=NO_ENV)

    thread = threading.Thread(target=run)
    started = time.monotonic()
    thread.start()
    http, sim = service["http"], service["sim"]
    before = httpx.get(f"{sim}/sim/stats").json()
    while time.monotonic() - started < 90:  # until the simulator has the request in hand
        stats = httpx.get(f"{sim}/sim/stats").json()
        if stats.get("started", 0) > before.get("started", 0):
            break
        time.sleep(0.1)
    cancel_at = time.monotonic()
    cancelled = http.post("/cancel", json={"job_id": "batch-7"})
    assert cancelled.json()["status"] == "Cancel requested for job batch-7"
    thread.join(timeout=40)
    assert not thread.is_alive() and time.monotonic() - cancel_at < 15  # not the 60 s turn
    result = answer["result"]
    assert result["outcome"] == "cancelled" and result["critical_error"] == "timeout"
    assert result["filter"] is True and result["success"] is False
    stats = httpx.get(f"{sim}/sim/stats").json()
    assert stats.get("aborted") == 1 + before.get("aborted", 0)


def test_swe_gym_instances_as_they_come(service, mirror) -> None:
    """SWE-Gym rows (slug repo, JSON-string test lists) run from the operator's mirror and
    image root; a repo or image that is not there is an INIT infra error, filtered."""
    sampling = {
        **NEMO_RL_SAMPLING,
        "max_iterations": 4,
        "max_model_len": 8192,
        "max_input_tokens": 8192,
        "max_output_tokens": 512,
    }
    fixed = process(service, {**mirror["rows"]["raas-examples__intervals-1"], "trajectory_id": 0}, sampling)
    assert fixed["success"] and fixed["resolved"] and fixed["reward"] == 1.0, fixed["error"]
    assert "max(merged[-1][1], end)" in fixed["git_patch"] and fixed["finish"] is True
    check_token_shape(fixed)
    tarball = process(
        service, {**mirror["rows"]["raas-examples__csvlite-1"], "trajectory_id": 0}, {**sampling, "max_iterations": 1}
    )
    assert tarball["success"] and tarball["reward"] == 0.0  # checked out from the .tar.gz

    no_repo = process(service, {**mirror["rows"]["raas-examples__intervals-1"], "repo": "getmoto/moto"}, sampling)
    assert no_repo["outcome"] == "infra_error" and no_repo["critical_error"] == "init"
    assert no_repo["filter"] is True and no_repo["messages"] == []
    assert "getmoto__moto.git" in no_repo["error"] and str(mirror["root"]) in no_repo["error"]
    no_image = process(
        service, {**mirror["rows"]["raas-examples__intervals-1"], "instance_id": "getmoto__moto-7365"}, sampling
    )
    assert no_image["outcome"] == "infra_error" and no_image["critical_error"] == "init"
    assert "getmoto__moto-7365" in no_image["error"] and "images" in no_image["error"]
    assert no_image["filter"] is True


def test_code_datasets_graded_on_their_input_output_cases(service) -> None:
    """CodeContests ({inputs, outputs}) and DeepCoder ([{input, output}]) rows run as the code
    agent with their test cases as hidden input/output tests."""
    right = process(service, SUM, {**NEMO_RL_SAMPLING, "max_iterations": 3})
    assert right["success"] and right["resolved"] and right["reward"] == 1.0, right["error"]
    check_token_shape(right)
    wrong = process(service, MAX, {**NEMO_RL_SAMPLING, "max_iterations": 3})
    assert wrong["success"] and not wrong["resolved"] and wrong["reward"] == 0.5
