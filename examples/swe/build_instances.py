"""Rebuild examples/swe/instances.jsonl from the example folders (deterministic commit ids).

The folders ship with the package (`agents/examples/swe/`, which the ones here link to).

Each folder holds `repo/` (the sources at the base commit), `problem.md`, `test.patch` (adds the
FAIL_TO_PASS tests), `fix.patch` (the reference fix) and `tests.json` (FAIL_TO_PASS and
PASS_TO_PASS test ids). Run: `.venv/bin/python examples/swe/build_instances.py`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from agents.handlers.swe.repo import example_instances  # noqa: E402


def main() -> int:
    """Write one JSON line per example instance next to this script."""
    lines = [json.dumps(inst, sort_keys=True) for inst in example_instances(HERE)]
    (HERE / "instances.jsonl").write_text("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} instances to {HERE / 'instances.jsonl'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
