"""Tokenizers named the way vLLM users name models: a hub id found in the local Hugging Face
cache, offline.

`vllm serve Qwen/Qwen2.5-0.5B-Instruct` reports the id `Qwen/Qwen2.5-0.5B-Instruct` in
GET /v1/models, and its files sit in the Hugging Face cache of the machine that downloaded them
(`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`), laid out as
`models--Qwen--Qwen2.5-0.5B-Instruct/snapshots/<revision>/` with `refs/main` naming the
revision. Nothing is downloaded: a rollout's tokens must come from the files the policy's server
loaded, and a worker may have no network. When trainer, servers and raas share the cache (a
shared filesystem or the same image), the id resolves to the same files.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hub_cache_dir() -> Path:
    """Where the Hugging Face hub cache is, by the variables huggingface_hub reads."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface" / "hub"


def is_hub_id(name: str | None) -> bool:
    """True for `org/name` (a Hugging Face model id), not for a path."""
    return bool(name) and not name.startswith(("/", ".", "~")) and bool(HUB_ID.match(name))


def hub_repo_dir(model_id: str) -> Path:
    """Where the cache keeps `model_id` (whether or not it is there)."""
    return hub_cache_dir() / f"models--{model_id.replace('/', '--')}"


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / f).is_file() for f in TOKENIZER_FILES)


def cached_tokenizer_folder(model_id: str, revision: str = "main") -> str | None:
    """The cached snapshot folder of `model_id` holding its tokenizer, or None.

    The snapshot `refs/<revision>` points at wins; else (a cache copied without refs) the most
    recently written snapshot that holds a tokenizer.
    """
    if not is_hub_id(model_id):
        return None
    repo = hub_repo_dir(model_id)
    snapshots = repo / "snapshots"
    ref = repo / "refs" / revision
    if ref.is_file():
        folder = snapshots / ref.read_text().strip()
        if _has_tokenizer(folder):
            return str(folder)
    if not snapshots.is_dir():
        return None
    found = [p for p in snapshots.iterdir() if p.is_dir() and _has_tokenizer(p)]
    return str(max(found, key=lambda p: p.stat().st_mtime)) if found else None
