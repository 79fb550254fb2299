"""Least-recently-used cache."""
from lrucache.cache import LRUCache, memoize

__all__ = ["LRUCache", "memoize"]
