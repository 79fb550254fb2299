"""Local retrieval for agents that search a shipped corpus (no network on rollout machines)."""
from __future__ import annotations

from agents.retrieval.bm25_index import BM25Index, Passage, SearchHit, load_index

__all__ = ["BM25Index", "Passage", "SearchHit", "load_index"]
