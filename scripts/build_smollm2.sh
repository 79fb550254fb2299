#!/usr/bin/env bash
# Make .venv-convert (torch CPU + gguf + accelerate + transformers) and build the SmolLM2 folder.
#
# Usage: scripts/build_smollm2.sh [MODEL_DIR] [--tokenizer-fixture]
#   MODEL_DIR defaults to models/smollm2-135m-instruct (git-ignored).
#   --tokenizer-fixture rewrites tests/fixtures/smollm2-tokenizer (committed; rarely needed).
# torch==2.13.0 is the CPU wheel pip finds on local disk here; elsewhere set
# PIP_EXTRA_INDEX_URL to PyTorch's CPU wheel index.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${CONVERT_VENV:-.venv-convert}"
OUT="${1:-models/smollm2-135m-instruct}"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import torch, gguf, accelerate, transformers" 2>/dev/null; then
    "${PYTHON:-python3}" -m venv "$VENV"
    "$VENV/bin/pip" install -q -U pip
    "$VENV/bin/pip" install -q "torch==2.13.0" gguf accelerate "transformers>=4.45"
fi
if [ "${2:-}" = "--tokenizer-fixture" ]; then
    "$VENV/bin/python" scripts/build_smollm2.py --tokenizer-only tests/fixtures/smollm2-tokenizer
fi
if [ ! -f "$OUT/config.json" ]; then
    "$VENV/bin/python" scripts/build_smollm2.py --out "$OUT"
fi
echo "SmolLM2 folder: $OUT"
