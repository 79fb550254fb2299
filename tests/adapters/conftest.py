"""A raas service (embedded: SQLite + embedded Redis, real Celery workers) with the LLM
simulator registered, for the framework adapters' tests.

Its operator policy registers `rewrite`, a harness on the system python with the standard
library only (no environment to build) that rewrites its history: it asks the model once
(the simulator's turn 0: `TOOL_REPLY`), then asks again with its task restated and a summary
exchange (the first message changed; turn 1: "Done."), then writes the math answer. The
endpoint splits such a rollout into two training samples (`history_rewritten`), one call
each; the math EVAL grades the answer file (reward 1)."""

from __future__ import annotations

import json

import pytest

from fakellm.server import BUNDLED_TOKENIZER, start_simulator
from bench.support.pipeline_harness import start_service

# turn 0 calls the `observe` tool of the test-chat handler, turn 1 answers
TOOL_REPLY = 'Reading it. <tool_call>{"name": "observe", "arguments": {}}</tool_call>'

# No braces: a registration's argv is a format string (its placeholders are filled in).
REWRITE = """
import json, os, sys, urllib.request
task = open(sys.argv[1]).read()
def ask(*texts):
    roles = ['user', 'assistant'] * len(texts)
    messages = [dict(role=role, content=text) for role, text in zip(roles, texts)]
    body = dict(model='raas', messages=messages, max_tokens=48)
    request = urllib.request.Request(os.environ['OPENAI_BASE_URL'] + '/chat/completions', method='POST',
        data=json.dumps(body).encode(), headers=dict(Authorization='Bearer ' + os.environ['OPENAI_API_KEY']))
    request.add_header('Content-Type', 'application/json')
    return json.loads(urllib.request.urlopen(request, timeout=60).read())
ask(task)
ask('Notes so far: nothing yet. ' + task, 'I read it.', 'Go on.')
open(os.path.join(sys.argv[2], 'answer.txt'), 'w').write('7')
"""
HARNESSES = {
    "rewrite": {"command": ["/usr/bin/python3", "-c", REWRITE, "{task_file}", "{workspace}"], "tasks": ["math"]}
}
SPLIT_INSTANCE = {"instance_id": "split-1", "data": {"problem": "What is 3 + 4?", "answer": "7"}}
SPLIT_CONFIG = {"harness": "rewrite", "task": "math"}


@pytest.fixture(scope="module")
def raas_service(tmp_path_factory):
    home = tmp_path_factory.mktemp("raas")
    policy = home / "policy.json"
    policy.write_text(json.dumps({"harnesses": {"registered": HARNESSES}}))
    sim, stop_sim = start_simulator(str(BUNDLED_TOKENIZER), {"default": [TOOL_REPLY, "Done."]})
    svc = start_service(home, concurrency=2, extra={"policy_file": str(policy)})
    try:
        svc.client.add_llm_server(sim)
        yield svc
    finally:
        svc.stop()
        stop_sim()
