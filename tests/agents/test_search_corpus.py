"""The shipped search task set is solvable: every answer is in the corpus and retrievable.

For each question, its gold passage exists, contains one of the accepted answers (after the
reward's own normalization), and a sensible query (the `query` field, what a searcher would
type) ranks that passage among the results the agent's `search` tool returns by default (the
handler's `top_k`), from the same BM25 index.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from agents.registry import get_handler
from agents.handlers.search.bm25_index import BM25Index, load_index
from agents.handlers.search.text_match import grade_text_answer, normalize_answer

SEARCH_DIR = Path(__file__).resolve().parents[2] / "examples" / "search"
CORPUS = SEARCH_DIR / "corpus.jsonl"
QUESTIONS = [json.loads(line) for line in (SEARCH_DIR / "questions.jsonl").read_text().splitlines() if line.strip()]
IDS = [q["instance_id"] for q in QUESTIONS]
TOP_K = get_handler("search").Config().top_k  # what one search shows the agent


@pytest.fixture(scope="module")
def index() -> BM25Index:
    return load_index(CORPUS)


def test_question_set_shape() -> None:
    assert len(QUESTIONS) >= 30
    assert len(set(IDS)) == len(IDS)
    for q in QUESTIONS:
        assert set(q) == {"instance_id", "question", "answers", "passage_id", "query"}
        assert q["answers"] and all(normalize_answer(a) for a in q["answers"])


def test_corpus_is_small_and_well_formed(index: BM25Index) -> None:
    assert CORPUS.stat().st_size < 5 * 1024 * 1024
    assert len(index) > 1000
    assert len({p.id for p in index.passages}) == len(index)


@pytest.mark.parametrize("question", QUESTIONS, ids=IDS)
def test_answer_is_in_its_passage_and_retrievable(question: dict, index: BM25Index) -> None:
    passage = index.get(question["passage_id"])
    assert passage is not None, f"gold passage {question['passage_id']} is not in the corpus"
    haystack = f" {normalize_answer(passage.title + ' ' + passage.text)} "
    assert any(f" {normalize_answer(a)} " in haystack for a in question["answers"])
    top = [hit.passage.id for hit in index.search(question["query"], TOP_K)]
    assert question["passage_id"] in top, f"query {question['query']!r} returned {top}"
    best = grade_text_answer(question["answers"][0], question["answers"], metric="exact_match")
    assert best.reward == 1.0


def test_search_edge_cases(index: BM25Index) -> None:
    assert index.search("the of and", 5) == []  # stop words only
    assert index.search("zzqqxx", 5) == []
    assert index.search("json", 0) == []
    hits = index.search("json", 3)
    assert len(hits) == 3 and hits[0].score >= hits[-1].score


def test_load_index_is_cached_per_file(index: BM25Index) -> None:
    assert load_index(CORPUS) is index


def test_bad_corpus_is_a_config_error(tmp_path: Path) -> None:
    from core.errors import ConfigError

    with pytest.raises(ConfigError, match="not found"):
        load_index(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a"}\n')
    with pytest.raises(ConfigError, match="bad passage"):
        BM25Index.from_jsonl(bad)


@pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="needs the system interpreter")
def test_corpus_builder_runs(tmp_path: Path) -> None:
    """The committed generator reproduces passages in the committed format (two small modules)."""
    out = tmp_path / "corpus.jsonl"
    subprocess.run(
        ["/usr/bin/python3", str(SEARCH_DIR / "build_corpus.py"), "--out", str(out), "--modules", "heapq", "bisect"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["id"] for r in rows} >= {"heapq", "heapq.heappushpop", "bisect.bisect_left"}
    assert all(set(r) == {"id", "title", "kind", "text"} for r in rows)
    assert json.loads(out.with_suffix(".meta.json").read_text())["passages"] == len(rows)
