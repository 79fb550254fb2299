"""Write an untied fp32 copy of a checkpoint: what an in-place weight reload needs.

vLLM's `reload_weights` loads `embed_tokens` but leaves a tied `lm_head` at the old weights
(docs/weights.md, trap 1); a checkpoint with an explicit `lm_head.weight` and
`tie_word_embeddings: false` reloads whole. fp32 because bf16 rounds away RL-sized updates
(trap 3). Needs torch + transformers (e.g. `.venv-convert`, made by scripts/build_smollm2.sh); tokenizer files are
copied as they are.

    python scripts/untie_checkpoint.py SRC_DIR DST_DIR [--perturb SCALE --seed N] [--keep-tied]

`--perturb` adds seeded noise to every weight: a stand-in for a training step, so a test can
push a checkpoint that really differs from the served one. `--keep-tied` writes a tied fp32
copy instead (no `lm_head.weight`, `tie_word_embeddings: true`): the defect, for tests.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "generation_config.json",
)


def untie(src: Path, dst: Path, perturb: float = 0.0, seed: int = 0, keep_tied: bool = False) -> Path:
    """Load `src`, untie lm_head from the embeddings, save fp32 safetensors to `dst`."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    embed = next(v for k, v in state.items() if k.endswith("embed_tokens.weight"))
    state["lm_head.weight"] = embed.clone()  # an explicit head: reload_weights loads it
    if keep_tied:
        del state["lm_head.weight"]  # the head is the embedding matrix
    if perturb:
        gen = torch.Generator().manual_seed(seed)
        for key, value in state.items():
            state[key] = value + perturb * torch.randn(value.shape, generator=gen)
    dst.mkdir(parents=True, exist_ok=True)
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config.update({"tie_word_embeddings": keep_tied, "dtype": "float32", "torch_dtype": "float32"})
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    return dst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", type=Path)
    parser.add_argument("dst", type=Path)
    parser.add_argument("--perturb", type=float, default=0.0, help="noise scale (0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep-tied", action="store_true", help="a tied copy (the defect)")
    args = parser.parse_args()
    print(untie(args.src, args.dst, args.perturb, args.seed, args.keep_tied))


if __name__ == "__main__":
    main()
