"""The document index: one SQLite database with collections, their root folders,
files, chunks, an FTS5 (BM25) table over the chunks and optional embedding vectors.

Crash safety comes from SQLite: each file's chunks are replaced in one
transaction together with the file's new content hash, so a killed indexer
leaves every file either fully at its old state or fully at its new one, and
the next run redoes only what did not commit. WAL mode lets the UI read
while the indexer writes.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.documents.chunking import Chunk
from app.errors import FlashDeskError

SCHEMA_VERSION = 1

# file states
PENDING = "pending"  # found, not (yet) indexed at its current content
INDEXED = "indexed"
SKIPPED = "skipped"  # unreadable (broken, password-protected, no text): `error` says why
FAILED = "failed"  # an unexpected error: `error` has it; retried on the next run

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS collections(
    id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE, embedding_model TEXT, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS roots(
    collection_id INTEGER NOT NULL REFERENCES collections(id) ON DELETE CASCADE, path TEXT NOT NULL,
    PRIMARY KEY(collection_id, path));
CREATE TABLE IF NOT EXISTS runs(
    id INTEGER PRIMARY KEY, collection_id INTEGER NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
    started_at REAL NOT NULL, finished_at REAL, state TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files(
    id INTEGER PRIMARY KEY, collection_id INTEGER NOT NULL REFERENCES collections(id) ON DELETE CASCADE,
    path TEXT NOT NULL, name TEXT NOT NULL, kind TEXT, size INTEGER, mtime_ns INTEGER, sha256 TEXT,
    state TEXT NOT NULL, error TEXT, n_pages INTEGER NOT NULL DEFAULT 0, n_chunks INTEGER NOT NULL DEFAULT 0,
    indexed_run INTEGER, indexed_at REAL, UNIQUE(collection_id, path));
CREATE TABLE IF NOT EXISTS chunks(
    id INTEGER PRIMARY KEY, file_id INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
    ord INTEGER NOT NULL, text TEXT NOT NULL, heading TEXT NOT NULL DEFAULT '', page INTEGER,
    line_start INTEGER NOT NULL, line_end INTEGER NOT NULL, UNIQUE(file_id, ord));
CREATE TABLE IF NOT EXISTS vectors(
    chunk_id INTEGER PRIMARY KEY REFERENCES chunks(id) ON DELETE CASCADE, model TEXT NOT NULL,
    dim INTEGER NOT NULL, data BLOB NOT NULL);
-- its own copy of the text (not external content): rowid = chunks.id, kept in step below
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5(
    text, heading, name, tokenize = 'porter unicode61 remove_diacritics 2');
CREATE TRIGGER IF NOT EXISTS chunks_ai AFTER INSERT ON chunks BEGIN
    INSERT INTO chunks_fts(rowid, text, heading, name)
    VALUES (new.id, new.text, new.heading, (SELECT name FROM files WHERE id = new.file_id));
END;
CREATE TRIGGER IF NOT EXISTS chunks_ad AFTER DELETE ON chunks BEGIN
    DELETE FROM chunks_fts WHERE rowid = old.id;
END;
"""


class DocumentIndexError(FlashDeskError):
    """The document database cannot be opened or used; names the file."""


def default_db_path() -> Path:
    """$FLASHDESK_DATA_DIR/documents.sqlite3, else the XDG data folder."""
    base = os.environ.get("FLASHDESK_DATA_DIR")
    if base:
        return Path(base) / "documents.sqlite3"
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "flashdesk" / "documents.sqlite3"


@dataclass
class CollectionInfo:
    id: int
    name: str
    embedding_model: str | None
    roots: list[str]
    n_files: int = 0
    n_indexed: int = 0
    n_pending: int = 0
    n_skipped: int = 0
    n_failed: int = 0
    n_chunks: int = 0
    n_vectors: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class FileRecord:
    id: int
    collection_id: int
    path: str
    name: str
    kind: str | None
    size: int | None
    mtime_ns: int | None
    sha256: str | None
    state: str
    error: str | None
    n_pages: int
    n_chunks: int
    indexed_run: int | None
    indexed_at: float | None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class ChunkRecord:
    id: int
    file_id: int
    path: str
    name: str
    ord: int
    text: str
    heading: str
    page: int | None
    line_start: int
    line_end: int
    collection: str


_FILE_COLS = ("id, collection_id, path, name, kind, size, mtime_ns, sha256, state, error, n_pages, n_chunks, "
              "indexed_run, indexed_at")


class DocumentIndex:
    """One connection to the document database (use one per thread)."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # autocommit mode: transactions are explicit (BEGIN IMMEDIATE ... COMMIT)
            self.db = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None,
                                      check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("PRAGMA foreign_keys=ON")
            self.db.executescript(_SCHEMA)
            self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        except sqlite3.DatabaseError as e:
            raise DocumentIndexError(f"{self.path}: not a usable document database ({e})") from None
        except OSError as e:
            raise DocumentIndexError(f"{self.path}: cannot be created ({e.strerror or e})") from None
        version = int(self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0])
        if version != SCHEMA_VERSION:
            raise DocumentIndexError(f"{self.path}: document database version {version}, this FlashDesk reads "
                              f"version {SCHEMA_VERSION}")

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> DocumentIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _tx(self) -> _Transaction:
        return _Transaction(self.db)

    # --- collections ---------------------------------------------------------
    def ensure_collection(self, name: str, embedding_model: str | None = None) -> int:
        """The collection's id, creating it when new. Setting a different
        embedding model drops the collection's stored vectors (they are no
        longer comparable) and marks its files for re-indexing."""
        name = name.strip()
        if not name:
            raise ValueError("a collection needs a name")
        with self._tx():
            row = self.db.execute("SELECT id, embedding_model FROM collections WHERE name=?", (name,)).fetchone()
            if row is None:
                cur = self.db.execute("INSERT INTO collections(name, embedding_model, created_at) VALUES (?,?,?)",
                                      (name, embedding_model, time.time()))
                return int(cur.lastrowid)
            cid, old = row
            if embedding_model is not None and embedding_model != old:
                self.db.execute("UPDATE collections SET embedding_model=? WHERE id=?", (embedding_model, cid))
                self.db.execute("DELETE FROM vectors WHERE chunk_id IN (SELECT c.id FROM chunks c JOIN files f "
                                "ON f.id=c.file_id WHERE f.collection_id=?)", (cid,))
                self.db.execute("UPDATE files SET state=?, sha256=NULL WHERE collection_id=? AND state=?",
                                (PENDING, cid, INDEXED))
            return int(cid)

    def collection_id(self, name: str) -> int:
        row = self.db.execute("SELECT id FROM collections WHERE name=?", (name,)).fetchone()
        if row is None:
            known = ", ".join(self.collection_names()) or "none yet"
            raise DocumentIndexError(f"{self.path}: no collection named {name!r} (collections: {known})")
        return int(row[0])

    def collection_names(self) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT name FROM collections ORDER BY name")]

    def add_roots(self, collection_id: int, paths: Iterable[str | Path]) -> list[str]:
        """Remember folders/files as part of a collection (absolute paths)."""
        added = []
        with self._tx():
            for p in paths:
                ap = str(Path(p).expanduser().resolve())
                self.db.execute("INSERT OR IGNORE INTO roots VALUES (?, ?)", (collection_id, ap))
                added.append(ap)
        return added

    def roots(self, collection_id: int) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT path FROM roots WHERE collection_id=? ORDER BY path",
                                              (collection_id,))]

    def remove_collection(self, name: str) -> None:
        cid = self.collection_id(name)
        with self._tx():
            self.db.execute("DELETE FROM chunks WHERE file_id IN (SELECT id FROM files WHERE collection_id=?)",
                            (cid,))
            self.db.execute("DELETE FROM collections WHERE id=?", (cid,))

    def collection_info(self, name: str) -> CollectionInfo:
        cid = self.collection_id(name)
        emb = self.db.execute("SELECT embedding_model FROM collections WHERE id=?", (cid,)).fetchone()[0]
        info = CollectionInfo(cid, name, emb, self.roots(cid))
        for state, n in self.db.execute("SELECT state, COUNT(*) FROM files WHERE collection_id=? GROUP BY state",
                                        (cid,)):
            setattr(info, f"n_{state}", n)
            info.n_files += n
        info.n_chunks = self.db.execute("SELECT COUNT(*) FROM chunks c JOIN files f ON f.id=c.file_id "
                                        "WHERE f.collection_id=?", (cid,)).fetchone()[0]
        info.n_vectors = self.db.execute("SELECT COUNT(*) FROM vectors v JOIN chunks c ON c.id=v.chunk_id "
                                         "JOIN files f ON f.id=c.file_id WHERE f.collection_id=?",
                                         (cid,)).fetchone()[0]
        return info

    def collections(self) -> list[CollectionInfo]:
        return [self.collection_info(n) for n in self.collection_names()]

    # --- runs ------------------------------------------------------------------
    def start_run(self, collection_id: int) -> int:
        with self._tx():
            cur = self.db.execute("INSERT INTO runs(collection_id, started_at, state) VALUES (?,?,?)",
                                  (collection_id, time.time(), "running"))
            return int(cur.lastrowid)

    def finish_run(self, run_id: int, state: str) -> None:
        with self._tx():
            self.db.execute("UPDATE runs SET finished_at=?, state=? WHERE id=?", (time.time(), state, run_id))

    # --- files -------------------------------------------------------------------
    def files(self, collection_id: int) -> list[FileRecord]:
        rows = self.db.execute(f"SELECT {_FILE_COLS} FROM files WHERE collection_id=? ORDER BY path",
                               (collection_id,))
        return [FileRecord(*r) for r in rows]

    def file(self, collection_id: int, path: str) -> FileRecord | None:
        r = self.db.execute(f"SELECT {_FILE_COLS} FROM files WHERE collection_id=? AND path=?",
                            (collection_id, path)).fetchone()
        return FileRecord(*r) if r else None

    def add_pending(self, collection_id: int, entries: Sequence[tuple[str, str | None, int]]) -> None:
        """Record newly found files (path, kind, size) as pending, in one transaction."""
        with self._tx():
            self.db.executemany(
                "INSERT OR IGNORE INTO files(collection_id, path, name, kind, size, state) VALUES (?,?,?,?,?,?)",
                [(collection_id, p, Path(p).name, k, s, PENDING) for p, k, s in entries])

    def touch_file(self, file_id: int, size: int, mtime_ns: int) -> None:
        """Same content, new mtime: remember it so the next run skips the hashing."""
        with self._tx():
            self.db.execute("UPDATE files SET size=?, mtime_ns=? WHERE id=?", (size, mtime_ns, file_id))

    def store_file(self, file_id: int, chunks: Sequence[Chunk], *, kind: str, size: int, mtime_ns: int,
                   sha256: str, n_pages: int, run_id: int, vectors: np.ndarray | None = None,
                   model: str | None = None) -> None:
        """Replace a file's chunks (and vectors) and mark it indexed: all or nothing."""
        if vectors is not None and len(vectors) != len(chunks):
            raise ValueError(f"{len(vectors)} vectors for {len(chunks)} chunks")
        with self._tx():
            self.db.execute("DELETE FROM chunks WHERE file_id=?", (file_id,))
            for i, c in enumerate(chunks):
                cur = self.db.execute(
                    "INSERT INTO chunks(file_id, ord, text, heading, page, line_start, line_end) "
                    "VALUES (?,?,?,?,?,?,?)", (file_id, i, c.text, c.heading, c.page, c.line_start, c.line_end))
                if vectors is not None:
                    v = np.ascontiguousarray(vectors[i], dtype=np.float32)
                    self.db.execute("INSERT INTO vectors VALUES (?,?,?,?)",
                                    (cur.lastrowid, model, v.shape[0], v.tobytes()))
            self.db.execute(
                "UPDATE files SET kind=?, size=?, mtime_ns=?, sha256=?, state=?, error=NULL, n_pages=?, "
                "n_chunks=?, indexed_run=?, indexed_at=? WHERE id=?",
                (kind, size, mtime_ns, sha256, INDEXED, n_pages, len(chunks), run_id, time.time(), file_id))

    def mark_file(self, file_id: int, state: str, error: str, *, size: int | None = None,
                  mtime_ns: int | None = None, sha256: str | None = None) -> None:
        """Record a skipped or failed file (its old chunks go: they no longer match the file)."""
        with self._tx():
            self.db.execute("DELETE FROM chunks WHERE file_id=?", (file_id,))
            self.db.execute("UPDATE files SET state=?, error=?, size=?, mtime_ns=?, sha256=?, n_chunks=0 "
                            "WHERE id=?", (state, error, size, mtime_ns, sha256, file_id))

    def remove_files(self, collection_id: int, paths: Iterable[str]) -> int:
        """Drop files that are gone from disk (or from the collection's roots)."""
        n = 0
        with self._tx():
            for p in paths:
                row = self.db.execute("SELECT id FROM files WHERE collection_id=? AND path=?",
                                      (collection_id, p)).fetchone()
                if row:
                    self.db.execute("DELETE FROM chunks WHERE file_id=?", (row[0],))
                    self.db.execute("DELETE FROM files WHERE id=?", (row[0],))
                    n += 1
        return n

    # --- search ------------------------------------------------------------------
    def search_fts(self, match: str, collection_ids: Sequence[int], limit: int) -> list[tuple[int, float]]:
        """(chunk id, bm25 score: lower is better) for an FTS5 MATCH expression."""
        if not match or not collection_ids:
            return []
        marks = ",".join("?" * len(collection_ids))
        # text matters most; a heading or file name match helps
        sql = (f"SELECT chunks_fts.rowid, bm25(chunks_fts, 1.0, 0.6, 0.4) AS s FROM chunks_fts "
               f"JOIN chunks c ON c.id = chunks_fts.rowid JOIN files f ON f.id = c.file_id "
               f"WHERE chunks_fts MATCH ? AND f.collection_id IN ({marks}) ORDER BY s LIMIT ?")
        try:
            return [(int(r[0]), float(r[1])) for r in self.db.execute(sql, (match, *collection_ids, limit))]
        except sqlite3.OperationalError as e:
            raise DocumentIndexError(f"{self.path}: full-text query {match!r} failed ({e})") from None

    def vectors(self, collection_ids: Sequence[int], model: str) -> tuple[np.ndarray, np.ndarray]:
        """(chunk ids, matrix n x dim) of the stored vectors made by `model`."""
        marks = ",".join("?" * len(collection_ids))
        rows = self.db.execute(
            f"SELECT v.chunk_id, v.data FROM vectors v JOIN chunks c ON c.id=v.chunk_id JOIN files f "
            f"ON f.id=c.file_id WHERE f.collection_id IN ({marks}) AND v.model=? ORDER BY v.chunk_id",
            (*collection_ids, model)).fetchall()
        if not rows:
            return np.empty(0, dtype=np.int64), np.empty((0, 0), dtype=np.float32)
        ids = np.array([r[0] for r in rows], dtype=np.int64)
        mat = np.stack([np.frombuffer(r[1], dtype=np.float32) for r in rows])
        return ids, mat

    def chunks_by_id(self, ids: Sequence[int]) -> dict[int, ChunkRecord]:
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        rows = self.db.execute(
            f"SELECT c.id, c.file_id, f.path, f.name, c.ord, c.text, c.heading, c.page, c.line_start, "
            f"c.line_end, k.name FROM chunks c JOIN files f ON f.id=c.file_id JOIN collections k "
            f"ON k.id=f.collection_id WHERE c.id IN ({marks})", tuple(ids))
        return {r[0]: ChunkRecord(*r) for r in rows}

    def file_chunks(self, file_id: int) -> list[ChunkRecord]:
        ids = [r[0] for r in self.db.execute("SELECT id FROM chunks WHERE file_id=? ORDER BY ord", (file_id,))]
        by_id = self.chunks_by_id(ids)
        return [by_id[i] for i in ids]


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error (re-entrant: inner ones join)."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db
        self.outer = False

    def __enter__(self) -> None:
        if not self.db.in_transaction:
            self.db.execute("BEGIN IMMEDIATE")
            self.outer = True

    def __exit__(self, exc_type: object, *_: object) -> None:
        if not self.outer:
            return
        if exc_type is None:
            self.db.execute("COMMIT")
        else:
            self.db.execute("ROLLBACK")
