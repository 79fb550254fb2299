"""The `search` handler (`handler`), its host-side tools (`tools`), the local BM25 retrieval
over a shipped corpus (`bm25_index`) and the short-text reward (`text_match`)."""
