"""A raas service (embedded: SQLite + embedded Redis, real Celery workers) with the LLM
simulator registered, for the framework adapters' tests."""

from __future__ import annotations

import pytest

from fakellm.server import BUNDLED_TOKENIZER, start_simulator
from bench.support.pipeline_harness import start_service

# turn 0 calls the `observe` tool of the test-chat handler, turn 1 answers
TOOL_REPLY = 'Reading it. <tool_call>{"name": "observe", "arguments": {}}</tool_call>'


@pytest.fixture(scope="module")
def raas_service(tmp_path_factory):
    sim, stop_sim = start_simulator(str(BUNDLED_TOKENIZER), {"default": [TOOL_REPLY, "Done."]})
    svc = start_service(tmp_path_factory.mktemp("raas"), concurrency=2)
    try:
        svc.client.add_llm_server(sim)
        yield svc
    finally:
        svc.stop()
        stop_sim()
