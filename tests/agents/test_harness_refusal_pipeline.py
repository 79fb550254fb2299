"""A harness the endpoint refuses is infrastructure, never the policy's failure (issue 37),
end to end: gateway, Celery workers, a bwrap sandbox, the loopback relay, the LLM simulator
(a fake vLLM, named as such) and the trainer's `collect()`.

The harnesses are registered by this test's operator policy and run on the system python with
the standard library only (no environment to build):

* `refused` asks for `n: 2` samples in one call, which the endpoint refuses with a 400 naming
  the field (a request per sample is what it takes; smolagents' `tool_choice: "required"`
  was refused this way before the endpoint learnt to take it); it exits non-zero. Outcome
  `infra_error` / `endpoint_refused`, reward null, failure class `infra`: left out of its
  group, never trained on as reward 0.
* `no-start` exits non-zero before any model call (a harness that cannot start):
  `infra_error` / `harness_start`.
* `honest` asks with `tool_choice: "auto"` and then exits 1 on its own: the control,
  the policy's `agent_error` / `harness_exit` (graded: no answer is reward 0).
* `honest` again, in a job whose chat template raises on this task's conversation (its own
  `raise_exception`): the job's template, not the infrastructure nor the policy. The endpoint
  answers 400 `chat_template_error` with the template's message, the harness exits non-zero:
  `infra_error` / `endpoint_refused`, not retried (no retry renders it).
* `stall` asks once, then works on its own until its registration's `timeout` (8 s): its own
  time ran out, `agent_error` / `deadline`, reward 0, counted in its group (the harness twin of
  the stall attack in test_deadline_pipeline.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fakellm.server import start_simulator
from bench.support.pipeline_harness import start_service
from raas_client.models import JobAccepted

pytestmark = pytest.mark.service  # a whole-service tier: `make test`, not `make test-fast`

SMOLLM2 = str(Path(__file__).resolve().parents[1] / "fixtures" / "smollm2-tokenizer")

# No braces: a registration's argv is a format string (its placeholders are filled in).
ASK = """
import json, os, sys, time, urllib.request, urllib.error
tool = dict(type='function', function=dict(name='bash', parameters=dict(type='object', properties=dict())))
body = dict(model='raas', messages=[dict(role='user', content=open(sys.argv[1]).read())], tools=[tool])
key, value = sys.argv[2].split('=')
body[key] = int(value) if value.isdigit() else value
request = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', method='POST',
    data=json.dumps(body).encode(), headers=dict(Authorization='Bearer ' + os.environ['OPENAI_API_KEY']))
request.add_header('Content-Type', 'application/json')
try:
    print(urllib.request.urlopen(request, timeout=60).read()[:200])
except urllib.error.HTTPError as error:
    print('refused', error.code, error.read()[:300])
time.sleep(float(sys.argv[3]) if sys.argv[3:] else 0)
sys.exit(1)
"""


def registration(*argv: str, timeout: float = 120) -> dict:
    return {"command": ["/usr/bin/python3", *argv], "tasks": ["math"], "timeout": timeout}


HARNESSES = {
    "refused": registration("-c", ASK, "{task_file}", "n=2"),
    "honest": registration("-c", ASK, "{task_file}", "tool_choice=auto"),
    "no-start": registration("-c", "import sys; sys.exit(3)"),
    "stall": registration("-c", ASK, "{task_file}", "tool_choice=auto", "600", timeout=8),
}


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    home = tmp_path_factory.mktemp("harness-refusal")
    policy = home / "policy.json"
    policy.write_text(json.dumps({"harnesses": {"registered": HARNESSES}}))
    svc = start_service(home, concurrency=2, extra={"policy_file": str(policy)})
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def llm():
    url, stop = start_simulator(SMOLLM2, {"default": ["I would rather not call a tool."]})
    yield {"servers": [{"url": url}], "tokenizer": SMOLLM2, "max_model_len": 4096}
    stop()


# SmolLM2's own template, refusing any conversation about 3 + 4 (the checker's test
# conversations render).
RAISING_TEMPLATE = (
    "{% for m in messages %}{% if m.content is string and '3 + 4' in m.content %}"
    "{{ raise_exception('this template does not do arithmetic') }}{% endif %}{% endfor %}"
    + (Path(SMOLLM2) / "chat_template.jinja").read_text()
)


def submit(service, llm, harness: str, n: int, **llm_fields: str) -> JobAccepted:
    instance = {"instance_id": f"{harness}-1", "data": {"problem": "What is 3 + 4?", "answer": "7"}}
    return service.client.submit(
        "harness",
        [instance],
        n_samples=n,
        llm={**llm, **llm_fields},
        sampling={"max_tokens": 32},
        agent_config={"harness": harness, "task": "math"},
    )


def test_a_refused_harness_is_infra_and_never_trained_on(service, llm) -> None:
    jobs = {name: submit(service, llm, name, 2 if name in ("refused", "stall") else 1) for name in HARNESSES}
    jobs["template"] = submit(service, llm, "honest", 1, chat_template_text=RAISING_TEMPLATE)
    batches = {name: service.client.collect(job.job_id, groups=1, timeout=300) for name, job in jobs.items()}

    [refused] = batches["refused"].groups
    assert refused.n_infra == 2 and refused.short and refused.samples == [], service.log_tail()
    for row in refused.rollouts:
        assert (row.outcome, row.finish_reason, row.failure_class) == ("infra_error", "endpoint_refused", "infra")
        assert row.reward is None and row.train_reward is None and row.attempt == 1  # not retried
        assert row.metrics["errors"] == {"invalid_request": 1} and row.metrics["harness_returncode"] == 1
        assert "refused 400" in row.extra["harness_log"] and "n=1" in row.extra["harness_log"]
        assert row.error == "run: the harness did not run against its endpoint (endpoint_refused: refused n x1)"

    [no_start] = batches["no-start"].groups[0].rollouts
    assert (no_start.outcome, no_start.finish_reason, no_start.failure_class) == (
        "infra_error",
        "harness_start",
        "infra",
    )
    assert no_start.metrics["calls"] == 0 and no_start.reward is None

    # the control: the model was called, answered, and the harness failed on its own
    [honest] = batches["honest"].groups[0].rollouts
    assert (honest.outcome, honest.finish_reason, honest.failure_class) == ("agent_error", "harness_exit", "policy")
    assert honest.reward == 0.0 and honest.metrics["calls"] == 1 and sum(honest.loss_mask) > 0
    assert honest.metrics["time_split"]["generation"] > 0

    # the job's template raised on the conversation: refused, named, not retried, not graded
    [template] = batches["template"].groups[0].rollouts
    assert (template.outcome, template.finish_reason, template.failure_class) == (
        "infra_error",
        "endpoint_refused",
        "infra",
    ), template.error
    assert template.reward is None and template.attempt == 1
    assert template.metrics["errors"] == {"chat_template_error": 1}
    assert template.metrics["refusals"] == {"chat_template": 1}
    assert template.error.endswith("(endpoint_refused: refused chat_template x1)"), template.error
    assert "refused 400" in template.extra["harness_log"], template.extra["harness_log"]
    assert "does not do arithmetic" in template.extra["harness_log"]

    # a harness working on its own until its timeout: the policy's time, trained on as 0
    [stall] = batches["stall"].groups
    assert stall.n_infra == 0 and not stall.short and stall.rewards == [0.0, 0.0]
    for row in stall.rollouts:
        assert (row.outcome, row.finish_reason, row.failure_class) == ("agent_error", "deadline", "policy")
        assert row.reward == 0.0 and row.metrics["calls"] == 1
        split = row.metrics["time_split"]
        assert split["harness"] >= 5.0 and split["agent_share"] >= 0.5, split
