"""The `raas-client` command: the trainer-side CLI without the server installed.

The commands need click (and tqdm for the progress bar), the `cli` extra; without them the
command says how to get them instead of failing with a traceback.
"""

from __future__ import annotations

import sys


def main() -> None:
    """Run `raas-client` (submit, results, status, llm)."""
    try:
        from raas_client.cli import main as cli_main
    except ImportError as exc:
        sys.exit(
            f"raas-client: the command line needs the `cli` extra ({exc}): "
            f"pip install 'raas-client[cli]' (from a clone: pip install './sdk[cli]')"
        )
    cli_main()
