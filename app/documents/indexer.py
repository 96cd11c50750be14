"""One indexing run over a collection: find files under its roots, index what
is new or changed, skip what is not, drop what is gone.

- progress: `on_progress(IndexProgress, FileEvent | None)` after each file;
- cancel: a threading.Event checked between files (a file is all or nothing);
- resume: nothing to do but run again. A file is committed with its content
  hash in one transaction, so after a crash or a kill the next run finds
  the committed files unchanged and indexes only the rest;
- changed or not: same size and mtime as recorded -> unchanged without
  reading; else the SHA-256 of the content decides.

A broken, password-protected or empty file is recorded as skipped with its
reason; an unexpected error in one file is recorded as failed. Neither stops
the run. Runs in whatever thread calls it (the UI runs it in a QThread).
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from app.documents.chunking import chunk_document
from app.documents.index import FAILED, INDEXED, SKIPPED, DocumentIndex
from app.documents.ingest import SkipFile, kind_of, read_document

# folders never worth indexing (caches, VCS internals, virtualenvs, dependencies)
_SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv", "venv", ".tox", ".mypy_cache",
              ".pytest_cache", ".ruff_cache", ".cache", ".idea", ".vscode", "build", "dist", ".eggs"}

OUT_INDEXED = "indexed"
OUT_UNCHANGED = "unchanged"
OUT_SKIPPED = "skipped"
OUT_FAILED = "failed"
OUT_REMOVED = "removed"


@dataclass
class FileEvent:
    """What happened to one file in this run."""
    path: str
    outcome: str  # OUT_*
    reason: str = ""
    n_chunks: int = 0
    n_pages: int = 0
    size: int = 0


@dataclass
class IndexProgress:
    collection: str
    state: str = "scanning"  # scanning | indexing | done | cancelled
    files_total: int = 0
    files_done: int = 0
    bytes_total: int = 0
    bytes_done: int = 0
    n_indexed: int = 0
    n_unchanged: int = 0
    n_skipped: int = 0
    n_failed: int = 0
    n_removed: int = 0
    pages_indexed: int = 0  # PDF pages read in this run
    bytes_indexed: int = 0  # bytes of the files (re)indexed in this run
    chunks_indexed: int = 0
    elapsed_s: float = 0.0
    current: str = ""
    errors: list[tuple[str, str]] = field(default_factory=list)  # (path, reason) of skipped/failed files
    run_id: int = 0

    @property
    def fraction(self) -> float:
        return self.bytes_done / self.bytes_total if self.bytes_total else (1.0 if self.state == "done" else 0.0)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["errors"] = [{"file": p, "reason": r} for p, r in self.errors]
        d["elapsed_s"] = round(self.elapsed_s, 4)
        t = max(self.elapsed_s, 1e-9)
        d["pages_per_s"] = round(self.pages_indexed / t, 2)
        d["mb_per_s"] = round(self.bytes_indexed / 1e6 / t, 3)
        return d


ProgressCallback = Callable[[IndexProgress, "FileEvent | None"], None]


def discover(root: Path, skipped: list[tuple[str, str]] | None = None) -> list[Path]:
    """Supported files under a folder (or the file itself), sorted; hidden and
    cache folders are left out. What cannot be walked (an unreadable folder, a
    broken or looping symbolic link, a link to a folder, which is not followed)
    is added to `skipped` as (path, reason)."""
    note = skipped.append if skipped is not None else (lambda _item: None)
    if root.is_file():
        return [root] if kind_of(root) else []

    def unreadable(e: OSError) -> None:
        note((str(e.filename or root), f"folder cannot be read ({e.strerror or e}): skipped"))

    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable):
        for d in sorted(dirnames):
            if Path(dirpath, d).is_symlink() and d not in _SKIP_DIRS and not d.startswith("."):
                note((str(Path(dirpath, d)), "a symbolic link to a folder: not followed (it could loop)"))
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            p = Path(dirpath) / name
            if name.startswith(".") or not kind_of(p):
                continue
            if p.is_file():
                found.append(p)
            elif p.is_symlink():
                try:
                    p.stat()
                    reason = "not a regular file"
                except OSError as e:
                    reason = ("a symbolic link that loops" if e.errno == errno.ELOOP else
                              "a broken symbolic link" if e.errno == errno.ENOENT else
                              f"cannot be read ({e.strerror or e})")
                note((str(p), f"{reason}: skipped"))
            else:
                note((str(p), "not a regular file: skipped"))
    return found


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Indexer:
    """Indexes collections of one DocumentIndex, with an optional embedding model."""

    def __init__(self, index: DocumentIndex, embedder: object | None = None):
        # embedder: an app.documents.embedding.EmbeddingModel (anything with .path, .id, .embed)
        self.index = index
        self.embedder = embedder

    def run(self, collection: str, cancel: threading.Event | None = None,
            on_progress: ProgressCallback | None = None) -> IndexProgress:
        """Bring the collection's index up to date with its roots (see module doc)."""
        t0 = time.perf_counter()
        cid = self.index.collection_id(collection)
        if self.embedder is not None:
            # a different model than the stored vectors': they are dropped and rebuilt
            self.index.ensure_collection(collection, str(Path(self.embedder.path).resolve()))
        prog = IndexProgress(collection)
        notify = on_progress or (lambda _p, _e: None)
        notify(prog, None)

        found: dict[str, Path] = {}
        live_roots: list[str] = []
        for root in self.index.roots(cid):
            rp = Path(root)
            if not rp.exists():
                # an unplugged drive must not wipe its files from the index
                prog.errors.append((root, "folder or file not found (its index entries are kept)"))
                continue
            live_roots.append(root)
            for p in discover(rp, prog.errors):
                found.setdefault(str(p), p)
        known = {f.path: f for f in self.index.files(cid)}
        gone = [p for p in known if p not in found and _under_any(p, live_roots)]
        if gone:
            prog.n_removed = self.index.remove_files(cid, gone)
            for p in gone:
                notify(prog, FileEvent(p, OUT_REMOVED))
        sizes = {p: _size(path) for p, path in found.items()}
        self.index.add_pending(cid, [(p, kind_of(found[p]), sizes[p]) for p in found if p not in known])
        prog.files_total = len(found)
        prog.bytes_total = sum(sizes.values())
        prog.run_id = self.index.start_run(cid)
        prog.state = "indexing"
        notify(prog, None)

        state = "done"
        for p, path in found.items():
            if cancel is not None and cancel.is_set():
                state = "cancelled"
                break
            prog.current = p
            ev = self._index_file(cid, p, path, prog.run_id)
            prog.files_done += 1
            prog.bytes_done += sizes[p]
            if ev.outcome == OUT_INDEXED:
                prog.n_indexed += 1
                prog.pages_indexed += ev.n_pages
                prog.bytes_indexed += ev.size
                prog.chunks_indexed += ev.n_chunks
            elif ev.outcome == OUT_UNCHANGED:
                prog.n_unchanged += 1
            else:
                prog.n_skipped += ev.outcome == OUT_SKIPPED
                prog.n_failed += ev.outcome == OUT_FAILED
                prog.errors.append((p, ev.reason))
            prog.elapsed_s = time.perf_counter() - t0
            notify(prog, ev)
        prog.state = state
        prog.current = ""
        prog.elapsed_s = time.perf_counter() - t0
        self.index.finish_run(prog.run_id, state)
        notify(prog, None)
        return prog

    def _index_file(self, cid: int, key: str, path: Path, run_id: int) -> FileEvent:
        rec = self.index.file(cid, key)
        try:
            st = path.stat()
        except OSError as e:
            reason = f"cannot be read ({e.strerror or e})"
            self.index.mark_file(rec.id, FAILED, reason)
            return FileEvent(key, OUT_FAILED, reason)
        done_before = rec.state in (INDEXED, SKIPPED)
        if done_before and rec.size == st.st_size and rec.mtime_ns == st.st_mtime_ns:
            return FileEvent(key, OUT_UNCHANGED, size=st.st_size)
        try:
            digest = file_sha256(path)
        except OSError as e:
            reason = f"cannot be read ({e.strerror or e})"
            self.index.mark_file(rec.id, FAILED, reason)
            return FileEvent(key, OUT_FAILED, reason)
        if done_before and rec.sha256 == digest:
            self.index.touch_file(rec.id, st.st_size, st.st_mtime_ns)
            return FileEvent(key, OUT_UNCHANGED, size=st.st_size)
        try:
            doc = read_document(path)
            chunks = chunk_document(doc)
            vectors = self.embedder.embed([_embed_text(c.heading, c.text) for c in chunks]) if self.embedder else None
            self.index.store_file(rec.id, chunks, kind=doc.kind, size=st.st_size, mtime_ns=st.st_mtime_ns,
                                  sha256=digest, n_pages=doc.n_pages, run_id=run_id, vectors=vectors,
                                  model=self.embedder.id if self.embedder else None)
        except SkipFile as e:
            # the hash is kept: an unchanged broken file is not retried every run
            self.index.mark_file(rec.id, SKIPPED, e.reason, size=st.st_size, mtime_ns=st.st_mtime_ns,
                                 sha256=digest)
            return FileEvent(key, OUT_SKIPPED, e.reason, size=st.st_size)
        except Exception as e:  # noqa: BLE001 - one bad file must never stop the run
            reason = f"{type(e).__name__}: {e}"
            self.index.mark_file(rec.id, FAILED, reason)
            return FileEvent(key, OUT_FAILED, reason, size=st.st_size)
        return FileEvent(key, OUT_INDEXED, n_chunks=len(chunks), n_pages=doc.n_pages, size=st.st_size)


def _embed_text(heading: str, text: str) -> str:
    return f"{heading}\n{text}" if heading else text


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _under_any(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)
