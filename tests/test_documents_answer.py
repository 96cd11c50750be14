"""Answering from documents with the bundled Gemma 3 270M target and a DFlash
drafter: the prompt fits the context budget in real tokens, the answer's sources
name the right file and page, and `flashdesk docs ask --json` reports answer,
sources, retrieval and generation stats."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from documents_corpus import build_corpus

from app.bench.prompt_sets import docqa_prompts
from app.chat.format import format_for_model, prompt_format_of
from app.documents.answer import NO_SOURCES, answer_question, build_prompt, conversation_renderer
from app.documents.index import DocumentIndex
from app.documents.indexer import Indexer
from app.documents.retrieve import Retriever
from app.engine.params import GenerationParams

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.gemma


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("corpus")
    build_corpus(root)
    db = tmp_path_factory.mktemp("answer-index") / "docs.sqlite3"  # not the shared basetemp
    with DocumentIndex(db) as index:
        index.add_roots(index.ensure_collection("corpus"), [root])
        Indexer(index).run("corpus")
    return root, db


def test_prompt_fits_the_token_budget_and_labels_each_source(docs, gemma_engine) -> None:  # noqa: ANN001
    _, db = docs
    with DocumentIndex(db) as index:
        hits = Retriever(index).search("Who designed the Velmora bridge?", ["corpus"], k=8).hits
    assert hits[0].chunk.name == "handbook.pdf" and hits[0].chunk.page == 2

    def count(text: str) -> int:
        return len(gemma_engine.tokenize(text, add_special=False))

    def truncate(text: str, n: int) -> str:
        return gemma_engine.detokenize(gemma_engine.tokenize(text, add_special=False)[:n])

    render = conversation_renderer(format_for_model(None))
    n_sources = []
    for budget in (4000, 830, 530, 250):  # the plain format itself (its example turns) takes ~130 tokens
        prompt, sources = build_prompt("Who designed the Velmora bridge?", hits, count, budget, render, truncate)
        assert len(gemma_engine.tokenize(prompt)) <= budget + 1  # +1: the BOS the engine adds
        assert prompt.rstrip().endswith("User: Who designed the Velmora bridge?\nAssistant:")
        for s in sources:
            assert s.label() in prompt
        n_sources.append(len(sources))
    assert n_sources[0] == len(hits)
    assert n_sources[0] > n_sources[1] > n_sources[2] >= 1
    assert n_sources[3] == 1  # a budget below one chunk keeps the best chunk's beginning
    assert "[1] handbook.pdf, page 2" in prompt


def test_answer_sources_include_the_right_file_and_page(docs, gemma_engine) -> None:  # noqa: ANN001
    _, db = docs
    assert gemma_engine.has_drafter
    with DocumentIndex(db) as index:
        ans = answer_question(gemma_engine, Retriever(index), "Who designed the Velmora bridge?", ["corpus"],
                              params=GenerationParams(max_tokens=12))
    print(json.dumps({"answer": ans.text, "sources": [s.label() for s in ans.sources],
                      "tau": ans.generation["tau"], "tokens_per_s": ans.generation["tokens_per_s"]}))
    assert any(s.name == "handbook.pdf" and s.page == 2 and "Tomas Brandt" in " ".join(s.text.split())
               for s in ans.sources)
    assert ans.sources[0].file.endswith("pdf/handbook.pdf")
    assert ans.text
    assert (ans.finish_reason == "length") == (ans.generation["n_generated"] == 12)
    # DFlash stayed on: the drafter proposed tokens during the answer, and they changed nothing
    # (batch-invariant kernels: the same answer as plain decoding of the same prompt)
    assert ans.generation["drafted"] > 0
    with DocumentIndex(db) as index:
        plain = answer_question(gemma_engine, Retriever(index), "Who designed the Velmora bridge?", ["corpus"],
                                params=GenerationParams(max_tokens=12, speculative=False))
    assert plain.generation["drafted"] == 0 and plain.text == ans.text
    assert ans.prompt_tokens == plain.prompt_tokens and ans.prompt_tokens + 12 <= gemma_engine.n_ctx
    assert ans.retrieval["n_sources_in_prompt"] == len(ans.sources) >= 1


def test_a_question_nothing_matches_gets_no_sources_and_no_generation(docs, gemma_engine) -> None:  # noqa: ANN001
    _, db = docs
    with DocumentIndex(db) as index:
        ans = answer_question(gemma_engine, Retriever(index), "zyxxy qwertyuiop?", ["corpus"])
    assert ans.text == NO_SOURCES and ans.sources == [] and ans.generation == {}


# slow (make test-slow): the command calibrates the pair first (~50 s on two cores, the random drafter
# is new every session); the answer and its sources are tested in-process above
@pytest.mark.slow
def test_docs_ask_cli_prints_answer_sources_and_stats_as_json(docs, gemma_target: Path,
                                                              gemma_random_drafter: Path) -> None:
    _, db = docs
    cmd = [sys.executable, "-m", "app.cli", "docs", "ask", "Which port does the sync daemon listen on?",
           "--collection", "corpus", "--db", str(db), "--target", str(gemma_target),
           "--drafter", str(gemma_random_drafter), "--ctx", "2048", "--max-tokens", "8", "--json"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["question"] == "Which port does the sync daemon listen on?"
    assert isinstance(res["answer"], str) and res["draft_mode"] == "hybrid"
    top = res["sources"][0]
    assert top["name"] == "guide.md" and top["page"] is None and top["score"] > 0
    assert {"file", "page", "line_start", "line_end", "score", "collection"} <= set(top)
    assert res["retrieval"]["mode"] == "fts" and res["retrieval"]["n_sources_in_prompt"] >= 1
    assert res["generation"]["n_generated"] >= 1 and "tau" in res["generation"]


def test_the_bench_document_set_is_built_as_docs_ask_builds_its_prompts(gemma_engine) -> None:  # noqa: ANN001
    """The bench's document Q&A prompts: the same prompt builder as `docs ask`, 1-3k tokens of
    retrieved context each, in the target's format with its stop strings."""
    rows = docqa_prompts(gemma_engine)
    assert len(rows) >= 10
    for r in rows:
        n = len(gemma_engine.tokenize(r["prompt"]))
        assert 1000 <= n <= 3000, (r["id"], n)
        assert r["prompt"].count("[1] flashdesk-") == 1 and r["prompt"].endswith("Assistant:")
        assert r["stop"] == prompt_format_of(gemma_engine.target).stop
