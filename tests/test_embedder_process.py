"""The documents' embedding model in its own process (issue 16, point 1): the same vectors as in-process,
and a real llama.cpp abort or a kill while indexing ends that process only, with a message that says so."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from documents_corpus import corpus_words
from documents_embedding_model import write_bow_embedding_model

from app.documents.embedding import EmbeddingModel
from app.documents.index import FAILED, INDEXED, DocumentIndex
from app.documents.indexer import Indexer
from app.errors import ModelLoadError
from app.host.abort_hook import ABORT_ENV
from app.host.embedder import EmbedderCrashed, EmbedderProcess

TEXTS = ["The spare key for the cabin is hidden under the flower pot.",
         "Quarterly report of the equipment group.", "def return result session payload"]


@pytest.fixture(scope="module")
def bow_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_bow_embedding_model(tmp_path_factory.mktemp("emb") / "bow-embedder.gguf", corpus_words())


def test_the_process_gives_the_in_process_vectors(bow_model: Path) -> None:
    local = EmbeddingModel(bow_model, n_threads=1)
    remote = EmbedderProcess(bow_model, n_threads=1)
    try:
        assert remote.pid is not None and remote.pid != os.getpid()
        assert (remote.id, remote.dim) == (local.id, local.dim)
        got = remote.embed(TEXTS)
        assert got.shape == (3, local.dim) and got.dtype == np.float32
        np.testing.assert_allclose(got, local.embed(TEXTS), atol=1e-6)
    finally:
        remote.close()
        local.close()
    assert remote.pid is None


def test_a_native_abort_while_indexing_fails_the_files_and_the_next_run_works(
        bow_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    for i, text in enumerate(TEXTS):
        (folder / f"note{i}.txt").write_text(text * 5)
    monkeypatch.setenv(ABORT_ENV, "embed")  # inherited by the embedding model's process
    emb = EmbedderProcess(bow_model, n_threads=1)
    index = DocumentIndex(tmp_path / "docs.sqlite3")
    cid = index.ensure_collection("notes")
    index.add_roots(cid, [folder])
    prog = Indexer(index, emb).run("notes")
    assert prog.state == "done" and prog.n_failed == 3 and prog.n_indexed == 0
    for f in index.files(cid):
        assert f.state == FAILED
        assert "the embedding model's process ended (killed by SIGABRT) while embedding" in f.error
        assert f"GGML_ASSERT({ABORT_ENV}=embed) failed" in f.error and str(bow_model) in f.error
        assert len(f.error) < 1024
    monkeypatch.delenv(ABORT_ENV)
    prog = Indexer(index, emb).run("notes")  # a fresh process per crash; this one lives
    assert prog.n_indexed == 3 and {f.state for f in index.files(cid)} == {INDEXED}
    assert index.collection_info("notes").n_vectors == index.collection_info("notes").n_chunks > 0
    emb.close()
    index.close()


def test_a_killed_process_is_said_and_replaced(bow_model: Path) -> None:
    emb = EmbedderProcess(bow_model, n_threads=1)
    first = emb.pid
    emb.kill()  # what an out-of-memory kill does between two requests
    with pytest.raises(EmbedderCrashed, match=r"ended \(killed by SIGKILL\) while embedding"):
        emb.embed(TEXTS[:1])
    assert emb.embed(TEXTS[:1]).shape == (1, emb.dim) and emb.pid not in (None, first)
    emb.close()


def test_a_file_that_is_no_model_is_a_load_error_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "not-a-model.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(200))
    with pytest.raises(ModelLoadError, match="not-a-model.gguf"):
        EmbedderProcess(bad, n_threads=1)
