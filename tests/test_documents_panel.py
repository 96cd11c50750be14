"""The documents panel offscreen (pytest-qt): a real index on real files, indexed
by the panel's worker thread; states, errors and progress shown; cancel; a new
panel on the same database resumes what was left; sources open at their page."""

from __future__ import annotations

from pathlib import Path

import pytest
from documents_corpus import BROKEN, build_corpus

from app.documents.index import INDEXED, PENDING, SKIPPED, DocumentIndex
from app.ui.documents_panel import DocumentsPanel
from app.ui.sources_list import SourcesList

pytest.importorskip("pytestqt")


def _rows(panel: DocumentsPanel) -> dict[str, tuple[str, str]]:
    m = panel.files_model
    return {m.index(r, 0).data(): (m.index(r, 1).data(), m.index(r, 4).data()) for r in range(m.rowCount())}


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "docs"
    build_corpus(root)
    return root


def test_panel_indexes_a_folder_and_shows_states_errors_and_progress(qtbot, corpus: Path, tmp_path: Path) -> None:  # noqa: ANN001
    panel = DocumentsPanel(db_path=tmp_path / "docs.sqlite3")
    qtbot.addWidget(panel)
    seen: list[list[str]] = []
    panel.collectionsChanged.connect(seen.append)
    with qtbot.waitSignal(panel.indexingFinished, timeout=120_000) as blocker:
        panel.add_paths("work", [corpus])
    prog = blocker.args[0]
    assert prog.state == "done" and prog.n_skipped == len(BROKEN)
    assert panel.progress_bar.value() == panel.progress_bar.maximum()
    assert not panel.busy and not panel.cancel_button.isEnabled()
    assert panel.current_collection() == "work" and seen[-1] == ["work"]
    rows = _rows(panel)
    assert len(rows) == sum(1 for p in corpus.rglob("*") if p.is_file())
    for name, why in BROKEN.items():
        state, note = rows[name]
        assert state == SKIPPED and why in note
    assert rows["handbook.pdf"][0] == INDEXED
    item_text = panel.collection_list.currentItem().text()
    assert f"{len(rows) - len(BROKEN)}/{len(rows)} files" in item_text and f"{len(BROKEN)} problems" in item_text
    assert "done" in panel.status.text() and "problems" in panel.status.text()
    panel.shutdown()


def test_cancel_then_a_new_panel_resumes_the_pending_files(qtbot, corpus: Path, tmp_path: Path) -> None:  # noqa: ANN001
    db = tmp_path / "docs.sqlite3"
    panel = DocumentsPanel(db_path=db)
    qtbot.addWidget(panel)
    done = []

    def on_file(ev) -> None:  # noqa: ANN001 - cancel from the UI thread as soon as one file is in
        done.append(ev)
        panel.cancel()

    panel.worker.fileDone.connect(on_file)
    with qtbot.waitSignal(panel.indexingFinished, timeout=120_000) as blocker:
        panel.add_paths("work", [corpus])
    assert blocker.args[0].state == "cancelled"
    n_files = sum(1 for p in corpus.rglob("*") if p.is_file())
    states = [r[0] for r in _rows(panel).values()]
    assert PENDING in states and len(states) == n_files
    panel.shutdown()

    # "restart the app": a new panel on the same database picks the run up again
    again = DocumentsPanel(db_path=db, autoresume=False)
    qtbot.addWidget(again)
    with qtbot.waitSignal(again.indexingFinished, timeout=120_000) as blocker:
        assert again.resume_pending() == ["work"]
    prog = blocker.args[0]
    assert prog.state == "done" and prog.n_unchanged == blocker.args[0].files_total - prog.n_indexed - prog.n_skipped
    assert prog.n_unchanged >= 1  # what the first run committed was not redone
    assert PENDING not in [r[0] for r in _rows(again).values()]
    again.shutdown()
    with DocumentIndex(db) as index:
        info = index.collection_info("work")
        assert info.n_pending == 0 and info.n_indexed + info.n_skipped == n_files


def test_sources_list_opens_the_file_at_its_page_or_line(qtbot) -> None:  # noqa: ANN001
    opened = []
    view = SourcesList(opener=lambda f, page, line: opened.append((f, page, line)))
    qtbot.addWidget(view)
    view.set_sources([
        {"n": 1, "file": "/d/handbook.pdf", "name": "handbook.pdf", "page": 2, "line_start": 4, "line_end": 9,
         "score": 3.2},
        {"n": 2, "file": "/d/guide.md", "name": "guide.md", "page": None, "line_start": 12, "line_end": 20,
         "score": 1.5},
    ])
    assert [view.item(i).text() for i in range(2)] == ["[1] handbook.pdf, page 2", "[2] guide.md, lines 12-20"]
    view.itemActivated.emit(view.item(0))
    view.itemActivated.emit(view.item(1))
    assert opened == [("/d/handbook.pdf", 2, None), ("/d/guide.md", None, 12)]


def test_open_command_uses_a_viewer_that_knows_pages_and_lines() -> None:
    from app.documents.open_at import open_command

    have = {"evince", "gedit"}
    which = lambda name: f"/usr/bin/{name}" if name in have else None  # noqa: E731
    assert open_command("/d/a.pdf", page=3, which=which) == ["evince", "-i", "3", "/d/a.pdf"]
    assert open_command("/d/a.md", line=12, which=which) == ["gedit", "+12", "/d/a.md"]
    assert open_command("/d/a.docx", line=3, which=which)[-1] == "/d/a.docx"  # no line numbers in DOCX viewers
    assert open_command("/d/a.pdf", page=3, which=lambda n: None)[-1] == "/d/a.pdf"
