"""The trainer's side of a verified push: the probe fingerprint of a checkpoint folder, as JSON.

    python scripts/trainer_probe.py MODEL_DIR probe.json [--max-new-tokens 16]

Loads the folder with transformers in fp32 and runs `raas_client.weights.probe_fingerprint` on the
default probe prompt; the file is what `raas weights push DIR --probe probe.json` sends. Runs
in any environment with torch + transformers (e.g. `.venv-convert`, which scripts/build_smollm2.sh makes): the helper
module is loaded by path, so raas and its dependencies need not be installed there.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

HELPER = Path(__file__).resolve().parent.parent / "sdk" / "raas_client" / "weights.py"


def load_helper():
    """sdk/raas_client/weights.py as a module (it imports nothing of raas)."""
    spec = importlib.util.spec_from_file_location("raas_client_weights", HELPER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(str(args.model))
    model = AutoModelForCausalLM.from_pretrained(str(args.model), dtype=torch.float32)
    probe = load_helper().probe_fingerprint(model, tokenizer, max_new_tokens=args.max_new_tokens)
    args.out.write_text(json.dumps(probe))
    print(
        json.dumps(
            {
                "prompt_tokens": len(probe["prompt_ids"]),
                "tokens": len(probe["token_ids"]),
                "seconds": round(time.monotonic() - started, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
