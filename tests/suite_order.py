"""The order in which `make test`'s pytest processes take the test files: longest first.

`--dist loadfile` hands out whole files in collection order (with `--no-loadscope-reorder`;
xdist's default order, most tests first, puts the slow files of two or three whole-service
tests last, so one process ran a 2-minute file alone at the end). Files that took longest
start first; the many short ones fill the gaps at the end. The weights are each file's summed
test seconds in a full run (`pytest --junitxml`, h-suite, 2026-12-02, a loaded machine: only
their order matters); a file not listed weighs nothing and keeps its place.
"""

from __future__ import annotations

import pytest

FILE_SECONDS = {
    "tests/test_bulk_submit.py": 358,
    "tests/faults/test_campaign.py": 353,
    "tests/test_pipeline_reliability.py": 345,
    "tests/test_nodes.py": 263,
    "tests/test_embedded_up.py": 224,
    "tests/test_weights_pipeline.py": 223,
    "tests/agents/test_reward_attacks.py": 168,
    "tests/faults/test_trainer_waits.py": 157,
    "tests/test_production.py": 153,
    "tests/agents/test_harness_pipeline.py": 150,  # one shared service since (was 145 s alone)
    "tests/test_quickstart.py": 150,
    "tests/test_trust.py": 147,
    "tests/sandbox/test_environments.py": 127,
    "tests/test_node_command.py": 126,
    "tests/test_reevaluate_outbox.py": 116,
    "tests/test_push.py": 113,
    "tests/test_groups.py": 112,
    "tests/faults/test_handoff_faults.py": 106,
    "tests/agents/test_code_examples.py": 105,
    "tests/agents/test_resume_pipeline.py": 96,
    "tests/test_warm_pool.py": 92,
    "tests/test_pipeline.py": 88,
    "tests/sdk/test_batches.py": 81,
    "tests/sdk/test_install_alone.py": 76,
    "tests/agents/test_swe_pipeline.py": 72,
    "tests/test_slurm_support.py": 71,
    "tests/agents/test_edges_pipeline.py": 65,
    "tests/llm/test_hub_tokenizers.py": 65,
    "tests/agents/test_math_pipeline.py": 64,
    "tests/llm/test_simulator.py": 58,
    "tests/agents/test_plain_answer_pipeline.py": 58,
    "tests/test_idempotency.py": 52,
    "tests/test_trust_tenant.py": 51,
    # this round's whole-service files, from their own runs (2026-12-06, load ~8): aider's
    # includes building its environment on a clean clone (~100 s)
    "tests/agents/test_harness_aider.py": 150,
    "tests/agents/test_harness_openhands.py": 200,  # its Python 3.12 environment: ~200 s cold
    "tests/agents/test_checkpoint_pipeline.py": 110,
    "tests/agents/test_harness_replay_pipeline.py": 80,
    "tests/test_job_pause.py": 60,
}


def longest_files_first(items: list[pytest.Item]) -> None:
    """Reorder `items` in place: heavier files first, each file's tests in their own order
    (a stable sort by the file's weight keeps the rest of the collection as it was)."""
    items.sort(key=lambda item: -FILE_SECONDS.get(item.nodeid.split("::", 1)[0], 0))
