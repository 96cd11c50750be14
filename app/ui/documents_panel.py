"""The documents panel: collections, their files with state and errors, indexing
progress with cancel.

Indexing runs in an IndexWorker on its own QThread with its own database
connection; the panel reads through another (SQLite WAL lets both work at
once). On open, collections left with pending files (the app was closed or
killed mid-run) resume by themselves. Nothing here knows llama.cpp: an
embedding model runs in its own process (app.host.embedder).
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QObject, Qt, QThread, QTimer, Signal, Slot
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QInputDialog,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from app.documents.index import FAILED, INDEXED, PENDING, SKIPPED, DocumentIndex, FileRecord, default_db_path
from app.documents.indexer import FileEvent, Indexer, IndexProgress
from app.errors import FlashDeskError
from app.host.embedder import EmbedderProcess

_STATE_COLOURS = {INDEXED: "#1b7f3b", PENDING: "#6a717a", SKIPPED: "#9a6700", FAILED: "#b42318"}


class IndexWorker(QObject):
    """Runs indexing jobs in the worker thread (one at a time, in order)."""

    progress = Signal(object)  # IndexProgress (a copy)
    fileDone = Signal(object)  # FileEvent
    finished = Signal(object)  # IndexProgress of the finished (or cancelled) run
    failed = Signal(str, str)  # collection, message

    def __init__(self, db_path: Path):
        super().__init__()
        self._db_path = db_path
        self._index: DocumentIndex | None = None
        self._embedders: dict[str, EmbedderProcess] = {}  # llama.cpp runs in their processes, not here

    @Slot(str, object)
    def run(self, collection: str, cancel: threading.Event) -> None:
        try:
            if self._index is None:  # opened here: a connection stays in its thread
                self._index = DocumentIndex(self._db_path)
            embedder = self._embedder(self._index.collection_info(collection).embedding_model)

            def report(p: IndexProgress, ev: FileEvent | None) -> None:
                snap = copy.copy(p)
                snap.errors = list(p.errors)
                self.progress.emit(snap)
                if ev is not None:
                    self.fileDone.emit(ev)

            prog = Indexer(self._index, embedder).run(collection, cancel, report)
            self.finished.emit(prog)
        except (FlashDeskError, OSError) as e:
            self.failed.emit(collection, str(e))
        except Exception as e:  # noqa: BLE001 - the panel shows it; the thread must live on
            self.failed.emit(collection, f"{type(e).__name__}: {e}")

    def _embedder(self, path: str | None) -> EmbedderProcess | None:
        if not path:
            return None
        if path not in self._embedders:
            self._embedders[path] = EmbedderProcess(path)
        return self._embedders[path]

    @Slot()
    def shutdown(self) -> None:
        for e in self._embedders.values():
            e.close()
        self._embedders.clear()
        if self._index is not None:
            self._index.close()
            self._index = None
        QThread.currentThread().quit()


class FilesModel(QAbstractTableModel):
    """The files of one collection: name, state, chunks, pages, note (error or folder)."""

    HEADERS = ("File", "State", "Chunks", "Pages", "Note")

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self.files: list[FileRecord] = []

    def set_files(self, files: list[FileRecord]) -> None:
        self.beginResetModel()
        self.files = files
        self.endResetModel()

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008, N802 - Qt API
        return 0 if parent.isValid() else len(self.files)

    def columnCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008, N802 - Qt API
        return 0 if parent.isValid() else len(self.HEADERS)

    def headerData(self, section: int, orientation: Qt.Orientation,  # noqa: N802 - Qt API
                   role: int = Qt.ItemDataRole.DisplayRole) -> object:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return self.HEADERS[section]
        return None

    def data(self, index: QModelIndex, role: int = Qt.ItemDataRole.DisplayRole) -> object:
        if not index.isValid():
            return None
        f = self.files[index.row()]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return (f.name, f.state, str(f.n_chunks), str(f.n_pages or ""),
                    f.error or str(Path(f.path).parent))[col]
        if role == Qt.ItemDataRole.ToolTipRole:
            return f"{f.path}\n{f.state}" + (f": {f.error}" if f.error else "")
        if role == Qt.ItemDataRole.ForegroundRole and col in (1, 4):
            colour = _STATE_COLOURS.get(f.state) if col == 1 or f.error else None
            return QBrush(QColor(colour)) if colour else None
        return None


class DocumentsPanel(QWidget):
    """Collections on the left, the selected one's files on the right, progress below."""

    _runRequested = Signal(str, object)
    _shutdownRequested = Signal()
    collectionsChanged = Signal(list)  # collection names (for a chat's collection picker)
    indexingStarted = Signal(str)
    indexingFinished = Signal(object)  # IndexProgress
    indexingFailed = Signal(str, str)

    def __init__(self, parent: QWidget | None = None, db_path: str | Path | None = None, autoresume: bool = True):
        super().__init__(parent)
        self.db_path = Path(db_path) if db_path else default_db_path()
        self.index = DocumentIndex(self.db_path)
        self.files_model = FilesModel(self)
        self._queue: list[str] = []
        self._running: str | None = None
        self._cancel: threading.Event | None = None
        self.last_progress: IndexProgress | None = None
        self._closed = False
        self._build()
        self.thread = QThread()
        self.thread.setObjectName("flashdesk-indexer")
        self.worker = IndexWorker(self.db_path)
        self.worker.moveToThread(self.thread)
        self._runRequested.connect(self.worker.run)
        self._shutdownRequested.connect(self.worker.shutdown)
        self.worker.progress.connect(self._on_progress)
        self.worker.finished.connect(self._on_finished)
        self.worker.failed.connect(self._on_failed)
        self.thread.start()
        self._refresh_timer = QTimer(self)
        self._refresh_timer.setInterval(300)  # the file list follows a run without re-reading per file
        self._refresh_timer.timeout.connect(self.refresh_files)
        self.refresh()
        if autoresume:
            self.resume_pending()

    # --- layout -----------------------------------------------------------------
    def _build(self) -> None:
        self.collection_list = QListWidget()
        self.collection_list.currentItemChanged.connect(lambda *_: self.refresh_files())
        self.new_button = QPushButton("New collection…")
        self.add_folder_button = QPushButton("Add folder…")
        self.add_files_button = QPushButton("Add files…")
        self.reindex_button = QPushButton("Update")
        self.reindex_button.setToolTip("Re-scan the folders: index new and changed files, drop deleted ones")
        self.embed_button = QPushButton("Embedding model…")
        self.embed_button.setToolTip("Optional: a GGUF embedding model for hybrid (keyword + meaning) search")
        self.remove_button = QPushButton("Remove")
        self.new_button.clicked.connect(self._ask_new_collection)
        self.add_folder_button.clicked.connect(self._ask_add_folder)
        self.add_files_button.clicked.connect(self._ask_add_files)
        self.reindex_button.clicked.connect(lambda: self.start_indexing(self.current_collection() or ""))
        self.embed_button.clicked.connect(self._ask_embedding_model)
        self.remove_button.clicked.connect(self._ask_remove)
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(0, 0, 0, 0)
        ll.addWidget(QLabel("Collections"))
        ll.addWidget(self.collection_list, 1)
        for b in (self.new_button, self.add_folder_button, self.add_files_button, self.reindex_button,
                  self.embed_button, self.remove_button):
            ll.addWidget(b)

        self.files_view = QTableView()
        self.files_view.setModel(self.files_model)
        self.files_view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        header = self.files_view.horizontalHeader()
        for col in range(4):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(4, QHeaderView.ResizeMode.Stretch)
        self.files_view.verticalHeader().hide()
        self.summary = QLabel()
        self.summary.setWordWrap(True)
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.summary)
        rl.addWidget(self.files_view, 1)

        split = QSplitter()
        split.addWidget(left)
        split.addWidget(right)
        split.setStretchFactor(1, 3)
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, 1000)
        self.progress_bar.setValue(0)
        self.progress_bar.setTextVisible(False)  # no "0%" before the first run
        self.status = QLabel("idle")
        self.status.setWordWrap(True)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel)
        row = QHBoxLayout()
        row.addWidget(self.progress_bar, 1)
        row.addWidget(self.cancel_button)
        lay = QVBoxLayout(self)
        lay.addWidget(split, 1)
        lay.addLayout(row)
        lay.addWidget(self.status)

    # --- what the buttons do (also the API tests and the main window use) ----------
    def current_collection(self) -> str | None:
        item = self.collection_list.currentItem()
        return item.data(Qt.ItemDataRole.UserRole) if item else None

    def collection_names(self) -> list[str]:
        return self.index.collection_names()

    def create_collection(self, name: str) -> None:
        self.index.ensure_collection(name)
        self.refresh(select=name)

    def add_paths(self, collection: str, paths: list[str | Path]) -> None:
        """Add folders/files to a collection (created if new) and index them."""
        cid = self.index.ensure_collection(collection)
        self.index.add_roots(cid, paths)
        self.refresh(select=collection)
        self.start_indexing(collection)

    def set_embedding_model(self, collection: str, path: str | Path) -> None:
        self.index.ensure_collection(collection, str(Path(path).expanduser().resolve()))
        self.start_indexing(collection)

    def remove_collection(self, collection: str) -> None:
        if collection == self._running:
            raise FlashDeskError(f"collection {collection!r} is being indexed: cancel first")
        self._queue = [c for c in self._queue if c != collection]
        self.index.remove_collection(collection)
        self.refresh()

    def start_indexing(self, collection: str) -> None:
        """Queue an update run of the collection (one run at a time)."""
        if not collection or collection == self._running or collection in self._queue:
            return
        self._queue.append(collection)
        self._next()

    def resume_pending(self) -> list[str]:
        """Restart runs for collections left with pending or failed files."""
        todo = [c.name for c in self.index.collections() if c.n_pending or c.n_failed]
        for name in todo:
            self.start_indexing(name)
        return todo

    def cancel(self) -> None:
        """Stop the running job after the file in hand (it commits or rolls back whole)."""
        self._queue.clear()
        if self._cancel is not None:
            self._cancel.set()
            self.status.setText(f"cancelling {self._running!r}…")

    @property
    def busy(self) -> bool:
        return self._running is not None

    def _next(self) -> None:
        if self._running is not None or not self._queue:
            return
        self._running = self._queue.pop(0)
        self._cancel = threading.Event()
        self.cancel_button.setEnabled(True)
        self.progress_bar.setValue(0)
        self.progress_bar.setTextVisible(True)
        self.status.setText(f"scanning {self._running!r}…")
        self._refresh_timer.start()
        self.indexingStarted.emit(self._running)
        self._runRequested.emit(self._running, self._cancel)

    # --- worker signals ------------------------------------------------------------
    @Slot(object)
    def _on_progress(self, p: IndexProgress) -> None:
        if self._closed:  # a late signal from the run cancelled at shutdown
            return
        self.last_progress = p
        self.progress_bar.setValue(int(round(1000 * p.fraction)))
        if p.state == "indexing":
            self.status.setText(f"{p.collection}: {p.files_done}/{p.files_total} files, "
                                f"{p.n_indexed} indexed, {p.n_unchanged} unchanged, {p.n_skipped} skipped, "
                                f"{p.n_failed} failed" + (f" — {Path(p.current).name}" if p.current else ""))

    @Slot(object)
    def _on_finished(self, p: IndexProgress) -> None:
        if self._closed:  # a late signal from the run cancelled at shutdown
            return
        self.last_progress = p
        if p.state == "done":
            self.progress_bar.setValue(1000)
        d = p.to_dict()
        problems = f"; {len(p.errors)} problems (see the Note column)" if p.errors else ""
        self.status.setText(f"{p.collection}: {p.state} — {p.n_indexed} indexed, {p.n_unchanged} unchanged, "
                            f"{p.n_skipped} skipped, {p.n_failed} failed, {p.n_removed} removed in "
                            f"{p.elapsed_s:.1f} s ({d['mb_per_s']} MB/s){problems}")
        self._end_run()
        self.indexingFinished.emit(p)

    @Slot(str, str)
    def _on_failed(self, collection: str, message: str) -> None:
        if self._closed:  # a late signal from the run cancelled at shutdown
            return
        self.status.setText(f"{collection}: indexing failed: {message}")
        self._end_run()
        self.indexingFailed.emit(collection, message)

    def _end_run(self) -> None:
        self._running = None
        self._cancel = None
        self.cancel_button.setEnabled(False)
        self._refresh_timer.stop()
        self.refresh()
        self._next()

    # --- views ------------------------------------------------------------------------
    def refresh(self, select: str | None = None) -> None:
        """Re-read collections (keeping or changing the selection) and the files."""
        keep = select or self.current_collection()
        self.collection_list.blockSignals(True)
        self.collection_list.clear()
        infos = self.index.collections()
        for info in infos:
            text = (f"{info.name}\n{info.n_indexed}/{info.n_files} files, {info.n_chunks} chunks"
                    + (f", {info.n_skipped + info.n_failed} problems" if info.n_skipped + info.n_failed else "")
                    + (", hybrid" if info.embedding_model else ""))
            item = QListWidgetItem(text)
            item.setData(Qt.ItemDataRole.UserRole, info.name)
            item.setToolTip("\n".join(info.roots) or "no folders yet")
            self.collection_list.addItem(item)
            if info.name == keep:
                self.collection_list.setCurrentItem(item)
        if self.collection_list.currentItem() is None and self.collection_list.count():
            self.collection_list.setCurrentRow(0)
        self.collection_list.blockSignals(False)
        self.refresh_files()
        self.collectionsChanged.emit([i.name for i in infos])

    def refresh_files(self) -> None:
        name = self.current_collection()
        if name is None:
            self.files_model.set_files([])
            self.summary.setText("No collections yet: “New collection…”, then add a folder.")
            return
        info = self.index.collection_info(name)
        self.files_model.set_files(self.index.files(info.id))
        self.summary.setText(f"{name}: {info.n_files} files — {info.n_indexed} indexed, {info.n_pending} pending, "
                             f"{info.n_skipped} skipped, {info.n_failed} failed; {info.n_chunks} chunks"
                             + (f"; embeddings: {Path(info.embedding_model).name}" if info.embedding_model else ""))

    # --- dialogs --------------------------------------------------------------------------
    def _ask_new_collection(self) -> None:
        name, ok = QInputDialog.getText(self, "New collection", "Name:")
        if ok and name.strip():
            self.create_collection(name.strip())

    def _ask_add_folder(self) -> None:
        name = self.current_collection()
        if name is None:
            return self._ask_new_collection()
        folder = QFileDialog.getExistingDirectory(self, f"Add a folder to {name}")
        if folder:
            self.add_paths(name, [folder])

    def _ask_add_files(self) -> None:
        name = self.current_collection()
        if name is None:
            return self._ask_new_collection()
        files, _ = QFileDialog.getOpenFileNames(self, f"Add files to {name}", "",
                                                "Documents (*.pdf *.docx *.md *.txt *.html *.htm);;All files (*)")
        if files:
            self.add_paths(name, files)

    def _ask_embedding_model(self) -> None:
        name = self.current_collection()
        if name is None:
            return
        path, _ = QFileDialog.getOpenFileName(self, f"Embedding model for {name}", "", "GGUF models (*.gguf)")
        if path:
            self.set_embedding_model(name, path)

    def _ask_remove(self) -> None:
        name = self.current_collection()
        if name is None:
            return
        if QMessageBox.question(self, "Remove collection",
                                f"Remove {name!r} from the index? The files themselves stay.") \
                == QMessageBox.StandardButton.Yes:
            try:
                self.remove_collection(name)
            except FlashDeskError as e:
                self.status.setText(str(e))

    # --- teardown -------------------------------------------------------------------------
    def shutdown(self, timeout_ms: int = 30000) -> None:
        """Cancel, let the worker close its connection and models, join the thread."""
        if self._closed:
            return
        self._closed = True
        self.cancel()
        self._refresh_timer.stop()
        if self.thread.isRunning():
            self._shutdownRequested.emit()
            self.thread.wait(timeout_ms)
        self.index.close()

    def closeEvent(self, event) -> None:  # noqa: ANN001, N802 - Qt API
        self.shutdown()
        super().closeEvent(event)
