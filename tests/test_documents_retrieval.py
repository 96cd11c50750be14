"""Indexing the real-file corpus and retrieving the chunk that answers each of its
questions: FTS5 (BM25) alone, several collections, and the hybrid path (RRF of
BM25 and vectors from a tiny GGUF embedding model run by llama.cpp)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from documents_corpus import BROKEN, build_corpus, corpus_words

from app.documents.index import INDEXED, SKIPPED, DocumentIndex
from app.documents.indexer import Indexer
from app.documents.retrieve import Retriever, fts_query, rrf


def _norm(s: str) -> str:
    return " ".join(s.split())


def _answers(q, chunk) -> bool:  # noqa: ANN001
    return (_norm(q.answer) in _norm(chunk.text) and chunk.name == q.file
            and (q.page is None or chunk.page == q.page))


def recall_at(index: DocumentIndex, retriever: Retriever, questions: list, k: int, mode: str,
              collections: list[str]) -> tuple[float, list[str]]:
    found, misses = 0, []
    for q in questions:
        res = retriever.search(q.question, collections, k=k, mode=mode)
        if any(_answers(q, h.chunk) for h in res.hits):
            found += 1
        else:
            misses.append(q.question)
    return found / len(questions), misses


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("corpus")
    questions = build_corpus(root)
    # its own folder: root.parent is the session basetemp, shared with other modules
    index = DocumentIndex(tmp_path_factory.mktemp("retrieval-index") / "docs.sqlite3")
    cid = index.ensure_collection("corpus")
    index.add_roots(cid, [root])
    progress = Indexer(index).run("corpus")
    yield root, questions, index, progress
    index.close()


def test_corpus_has_30_questions_each_answered_by_one_known_chunk(indexed) -> None:  # noqa: ANN001
    root, questions, index, _ = indexed
    assert len(questions) >= 30
    all_chunks = [c for f in index.files(index.collection_id("corpus")) for c in index.file_chunks(f.id)]
    for q in questions:
        holders = [c for c in all_chunks if _norm(q.answer) in _norm(c.text)]
        # one chunk, or two when the chunk overlap repeats the sentence; always in the right file and page
        assert 1 <= len(holders) <= 2, (q.question, [(c.name, c.page) for c in holders])
        assert all(c.name == q.file and (q.page is None or c.page == q.page) for c in holders), q.question


def test_recall_at_5_with_fts5_alone_is_at_least_90_percent(indexed) -> None:  # noqa: ANN001
    _, questions, index, _ = indexed
    retriever = Retriever(index)
    r5, misses = recall_at(index, retriever, questions, 5, "fts", ["corpus"])
    r1, _ = recall_at(index, retriever, questions, 1, "fts", ["corpus"])
    print(json.dumps({"questions": len(questions), "recall@5": round(r5, 4), "recall@1": round(r1, 4),
                      "misses@5": misses}))
    assert r5 >= 0.9, misses


def test_every_file_is_accounted_for_and_broken_ones_are_skipped_with_reasons(indexed) -> None:  # noqa: ANN001
    root, _, index, progress = indexed
    files = {Path(f.path).name: f for f in index.files(index.collection_id("corpus"))}
    on_disk = {p.name for p in root.rglob("*") if p.is_file()}
    assert set(files) == on_disk
    for name, why in BROKEN.items():
        assert files[name].state == SKIPPED and why in files[name].error, (name, files[name].error)
        assert files[name].n_chunks == 0
    good = [f for n, f in files.items() if n not in BROKEN]
    assert good and all(f.state == INDEXED and f.n_chunks > 0 for f in good)
    assert progress.state == "done" and progress.n_skipped == len(BROKEN) and progress.n_failed == 0
    assert sorted(Path(p).name for p, _ in progress.errors) == sorted(BROKEN)
    assert files["handbook.pdf"].n_pages == 8 and progress.pages_indexed == 8 + 5 + 6


def test_fts_query_quotes_words_so_fts_syntax_in_questions_is_harmless(indexed) -> None:  # noqa: ANN001
    _, _, index, _ = indexed
    assert fts_query("What's the NEAR(port AND 7443)* -x \"quoted\"?") == '"near" OR "port" OR "7443" OR "quoted"'
    assert fts_query("the of and?") == ""
    res = Retriever(index).search('NEAR("sync" AND daemon)* OR port:', ["corpus"], k=3)
    assert res.hits and res.hits[0].chunk.name == "guide.md"
    assert Retriever(index).search("the of and?", ["corpus"]).hits == []


def test_rrf_rewards_items_ranked_well_in_both_lists() -> None:
    fused = rrf([[1, 2, 3, 4], [4, 3, 9]])
    order = [cid for cid, _ in fused]
    assert order[:2] == [4, 3]  # in both lists; 4 (ranks 4 and 1) edges out 3 (ranks 3 and 2)
    assert fused[0][1] == pytest.approx(1 / 64 + 1 / 61)
    assert fused[1][1] == pytest.approx(1 / 63 + 1 / 62)
    assert order.index(1) < order.index(9)  # rank 1 in one list beats rank 3 in one list


def test_search_spans_the_chosen_collections_only(indexed, tmp_path: Path) -> None:  # noqa: ANN001
    root, questions, _, _ = indexed
    index = DocumentIndex(tmp_path / "multi.sqlite3")
    pdfs = index.ensure_collection("pdfs")
    index.add_roots(pdfs, [root / "pdf"])
    notes = index.ensure_collection("notes")
    index.add_roots(notes, [root / "notes"])
    for name in ("pdfs", "notes"):
        Indexer(index).run(name)
    r = Retriever(index)
    q = next(q for q in questions if q.file == "notes.txt")
    only_pdfs = r.search(q.question, ["pdfs"], k=5).hits
    assert not any(_answers(q, h.chunk) for h in only_pdfs)
    assert all(h.chunk.collection == "pdfs" for h in only_pdfs)
    both = r.search(q.question, ["pdfs", "notes"], k=5).hits
    assert any(_answers(q, h.chunk) and h.chunk.collection == "notes" for h in both)
    index.close()


@pytest.fixture(scope="module")
def bow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from documents_embedding_model import write_bow_embedding_model

    return write_bow_embedding_model(tmp_path_factory.mktemp("emb") / "bow-embedder.gguf", corpus_words())


def test_hybrid_retrieval_with_a_gguf_embedding_model(indexed, bow_model: Path, tmp_path: Path) -> None:  # noqa: ANN001
    from app.documents.embedding import EmbeddingModel

    root, questions, _, _ = indexed
    corpus = tmp_path / "corpus"
    shutil.copytree(root, corpus)
    emb = EmbeddingModel(bow_model, n_threads=1)
    index = DocumentIndex(tmp_path / "hybrid.sqlite3")
    cid = index.ensure_collection("c")
    index.add_roots(cid, [corpus])
    Indexer(index, emb).run("c")
    info = index.collection_info("c")
    assert info.n_chunks > 50 and info.n_vectors == info.n_chunks
    assert info.embedding_model == str(bow_model.resolve())

    # a chunk's own text is its nearest vector
    chunk = index.file_chunks(index.files(cid)[0].id)[0]
    r = Retriever(index, emb)
    res = r.search(chunk.text, ["c"], k=5, mode="hybrid")
    assert res.mode == "hybrid" and res.n_vec > 0
    assert any(h.chunk.id == chunk.id and h.vec_rank == 1 for h in res.hits)

    r5_h, miss_h = recall_at(index, r, questions, 5, "hybrid", ["c"])
    r5_f, _ = recall_at(index, r, questions, 5, "fts", ["c"])
    print(json.dumps({"embedder": "tiny bag-of-words GGUF", "hybrid_recall@5": round(r5_h, 4),
                      "fts_recall@5": round(r5_f, 4), "hybrid_misses": miss_h}))
    # a toy embedder (word overlap, no IDF) dilutes BM25 a little; it must not wreck it
    assert r5_h >= 0.8, miss_h
    # the fused list really uses both rankings: it differs from BM25's somewhere
    fused = {q.question: r.search(q.question, ["c"], k=5).hits for q in questions[:10]}
    assert any(h.vec_rank is not None and h.cosine is not None for hits in fused.values() for h in hits)
    bm25 = {q.question: r.search(q.question, ["c"], k=5, mode="fts").hits for q in questions[:10]}
    assert any([h.chunk.id for h in fused[q]] != [h.chunk.id for h in bm25[q]] for q in fused)

    # a collection indexed without vectors falls back to FTS5 with a note
    plain = index.ensure_collection("plain")
    index.add_roots(plain, [corpus / "notes"])
    Indexer(index).run("plain")
    res = r.search("Where is the spare key for the cabin hidden?", ["plain"], k=3)
    assert res.mode == "fts" and res.notes and res.hits
    emb.close()
    index.close()
