"""Find the chunks that answer a question: BM25 over FTS5, cosine similarity over
embedding vectors when the collection has them, fused by reciprocal rank fusion
(RRF: score = sum over lists of 1 / (k + rank)), which needs no score calibration
between the two very different scales."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.documents.index import ChunkRecord, DocumentIndex

RRF_K = 60  # the constant of Cormack et al.; damps the weight of the very top ranks

# words that carry no topic: dropping them keeps BM25's OR-query on the content words
_STOPWORDS = frozenset("""
a an and are as at be been being but by can could did do does doing for from had has have having he her
hers him his how i if in into is it its itself me my no nor not of on or our ours out over own she should
so some such than that the their them then there these they this those through to too under until up very
was we were what when where which while who whom why will with would you your yours about above after again
against all am any because before below between both down during each few further here just more most
off once only other same tell give show explain describe say said use used using according document file
""".split())

_WORD = re.compile(r"\w+", re.UNICODE)


def fts_query(question: str) -> str:
    """An FTS5 MATCH expression: the question's content words, OR-ed, each quoted
    (so no word is read as FTS5 syntax). BM25 ranks chunks with more (and rarer)
    of them higher."""
    words: list[str] = []
    for w in _WORD.findall(question.lower()):
        for part in w.split("_"):  # the unicode61 tokenizer splits snake_case too
            if part and (len(part) > 1 or part.isdigit()) and part not in _STOPWORDS and part not in words:
                words.append(part)
    return " OR ".join(f'"{w}"' for w in words)


def rrf(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> list[tuple[int, float]]:
    """Reciprocal rank fusion of ranked id lists, best first (ties keep first-seen order)."""
    score: dict[int, float] = {}
    for ranking in rankings:
        for rank, cid in enumerate(ranking, start=1):
            score[cid] = score.get(cid, 0.0) + 1.0 / (k + rank)
    return sorted(score.items(), key=lambda kv: -kv[1])


@dataclass
class Hit:
    chunk: ChunkRecord
    score: float  # RRF score (hybrid) or -bm25 (FTS only): higher is better
    fts_rank: int | None = None  # 1-based rank in the BM25 list
    vec_rank: int | None = None  # 1-based rank in the vector list
    bm25: float | None = None
    cosine: float | None = None

    @property
    def file(self) -> str:
        return self.chunk.path

    @property
    def page(self) -> int | None:
        return self.chunk.page


@dataclass
class RetrievalResult:
    hits: list[Hit]
    mode: str  # "fts" | "hybrid"
    query: str  # the FTS5 expression used
    t_fts_s: float = 0.0
    t_vec_s: float = 0.0
    t_total_s: float = 0.0
    n_fts: int = 0
    n_vec: int = 0
    notes: list[str] = field(default_factory=list)

    def stats(self) -> dict:
        return {"mode": self.mode, "fts_query": self.query, "n_fts": self.n_fts, "n_vec": self.n_vec,
                "t_fts_s": round(self.t_fts_s, 6), "t_vec_s": round(self.t_vec_s, 6),
                "t_total_s": round(self.t_total_s, 6), "notes": self.notes}


class Retriever:
    """Searches one or more collections of a DocumentIndex."""

    def __init__(self, index: DocumentIndex, embedder: object | None = None, candidates: int = 50):
        # embedder: an EmbeddingModel; used only for collections indexed with the same model
        self.index = index
        self.embedder = embedder
        self.candidates = candidates
        self._vec_cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def search(self, question: str, collections: Sequence[str], k: int = 5, mode: str = "auto") -> RetrievalResult:
        """The top-k chunks for a question. mode: "fts", "hybrid", or "auto"
        (hybrid when an embedding model matches the collections' vectors)."""
        if mode not in ("auto", "fts", "hybrid"):
            raise ValueError(f"unknown retrieval mode {mode!r} (auto, fts, hybrid)")
        t0 = time.perf_counter()
        cids = [self.index.collection_id(c) for c in collections]
        query = fts_query(question)
        res = RetrievalResult([], "fts", query)
        fts = self.index.search_fts(query, cids, self.candidates)
        res.t_fts_s = time.perf_counter() - t0
        res.n_fts = len(fts)
        vec: list[tuple[int, float]] = []
        if mode != "fts":
            vec = self._vector_search(question, cids, res)
            if mode == "hybrid" and not vec and not res.notes:
                res.notes.append("no vectors for these collections: FTS5 only")
        if vec:
            res.mode = "hybrid"
            fused = rrf([[c for c, _ in fts], [c for c, _ in vec]])[:k]
            fts_pos = {c: (i + 1, s) for i, (c, s) in enumerate(fts)}
            vec_pos = {c: (i + 1, s) for i, (c, s) in enumerate(vec)}
            chunks = self.index.chunks_by_id([c for c, _ in fused])
            for cid, s in fused:
                fr, vr = fts_pos.get(cid), vec_pos.get(cid)
                res.hits.append(Hit(chunks[cid], s, fr[0] if fr else None, vr[0] if vr else None,
                                    fr[1] if fr else None, vr[1] if vr else None))
        else:
            top = fts[:k]
            chunks = self.index.chunks_by_id([c for c, _ in top])
            res.hits = [Hit(chunks[c], -s, i + 1, None, s, None) for i, (c, s) in enumerate(top)]
        res.t_total_s = time.perf_counter() - t0
        return res

    def _vector_search(self, question: str, cids: list[int], res: RetrievalResult) -> list[tuple[int, float]]:
        if self.embedder is None:
            return []
        want = str(Path(self.embedder.path).resolve())
        usable = [c for c in cids if self._collection_model(c) == want]
        if len(usable) < len(cids):
            res.notes.append("some collections were not indexed with the loaded embedding model: "
                             "their chunks are found by FTS5 only")
        if not usable:
            return []
        t0 = time.perf_counter()
        ids, mat = self._vectors(usable)
        if len(ids) == 0:
            return []
        q = self.embedder.embed([question])[0]
        sims = mat @ q
        top = np.argsort(-sims)[: self.candidates]
        res.t_vec_s = time.perf_counter() - t0
        res.n_vec = len(top)
        return [(int(ids[i]), float(sims[i])) for i in top]

    def _collection_model(self, cid: int) -> str | None:
        row = self.index.db.execute("SELECT embedding_model FROM collections WHERE id=?", (cid,)).fetchone()
        return row[0] if row else None

    def _vectors(self, cids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        # cached per (collections, chunk count, max chunk id): any re-index changes the key
        n, mx = self.index.db.execute(
            f"SELECT COUNT(*), MAX(c.id) FROM chunks c JOIN files f ON f.id=c.file_id "
            f"WHERE f.collection_id IN ({','.join('?' * len(cids))})", tuple(cids)).fetchone()
        key = (tuple(sorted(cids)), n, mx, self.embedder.id)
        if key not in self._vec_cache:
            self._vec_cache = {key: self.index.vectors(cids, self.embedder.id)}
        return self._vec_cache[key]
