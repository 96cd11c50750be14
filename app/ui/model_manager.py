"""The model manager dialog: the catalog, what is installed, downloads with progress and cancel.

The download runs in a worker QObject on its own QThread (app.hub does the
work, Qt-free); progress comes back through queued signals and Cancel sets a
threading.Event the downloader checks after every chunk. A cancelled download
keeps its partial file in the staging folder and resumes on the next click.
"""

from __future__ import annotations

import threading
from pathlib import Path

from PySide6.QtCore import QObject, Qt, QThread, Signal, Slot
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.errors import FlashDeskError
from app.hub.catalog import CatalogEntry, load_catalog
from app.hub.download import DownloadCancelled, Downloader, Progress
from app.hub.install import InstallResult, install_pair, pair_status, unverified_files
from app.hub.vram import estimate_vram

COLUMNS = ("Pair", "Target", "Drafter", "VRAM", "Status")
CONTEXTS = (4096, 8192, 16384, 32768)
# threads still finishing a cancelled download after their dialog closed (kept alive until they end)
_ORPHANS: set[QThread] = set()


class DownloadWorker(QObject):
    """Runs install_pair for one entry in the worker thread."""

    progress = Signal(object)  # app.hub.download.Progress
    finished = Signal(str, object)  # entry id, InstallResult
    failed = Signal(str, str)  # entry id, message
    cancelled = Signal(str)  # entry id
    done = Signal()  # always last

    def __init__(self, entry: CatalogEntry, downloader: Downloader, cancel: threading.Event):
        super().__init__()
        self.entry = entry
        self.downloader = downloader
        self.cancel = cancel

    @Slot()
    def run(self) -> None:
        try:
            res = install_pair(self.entry, self.downloader, progress=self.progress.emit, cancel=self.cancel)
            self.finished.emit(self.entry.id, res)
        except DownloadCancelled:
            self.cancelled.emit(self.entry.id)
        except FlashDeskError as e:
            self.failed.emit(self.entry.id, str(e))
        except Exception as e:  # the dialog must survive anything a download throws
            self.failed.emit(self.entry.id, f"{type(e).__name__}: {e}")
        finally:
            self.done.emit()


class ModelManagerDialog(QDialog):
    """Lists the catalog; downloads (and converts) the selected pair."""

    installed = Signal(str, str, str)  # entry id, target path, drafter path: the window may offer to load it

    def __init__(self, parent: QWidget | None = None, *, catalog_path: str | Path | None = None,
                 downloader: Downloader | None = None, n_ctx: int = 8192):
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.resize(900, 420)
        self.entries = load_catalog(catalog_path)
        self.downloader = downloader or Downloader()
        self._thread: QThread | None = None
        self._worker: DownloadWorker | None = None
        self._cancel: threading.Event | None = None
        self._active: str | None = None

        lay = QVBoxLayout(self)
        top = QHBoxLayout()
        top.addWidget(QLabel(f"Models folder: {self.downloader.models}"))
        top.addStretch(1)
        top.addWidget(QLabel("VRAM at context"))
        self.ctx_combo = QComboBox()
        for c in CONTEXTS:
            self.ctx_combo.addItem(f"{c:,}", c)
        self.ctx_combo.setCurrentIndex(CONTEXTS.index(n_ctx) if n_ctx in CONTEXTS else 1)
        self.ctx_combo.currentIndexChanged.connect(lambda _: self.refresh())
        top.addWidget(self.ctx_combo)
        self.offline_box = QCheckBox("Offline (never use the network)")
        self.offline_box.setChecked(self.downloader.offline)
        self.offline_box.toggled.connect(self._set_offline)
        top.addWidget(self.offline_box)
        lay.addLayout(top)

        self.table = QTableWidget(len(self.entries), len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for col in range(1, len(COLUMNS)):
            self.table.horizontalHeader().setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        self.table.verticalHeader().setVisible(False)
        self.table.itemSelectionChanged.connect(self._selection_changed)
        lay.addWidget(self.table)

        self.description = QLabel()
        self.description.setWordWrap(True)
        lay.addWidget(self.description)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setValue(0)
        lay.addWidget(self.progress)
        self.status = QLabel("Select a pair to download it.")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.status)

        buttons = QHBoxLayout()
        buttons.addStretch(1)
        self.download_button = QPushButton("Download")
        self.download_button.clicked.connect(self.download_selected)
        self.accept_button = QPushButton("Accept unverified...")
        self.accept_button.setToolTip("Move downloaded files that have no published checksum into the models "
                                      "folder, unverified")
        self.accept_button.clicked.connect(self.ask_accept_unverified)
        self.accept_button.setEnabled(False)
        self.confirm: QMessageBox | None = None  # the open "accept unverified?" question, if any
        self.cancel_button = QPushButton("Cancel download")
        self.cancel_button.clicked.connect(self.cancel_download)
        self.cancel_button.setEnabled(False)
        close = QPushButton("Close")
        close.clicked.connect(self.close)
        for b in (self.download_button, self.accept_button, self.cancel_button, close):
            buttons.addWidget(b)
        lay.addLayout(buttons)
        self.refresh()
        if self.entries:
            self.table.selectRow(0)

    # --- the table -----------------------------------------------------------------------------------
    @property
    def n_ctx(self) -> int:
        return int(self.ctx_combo.currentData())

    def refresh(self) -> None:
        """Re-read what is installed and recompute the VRAM column."""
        for row, e in enumerate(self.entries):
            st = pair_status(e, self.downloader)
            est = estimate_vram(e, self.n_ctx, st.target, st.drafter)
            conv = " (safetensors, converted)" if e.drafter.needs_conversion else ""
            state = "downloading..." if e.id == self._active else \
                "unverified: accept or leave" if unverified_files(e, self.downloader) else st.text()
            cells = (e.title, e.target.size_text(), e.drafter.size_text() + conv, est.text(), state)
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if col == 3:
                    how = "from the GGUF headers" if est.source == "scheduler" else "estimated from the catalog"
                    item.setToolTip(f"weights {est.weights / 2**30:.2f} GiB, KV {est.kv / 2**30:.2f} GiB, compute "
                                    f"{est.compute / 2**30:.2f} GiB, drafter {est.drafter / 2**30:.2f} GiB ({how})")
                if col in (1, 2) and "~" in text:
                    item.setToolTip("approximate: not verified offline")
                self.table.setItem(row, col, item)
        self._selection_changed()

    def status_of(self, entry_id: str) -> str:
        row = next(i for i, e in enumerate(self.entries) if e.id == entry_id)
        return self.table.item(row, 4).text()

    def select(self, entry_id: str) -> None:
        self.table.selectRow(next(i for i, e in enumerate(self.entries) if e.id == entry_id))

    def _selected(self) -> CatalogEntry | None:
        rows = self.table.selectionModel().selectedRows()
        return self.entries[rows[0].row()] if rows else None

    def _selection_changed(self) -> None:
        e = self._selected()
        busy = self._active is not None
        self.download_button.setEnabled(e is not None and not busy)
        self.accept_button.setEnabled(e is not None and not busy and bool(unverified_files(e, self.downloader)))
        if e is not None:
            notes = "".join(f" Unverified {k}: {v}." for k, v in e.notes.items())
            drafters = "".join(f"\n· {line}" for line in e.drafter_lines())
            self.description.setText(e.description + notes + "\nDrafters for this target:" + drafters)

    def _set_offline(self, on: bool) -> None:
        self.downloader.offline = on

    # --- downloading ---------------------------------------------------------------------------------
    def download_selected(self) -> None:
        e = self._selected()
        if e is None or self._active is not None:
            return
        self._active = e.id
        self._cancel = threading.Event()
        self._thread = QThread(self)
        self._worker = DownloadWorker(e, self.downloader, self._cancel)
        self._worker.moveToThread(self._thread)
        self._thread.started.connect(self._worker.run)
        self._worker.progress.connect(self._on_progress)
        self._worker.finished.connect(self._on_finished)
        self._worker.failed.connect(self._on_failed)
        self._worker.cancelled.connect(self._on_cancelled)
        # direct: QThread.quit is thread-safe, and closeEvent may be blocking the GUI thread in wait()
        self._worker.done.connect(self._thread.quit, Qt.ConnectionType.DirectConnection)
        self._thread.finished.connect(self._on_thread_done)
        self.progress.setValue(0)
        self.status.setText(f"Starting {e.title}...")
        self.cancel_button.setEnabled(True)
        self.refresh()
        self._thread.start()

    def cancel_download(self) -> None:
        if self._cancel is not None:
            self._cancel.set()
            self.status.setText("Cancelling...")

    def ask_accept_unverified(self) -> None:
        """Ask before files with no checksum go into the models folder (a window-modal question, not a
        nested event loop: the dialog stays responsive)."""
        e = self._selected()
        files = unverified_files(e, self.downloader) if e is not None else []
        if not files or self._active is not None:
            return
        listing = "\n".join(f"{repo}/{name}" for repo, name, _ in files)
        self.confirm = QMessageBox(
            QMessageBox.Icon.Warning, "Accept unverified files?",
            f"Neither the catalog nor the hub gives a checksum for:\n\n{listing}\n\nSo nothing shows these bytes "
            f"are the published files. Move them into the models folder anyway?",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, self)
        self.confirm.setDefaultButton(QMessageBox.StandardButton.No)
        self.confirm.buttonClicked.connect(lambda b, entry=e: self._confirmed(entry, files, b))
        self.confirm.open()

    def _confirmed(self, entry: CatalogEntry, files: list, button) -> None:  # noqa: ANN001 - a QAbstractButton
        if self.confirm is None or button is not self.confirm.button(QMessageBox.StandardButton.Yes):
            self.status.setText("Left unverified: the files stay outside the models folder.")
            return
        for repo, name, _ in files:
            self.downloader.accept(repo, name)
        self.select(entry.id)
        self.download_selected()  # the accepted files move in; the rest of the pair downloads as usual

    @property
    def busy(self) -> bool:
        return self._active is not None

    @Slot(object)
    def _on_progress(self, p: Progress) -> None:
        if p.stage == "convert":
            self.progress.setRange(0, 0)  # a busy bar: conversion has no byte count
        else:
            self.progress.setRange(0, 1000)
            if p.fraction is not None:
                self.progress.setValue(int(1000 * p.fraction))
        verb = {"download": "Downloading", "verify": "Verifying sha256 of", "convert": "Converting",
                "done": "Finished"}.get(p.stage, p.stage)
        amount = f" ({p.done / 1e6:,.1f} of {p.total / 1e6:,.1f} MB)" if p.total else ""
        self.status.setText(f"{verb} {p.file}{amount}")

    @Slot(str, object)
    def _on_finished(self, entry_id: str, res: InstallResult) -> None:
        self.progress.setRange(0, 1000)
        self.progress.setValue(1000)
        if res.report.ok:
            self.status.setText(f"Installed: {res.target.name} + {res.drafter.name} (pair check passed)")
        else:
            self.status.setText("Installed, but the pair check failed: " + "; ".join(res.report.problems))
        self._active = None
        self.refresh()
        self.installed.emit(entry_id, str(res.target), str(res.drafter))

    @Slot(str, str)
    def _on_failed(self, entry_id: str, message: str) -> None:
        self.progress.setRange(0, 1000)
        self.status.setText(f"Download failed: {message}")
        self._active = None
        self.refresh()

    @Slot(str)
    def _on_cancelled(self, entry_id: str) -> None:
        self.progress.setRange(0, 1000)
        self.status.setText("Cancelled. The partial download is kept and resumes next time.")
        self._active = None
        self.refresh()

    @Slot()
    def _on_thread_done(self) -> None:
        self.cancel_button.setEnabled(False)
        if self._worker is not None:
            self._worker.deleteLater()
        self._worker = None
        self._thread = None
        self._selection_changed()

    def closeEvent(self, event) -> None:  # noqa: ANN001, N802 - Qt override
        """Closing cancels a running download and waits for its thread."""
        if self._cancel is not None:
            self._cancel.set()
        if self._thread is not None and not self._thread.wait(5_000):
            # still inside a network read: let it finish on its own rather than destroy a running thread
            th = self._thread
            th.setParent(None)
            _ORPHANS.add(th)
            th.finished.connect(lambda: _ORPHANS.discard(th))
        super().closeEvent(event)
