"""A BM25 index over a JSONL corpus of passages, built in memory and cached per process.

Scoring is bm25s's (sparse-matrix BM25); this module only decides what is indexed and how
results are shaped. A passage is indexed as its title plus its text, so `json.dumps` is found
by `json` and by `dumps`. English stop words are dropped; there is no stemming, so results do
not depend on an optional C extension being installed. The index of the shipped corpus
(~3,000 passages) builds in well under a second, so each worker builds it on first use instead
of shipping a binary index that would have to match the library version.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import bm25s

from core.errors import ConfigError

logger = logging.getLogger(__name__)

_cache: dict[tuple[str, int], BM25Index] = {}
_cache_lock = threading.Lock()


@dataclass(frozen=True)
class Passage:
    """One retrievable unit of the corpus."""

    id: str
    title: str
    text: str


@dataclass(frozen=True)
class SearchHit:
    """A passage with its BM25 score (higher is better)."""

    passage: Passage
    score: float


def _tokenize(texts: list[str]) -> list[list[str]]:
    """The one tokenizer used for both passages and queries (they must agree)."""
    return bm25s.tokenize(texts, stopwords="en", return_ids=False, show_progress=False)


class BM25Index:
    """Ranks passages for a free-text query."""

    def __init__(self, passages: list[Passage], *, k1: float = 1.5, b: float = 0.75) -> None:
        if not passages:
            raise ConfigError("a search corpus needs at least one passage")
        self.passages = passages
        self._by_id = {p.id: p for p in passages}
        self._retriever = bm25s.BM25(k1=k1, b=b)
        self._retriever.index(_tokenize([f"{p.title}\n{p.text}" for p in passages]), show_progress=False)

    @classmethod
    def from_jsonl(cls, path: str | Path) -> BM25Index:
        """Load passages (`id`, `title`, `text` per line) and index them."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"search corpus not found: {path}", field="corpus_path")
        passages = []
        with path.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    passages.append(Passage(str(row["id"]), str(row.get("title", "")), str(row["text"])))
                except (ValueError, KeyError) as exc:
                    raise ConfigError(f"{path}:{n}: bad passage ({exc})", field="corpus_path") from exc
        return cls(passages)

    def __len__(self) -> int:
        return len(self.passages)

    def get(self, passage_id: str) -> Passage | None:
        """The passage with this id, if any."""
        return self._by_id.get(passage_id)

    def search(self, query: str, k: int = 5) -> list[SearchHit]:
        """The top `k` passages sharing at least one query term, best first."""
        tokens = _tokenize([query])
        if not tokens or not tokens[0] or k <= 0:
            return []
        k = min(k, len(self.passages))
        docs, scores = self._retriever.retrieve(tokens, k=k, show_progress=False, n_threads=0)
        return [SearchHit(self.passages[int(i)], float(s)) for i, s in zip(docs[0], scores[0]) if s > 0]


def load_index(path: str | Path) -> BM25Index:
    """The index of the corpus at `path`, built once per process (rebuilt if the file changes)."""
    resolved = Path(path).resolve()
    try:
        key = (str(resolved), resolved.stat().st_mtime_ns)
    except FileNotFoundError:
        raise ConfigError(f"search corpus not found: {resolved}", field="corpus_path") from None
    with _cache_lock:
        index = _cache.get(key)
        if index is None:
            index = BM25Index.from_jsonl(resolved)
            _cache[key] = index
            logger.info("built BM25 index of %s (%d passages)", resolved, len(index))
        return index
