"""The indexer survives being killed: a real `flashdesk docs add` process is
SIGKILLed mid-run, `docs update` finishes the index without duplicates and
without redoing committed files; afterwards a changed file is re-indexed, a
touched-but-unchanged one is not, a deleted one leaves the index. Cancelling
in-process stops between files and a second run completes."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from documents_corpus import build_corpus

from app.documents.index import INDEXED, PENDING, SKIPPED, DocumentIndex
from app.documents.indexer import OUT_INDEXED, OUT_REMOVED, OUT_UNCHANGED, Indexer

REPO = Path(__file__).resolve().parent.parent


def _docs(*args: str, **kw) -> subprocess.Popen:  # noqa: ANN003
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "app.cli", "docs", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _states(db: Path) -> dict[str, tuple[str, int | None, int]]:
    con = sqlite3.connect(db)
    try:
        return {p: (s, r, n) for p, s, r, n in con.execute("SELECT path, state, indexed_run, n_chunks FROM files")}
    finally:
        con.close()


def _check_consistent(db: Path) -> None:
    """No duplicate files or chunks, FTS in step with chunks, counts match."""
    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert con.execute("SELECT COUNT(*) - COUNT(DISTINCT collection_id || path) FROM files").fetchone()[0] == 0
        assert con.execute("SELECT COUNT(*) - COUNT(DISTINCT file_id || ':' || ord) FROM chunks").fetchone()[0] == 0
        n_chunks = con.execute("SELECT COUNT(*) FROM chunks").fetchone()[0]
        assert con.execute("SELECT COUNT(*) FROM chunks_fts").fetchone()[0] == n_chunks
        assert con.execute("SELECT COUNT(*) FROM chunks_fts f LEFT JOIN chunks c ON c.id = f.rowid "
                           "WHERE c.id IS NULL").fetchone()[0] == 0
        # the same text twice in one file would mean a file was stored twice
        assert con.execute("SELECT COUNT(*) FROM (SELECT file_id, text FROM chunks GROUP BY file_id, text "
                           "HAVING COUNT(*) > 1)").fetchone()[0] == 0
        bad = con.execute("SELECT f.path FROM files f WHERE f.n_chunks != "
                          "(SELECT COUNT(*) FROM chunks c WHERE c.file_id = f.id)").fetchall()
        assert bad == []
    finally:
        con.close()


@pytest.fixture
def big_corpus(tmp_path: Path) -> Path:
    root = tmp_path / "docs"
    for i in range(6):  # ~90 files: a run long enough to be killed in the middle
        build_corpus(root / f"copy{i}", seed=10 + i, broken=i == 0)
    return root


def test_killed_indexer_resumes_without_duplicates_and_reindexes_only_changes(big_corpus: Path,
                                                                              tmp_path: Path) -> None:
    db = tmp_path / "docs.sqlite3"
    n_files = sum(1 for p in big_corpus.rglob("*") if p.is_file())
    proc = _docs("add", str(big_corpus), "--collection", "c", "--db", str(db))
    try:
        done_lines = 0
        for line in proc.stderr:
            if line.startswith("["):
                done_lines += 1
                if done_lines == 3:
                    proc.send_signal(signal.SIGKILL)  # no cleanup, no rollback handler: a real crash
                    break
    finally:
        proc.wait(timeout=60)
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL

    after_kill = _states(db)
    n_done = sum(1 for s, _, _ in after_kill.values() if s in (INDEXED, SKIPPED))
    print(f"killed after {n_done} of {n_files} files")
    assert len(after_kill) == n_files  # every file was recorded as pending before indexing began
    assert 3 <= n_done < n_files, f"the kill should land mid-run: {n_done} of {n_files} done"
    assert any(s == PENDING for s, _, _ in after_kill.values())
    _check_consistent(db)

    resume = _docs("update", "--collection", "c", "--db", str(db), "--json")
    out, err = resume.communicate(timeout=300)
    assert resume.returncode == 0, err
    summary = __import__("json").loads(out)
    assert summary["state"] == "done"
    # files committed before the kill are not redone
    assert summary["n_unchanged"] == n_done and summary["n_indexed"] + summary["n_skipped"] == n_files - n_done
    after_resume = _states(db)
    assert set(after_resume) == set(after_kill)
    assert all(s in (INDEXED, SKIPPED) for s, _, _ in after_resume.values())
    for path, (state, run, _) in after_kill.items():
        if state == INDEXED:
            assert after_resume[path][1] == run  # still the first run's chunks
    _check_consistent(db)

    # change one file, touch another without changing it, delete a third
    copy = big_corpus / "copy1"
    changed, touched, deleted = copy / "notes" / "notes.txt", copy / "guide.md", copy / "faq.html"
    changed.write_text(changed.read_text() + "\nThe greenhouse thermostat is set to 21 degrees.\n")
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 5_000_000_000))
    deleted.unlink()
    index = DocumentIndex(db)
    cid = index.collection_id("c")
    before = {f.path: f for f in index.files(cid)}
    chunk_ids_before = {f.path: [c.id for c in index.file_chunks(f.id)] for f in before.values()}
    events = {}
    prog = Indexer(index).run("c", on_progress=lambda p, ev: ev and events.__setitem__(ev.path, ev.outcome))
    assert events[str(changed)] == OUT_INDEXED
    assert events[str(touched)] == OUT_UNCHANGED
    assert events[str(deleted)] == OUT_REMOVED
    assert prog.n_indexed == 1 and prog.n_removed == 1 and prog.n_unchanged == n_files - 2
    after = {f.path: f for f in index.files(cid)}
    assert str(deleted) not in after
    assert after[str(changed)].indexed_run == prog.run_id != before[str(changed)].indexed_run
    for path, f in after.items():
        if path != str(changed):
            assert f.indexed_run == before[path].indexed_run and f.sha256 == before[path].sha256
            assert [c.id for c in index.file_chunks(f.id)] == chunk_ids_before[path]
    assert after[str(touched)].mtime_ns == touched.stat().st_mtime_ns  # next run skips it without hashing
    hits = index.search_fts('"greenhouse" OR "thermostat"', [cid], 5)
    assert [index.chunks_by_id([hits[0][0]])[hits[0][0]].path] == [str(changed)]
    index.close()
    _check_consistent(db)


def test_cancel_stops_between_files_and_a_second_run_completes(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    build_corpus(root)
    index = DocumentIndex(tmp_path / "docs.sqlite3")
    index.add_roots(index.ensure_collection("c"), [root])
    cancel = threading.Event()

    def on_progress(p, ev) -> None:  # noqa: ANN001
        if p.files_done == 4:
            cancel.set()

    first = Indexer(index).run("c", cancel, on_progress)
    assert first.state == "cancelled" and first.files_done == 4
    files = index.files(index.collection_id("c"))
    assert sum(f.state == PENDING for f in files) == len(files) - 4
    second = Indexer(index).run("c")
    assert second.state == "done" and second.n_unchanged == 4
    assert second.n_indexed + second.n_skipped == len(files) - 4
    index.close()
    _check_consistent(tmp_path / "docs.sqlite3")
