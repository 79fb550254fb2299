"""Tokenizer folders in the style of Qwen3 and Llama 3.1, built offline from SmolLM2's.

No model family's files can be downloaded here, so each style is SmolLM2's real tokenizer with
that family's special tokens added, its end-of-turn ids in a `generation_config.json` (as the
real models ship them), and a chat template written for these tests:

* qwen3: ChatML turns, `<|im_end|>` and `<|endoftext|>` both end a turn (Qwen's generation
  config), and `<tool_call>`/`</tool_call>`/`<think>`/`</think>` are *special* tokens, so a
  decoder that skips special tokens loses the tool-call tags.
* llama31: `<|start_header_id|>`/`<|end_header_id|>` headers, `<|eot_id|>` closes a message,
  `<|eom_id|>` ends a message that awaits a tool result (ipython), `<|end_of_text|>`; the
  generation config lists all three, like Llama 3.1's.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.llm.conftest import QWEN_TEMPLATE, SMOLLM2

LLAMA_TEMPLATE = str(Path(SMOLLM2).parent / "llama31-style-template" / "chat_template.jinja")
QWEN_SPECIAL = ["<tool_call>", "</tool_call>", "<think>", "</think>"]
LLAMA_SPECIAL = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
]


def _build(
    folder: Path, special: list[str], template_path: str, eos: str | None, bos: str | None, generation_eos: list[str]
) -> str:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(SMOLLM2, local_files_only=True)
    tok.add_special_tokens({"additional_special_tokens": special})
    if eos:
        tok.eos_token = eos
    if bos:
        tok.bos_token = bos
    tok.chat_template = Path(template_path).read_text()
    tok.save_pretrained(str(folder))
    ids = [tok.convert_tokens_to_ids(t) for t in generation_eos]
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": ids}))
    return str(folder)


def build_qwen3_style(folder: Path) -> str:
    """A Qwen3-style tokenizer folder (eos ids: <|im_end|>, <|endoftext|>)."""
    return _build(folder, QWEN_SPECIAL, QWEN_TEMPLATE, None, None, ["<|im_end|>", "<|endoftext|>"])


def build_llama31_style(folder: Path) -> str:
    """A Llama-3.1-style tokenizer folder (eos ids: <|eot_id|>, <|eom_id|>, <|end_of_text|>)."""
    return _build(
        folder,
        LLAMA_SPECIAL,
        LLAMA_TEMPLATE,
        "<|eot_id|>",
        "<|begin_of_text|>",
        ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
    )
