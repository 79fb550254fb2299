"""Write an untied float32 copy of a Hugging Face causal LM folder (SmolLM2) for RL training.

Why both changes (measured on this machine, /work/shared/notes/weights-on-cpu.md):
- untied: vLLM's in-place `reload_weights` updates `embed_tokens` but leaves a tied `lm_head`
  at the old weights, so the served policy silently differs from the trained one. An explicit
  `lm_head.weight` (a copy of the embeddings, +115 MB in fp32 for 135M) reloads correctly.
- float32: Adam steps of ~1e-5 are below bf16 resolution, and a bf16 trainer drifts 0.2-0.75
  nats/token from the server after a few steps; fp32 on both sides agrees to < 5e-5.

Run with the trainer's interpreter (torch + transformers), never the raas venv:

    .venv-train/bin/python scripts/untie_model.py SRC_DIR OUT_DIR
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json", "generation_config.json")


def untie(src: Path, out: Path) -> None:
    """Load `src` in float32, give it its own lm_head, save to `out` with the tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    embeddings = model.get_input_embeddings().weight
    model.config.tie_word_embeddings = False
    head = torch.nn.Linear(embeddings.shape[1], embeddings.shape[0], bias=False)
    head.weight = torch.nn.Parameter(embeddings.detach().clone())
    model.set_output_embeddings(head)
    model.config.dtype = "float32"
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy(src / name, out / name)


def check(out: Path) -> None:
    """Fail unless the saved folder has a separate lm_head tensor in float32."""
    import json

    from safetensors import safe_open

    config = json.loads((out / "config.json").read_text())
    if config.get("tie_word_embeddings"):
        raise SystemExit(f"{out}: still tied")
    for shard in out.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as handle:
            if "lm_head.weight" in handle.keys():
                dtype = handle.get_tensor("lm_head.weight").dtype
                if str(dtype) != "torch.float32":
                    raise SystemExit(f"{out}: lm_head is {dtype}")
                return
    raise SystemExit(f"{out}: no lm_head.weight saved")


def main() -> None:
    """Parse arguments; build unless OUT_DIR already holds a checked untied copy."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    if not (args.out / "config.json").exists():
        untie(args.src, args.out)
    check(args.out)
    print(f"untied float32 model: {args.out}")


if __name__ == "__main__":
    main()
