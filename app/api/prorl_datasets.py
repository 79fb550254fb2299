"""ProRL's dataset names and instance shapes, mapped onto raas agents and their instances.

ProRL picks its handler from the instance's `data_source` and reads each dataset in the shape
it is published in: DeepScaleR math problems (`prompt` chat messages, `reward_model.ground_truth`),
code sets (DeepCoder, CodeContests, APPS, TACO, Codeforces: the problem in `prompt`, test cases as
input/output pairs in `reward_model.ground_truth`) and SWE-bench-style sets (SWE-bench, SWE-Gym,
R2E-Gym: the instance as the dataset row). A `data_source` that is none of these names a raas
agent directly (its instance is passed as is).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from core.errors import InvalidRequest

SWE_SOURCES = {
    "swebench",
    "swe-bench",
    "swe_bench",
    "swe-gym",
    "swe_gym",
    "swegym",
    "r2e-gym",
    "r2e_gym",
    "r2egym",
    "nemo_gym_swe",
}
MATH_SOURCES = {"deepscaler"}
CODE_SOURCES = {"deepcoder", "codecontests", "code_contests", "apps", "taco", "codeforces"}
SEARCH_SOURCES = {"stem"}
DEFAULT_SOURCE = "swebench"  # ProRL's default when an instance has no data_source

# Instructions the datasets append to the problem; ProRL strips them (its agents have tools).
_BOXED_HINT = " Let's think step by step and output the final answer within \\boxed{}."
_CODE_HINT = "Write Python code to solve the problem. Present the code in \n```python\nYour code\n```\nat the end."


@dataclass
class MappedInstance:
    """A ProRL instance as raas sees it: which agent, which id, which handler fields."""

    agent: str
    instance_id: str
    data: dict[str, Any]
    data_source: str


def map_instance(instance: dict[str, Any]) -> MappedInstance:
    """The raas agent and instance data for a ProRL `/process` instance."""
    source = str(instance.get("data_source") or DEFAULT_SOURCE)
    key = source.lower()
    instance_id = prorl_instance_id(instance, source)
    data = {k: v for k, v in instance.items() if k != "data_source"}
    if key in SWE_SOURCES:
        return MappedInstance("swe", instance_id, data, source)
    if key in MATH_SOURCES:
        return MappedInstance("math", instance_id, math_instance(instance), source)
    if key in CODE_SOURCES or key.startswith("deepcoder"):  # ProRL: any "deepcoder*" name
        return MappedInstance("code", instance_id, code_instance(instance), source)
    if key in SEARCH_SOURCES:
        return MappedInstance("search", instance_id, data, source)
    return MappedInstance(source, instance_id, data, source)


def prorl_instance_id(instance: dict[str, Any], source: str) -> str:
    """`instance_id`, else ProRL's `{data_source}_{name}_{split}_{index}` from `extra_info`."""
    if instance.get("instance_id") is not None:
        return str(instance["instance_id"])
    info = instance.get("extra_info")
    if isinstance(info, dict) and info:
        parts = [info.get(k, "unknown") for k in ("name", "split", "index")]
        return "_".join(str(p) for p in (source, *parts))
    return f"{source}_{uuid.uuid4().hex[:12]}"


def _json_field(instance: dict[str, Any], name: str) -> Any:
    """A field that datasets store either as JSON text or as the object itself."""
    value = instance.get(name)
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            raise InvalidRequest(f"instance.{name} is a string but not JSON", field=f"instance.{name}") from None
    return value


def problem_text(instance: dict[str, Any]) -> str:
    """The problem from `prompt` (chat messages, or their JSON): the first message's content,
    as ProRL reads it; a plain-text `problem`/`question` is accepted too."""
    for name in ("problem", "question"):
        if isinstance(instance.get(name), str) and instance[name].strip():
            return instance[name]
    prompt = _json_field(instance, "prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        user = [m for m in prompt if m.get("role", "user") == "user"] or prompt
        content = user[0].get("content")
        if isinstance(content, str) and content.strip():
            return content
    raise InvalidRequest(
        "instance.prompt must be a list of chat messages with the problem as the user message's content",
        field="instance.prompt",
    )


def ground_truth(instance: dict[str, Any]) -> Any:
    """`reward_model.ground_truth` (reward_model may be JSON text; ground_truth too for code)."""
    reward_model = _json_field(instance, "reward_model")
    if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
        raise InvalidRequest(
            "instance.reward_model.ground_truth is missing", field="instance.reward_model.ground_truth"
        )
    return reward_model["ground_truth"]


def math_instance(instance: dict[str, Any]) -> dict[str, Any]:
    """DeepScaleR row → the math agent's `problem` / `answer`."""
    answer = ground_truth(instance)
    if isinstance(answer, list) and len(answer) == 1:
        answer = answer[0]
    return {
        "problem": problem_text(instance).replace(_BOXED_HINT, "").strip(),
        "answer": answer if isinstance(answer, (int, float)) else str(answer),
        "extra_info": instance.get("extra_info"),
    }


def io_cases(truth: Any) -> list[dict[str, str]]:
    """Input/output test cases from the published shapes: {"inputs": [...], "outputs": [...]}
    (APPS, TACO, CodeContests, Codeforces) or [{"input", "output"}, ...] (DeepCoder)."""
    if isinstance(truth, str):
        try:
            truth = json.loads(truth)
        except ValueError:
            raise InvalidRequest(
                "reward_model.ground_truth is a string but not JSON", field="instance.reward_model.ground_truth"
            ) from None
    if isinstance(truth, dict) and truth.get("fn_name"):
        raise InvalidRequest(
            "call-based tests (fn_name) are not supported; only stdin/stdout input/output cases",
            field="instance.reward_model.ground_truth",
        )
    if isinstance(truth, dict) and "inputs" in truth and "outputs" in truth:
        pairs = zip(truth["inputs"], truth["outputs"], strict=False)
        cases = [{"input": _text(i), "output": _text(o)} for i, o in pairs]
    elif isinstance(truth, list) and all(isinstance(t, dict) and "input" in t for t in truth):
        cases = [{"input": _text(t["input"]), "output": _text(t.get("output", ""))} for t in truth]
    else:
        raise InvalidRequest(
            "reward_model.ground_truth must hold input/output test cases "
            "({inputs, outputs} or a list of {input, output})",
            field="instance.reward_model.ground_truth",
        )
    if not cases:
        raise InvalidRequest("reward_model.ground_truth has no test case", field="instance.reward_model.ground_truth")
    return cases


def _text(value: Any) -> str:
    return "\n".join(map(str, value)) if isinstance(value, list) else str(value)


def code_instance(instance: dict[str, Any]) -> dict[str, Any]:
    """A code-set row → the code agent's instance: statement plus stdin/stdout test cases."""
    statement = problem_text(instance).replace(_CODE_HINT, "").strip()
    cases = io_cases(ground_truth(instance))
    return {
        "problem_statement": statement,
        "solution_file": "solution.py",
        "hidden_tests": [_stdio_test(case, k) for k, case in enumerate(cases, start=1)],
        "extra_info": instance.get("extra_info"),
    }


def _stdio_test(case: dict[str, str], k: int) -> dict[str, str]:
    """An input/output case as a hidden test of the code agent (stdin in, stdout compared on
    the host)."""
    return {"name": f"case_{k}", "input": case["input"], "output": case["output"]}
