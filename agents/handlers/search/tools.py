"""The search agent's tools: `search(query)` over the local BM25 index and `answer(text)`.

Both run on the host, not in a sandbox: the index is read-only data shared by every rollout of
a worker process, so there is nothing to isolate and no reason to copy a corpus into each
sandbox. Passage ids the agent has seen are kept in `ctx.state["retrieved"]` so EVAL can
report whether the gold passage was ever retrieved (a retrieval-vs-reading diagnostic).
"""

from __future__ import annotations

from typing import Any

from agents.contexts import RunContext
from agents.handlers.search.bm25_index import BM25Index, SearchHit
from agents.tools import Tool, ToolOutput, finish_tool

MAX_QUERY_CHARS = 500
MAX_REMEMBERED_PASSAGES = 200


def format_hits(query: str, hits: list[SearchHit], max_chars: int) -> str:
    """Numbered results with title and (clipped) text, as the model reads them."""
    if not hits:
        return f"No results for {query!r}. Try other keywords."
    blocks = []
    for rank, hit in enumerate(hits, 1):
        text = hit.passage.text
        if len(text) > max_chars:
            text = text[:max_chars].rstrip() + " [...]"
        blocks.append(f"[{rank}] {hit.passage.title}\n{text}")
    return "\n\n".join(blocks)


def _remember(ctx: RunContext, hits: list[SearchHit]) -> None:
    """Add the hits' passage ids to ctx.state["retrieved"] (bounded, order kept)."""
    seen: list[str] = ctx.state.setdefault("retrieved", [])
    for hit in hits:
        if hit.passage.id not in seen and len(seen) < MAX_REMEMBERED_PASSAGES:
            seen.append(hit.passage.id)


def search_tool(index: BM25Index, *, top_k: int, max_passage_chars: int, corpus_description: str) -> Tool:
    """`search(query)`: the top_k passages of the local corpus for a keyword query."""

    def run(ctx: RunContext, arguments: dict[str, Any]) -> ToolOutput:
        query = arguments["query"].strip()
        if not query:
            return ToolOutput("Error: the query is empty.", error=True)
        if len(query) > MAX_QUERY_CHARS:
            return ToolOutput(f"Error: the query is longer than {MAX_QUERY_CHARS} characters.", error=True)
        hits = index.search(query, top_k)
        _remember(ctx, hits)
        return ToolOutput(format_hits(query, hits, max_passage_chars))

    return Tool(
        name="search",
        description=(
            f"Search {corpus_description} and return the {top_k} most relevant "
            f"passages. Use specific keywords, e.g. a name and what it does."
        ),
        parameters={
            "type": "object",
            "additionalProperties": False,
            "required": ["query"],
            "properties": {"query": {"type": "string", "description": "Keywords to search for"}},
        },
        run=run,
    )


def answer_tool() -> Tool:
    """`answer(text)`: submit the final short answer and end the episode."""
    return finish_tool(
        name="answer",
        description="Submit your final answer and end the task. Answer as briefly as possible.",
        answer_param="text",
        answer_description="The answer only: a name, a value or a short phrase",
    )
