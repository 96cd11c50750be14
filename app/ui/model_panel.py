"""Choosing the target, its drafter (the ones found on disk, or any file) and draft model, context length
and device; load/unload with progress; after a load, which draft sources are in use and why."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.errors import FlashDeskError
from app.hub.catalog import CatalogError, load_catalog
from app.hub.local_drafters import ROLE_DRAFT_MODEL, ROLE_MTP, DrafterOption, find_drafters
from app.session.models import DEVICE_CPU, DEVICE_GPU, ModelSpec

_NONE = "none"  # the found-drafters item that clears both fields


class ModelPanel(QWidget):
    loadRequested = Signal(object)  # ModelSpec, or None for the bundled pair
    unloadRequested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        box = QGroupBox("Models")
        form = QFormLayout(box)
        self.target_edit = QLineEdit()
        self.target_edit.setPlaceholderText("target GGUF (Q4_K_M recommended)")
        self.drafter_edit = QLineEdit()
        self.drafter_edit.setPlaceholderText("DFlash drafter GGUF (empty: plain decoding)")
        self.draft_model_edit = QLineEdit()
        self.draft_model_edit.setPlaceholderText("classic draft model GGUF, same vocabulary (empty: none)")
        form.addRow("Target", self._with_browse(self.target_edit, "Choose the target model"))
        # the drafters on disk for this target (its folder, the models folder, the bundled ones), with their
        # format: picking one fills the field it belongs in, no file dialog
        self.found_combo = QComboBox()
        self.found_combo.setObjectName("foundDrafters")
        self.found_combo.activated.connect(self._use_found)
        rescan = QPushButton("↻")
        rescan.setToolTip("Look again for drafters of this target")
        rescan.clicked.connect(lambda: self.scan_drafters())
        found = QWidget()
        h = QHBoxLayout(found)
        h.setContentsMargins(0, 0, 0, 0)
        h.addWidget(self.found_combo, 1)
        h.addWidget(rescan)
        form.addRow("Found", found)
        form.addRow("Drafter", self._with_browse(self.drafter_edit, "Choose the DFlash drafter"))
        form.addRow("Draft model", self._with_browse(self.draft_model_edit, "Choose a classic draft model"))
        # the target's own MTP head (Qwen3.5/3.6 GGUFs carry one): on by default, a switch only where the
        # target in the field has a head the loop drives (the found list's MTP line says so)
        self.mtp_check = QCheckBox("Use the target's MTP head")
        self.mtp_check.setObjectName("useMtp")
        self.mtp_check.setChecked(True)
        form.addRow("", self.mtp_check)
        self.target_edit.editingFinished.connect(self.scan_drafters)
        self.drafter_options: list[DrafterOption] = []
        self._show_options([], "choose a target to find its drafters")
        self.ctx_spin = QSpinBox(minimum=256, maximum=1 << 20, singleStep=1024)
        self.ctx_spin.setValue(4096)
        form.addRow("Context length", self.ctx_spin)
        self.device_combo = QComboBox()
        self.device_combo.addItem("CPU", DEVICE_CPU)
        self.device_combo.addItem("GPU (all layers)", DEVICE_GPU)
        self.set_gpu_available(False)
        form.addRow("Device", self.device_combo)
        lay.addWidget(box)

        row = QHBoxLayout()
        self.load_button = QPushButton("Load")
        self.unload_button = QPushButton("Unload")
        self.bundled_button = QPushButton("Bundled pair")
        self.bundled_button.setToolTip("Gemma 3 270M Q4_K_M with FlashDesk's drafter")
        row.addWidget(self.load_button)
        row.addWidget(self.unload_button)
        row.addWidget(self.bundled_button)
        lay.addLayout(row)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setFormat("%p%")
        self.progress.hide()
        lay.addWidget(self.progress)
        self.status_label = QLabel("no model loaded")
        self.status_label.setWordWrap(True)
        lay.addWidget(self.status_label)
        self.error_label = QLabel()
        self.error_label.setObjectName("modelError")
        self.error_label.setWordWrap(True)
        self.error_label.setStyleSheet("color:#b42318;")
        self.error_label.setTextInteractionFlags(self.error_label.textInteractionFlags()
                                                 | self.error_label.textInteractionFlags().TextSelectableByMouse)
        self.error_label.hide()
        lay.addWidget(self.error_label)
        lay.addStretch(1)

        self.load_button.clicked.connect(lambda: self.loadRequested.emit(self.spec()))
        self.unload_button.clicked.connect(self.unloadRequested)
        self.bundled_button.clicked.connect(lambda: self.loadRequested.emit(None))

    def _with_browse(self, edit: QLineEdit, title: str) -> QWidget:
        w = QWidget()
        h = QHBoxLayout(w)
        h.setContentsMargins(0, 0, 0, 0)
        h.addWidget(edit)
        b = QPushButton("…")
        b.setToolTip(title)
        b.clicked.connect(lambda: self._browse(edit, title))
        h.addWidget(b)
        return w

    def _browse(self, edit: QLineEdit, title: str) -> None:
        start = str(Path(edit.text()).parent) if edit.text() else str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self, title, start, "GGUF models (*.gguf);;All files (*)")
        if path:
            edit.setText(path)

    def spec(self) -> ModelSpec:
        return ModelSpec(self.target_edit.text().strip(), self.drafter_edit.text().strip() or None,
                         self.ctx_spin.value(), self.device_combo.currentData(),
                         draft_model=self.draft_model_edit.text().strip() or None, mtp=self.mtp_check.isChecked())

    def show_spec(self, spec: ModelSpec) -> None:
        self.target_edit.setText(spec.target)
        self.drafter_edit.setText(spec.drafter or "")
        self.draft_model_edit.setText(spec.draft_model or "")
        self.mtp_check.setChecked(spec.mtp)
        self.ctx_spin.setValue(spec.n_ctx)
        i = self.device_combo.findData(spec.device)
        if i >= 0 and self.device_combo.model().item(i).isEnabled():
            self.device_combo.setCurrentIndex(i)
        self.scan_drafters()

    def fill_pair(self, target: str, drafter: str | None) -> None:
        """Put a pair in the fields (the user presses Load to use it)."""
        self.target_edit.setText(target)
        self.drafter_edit.setText(drafter or "")
        self.scan_drafters()

    # --- the drafters found on disk ----------------------------------------------------------------------
    def scan_drafters(self) -> None:
        """List the drafters on disk for the target in the field (header reads: quick)."""
        target = self.target_edit.text().strip()
        if not target:
            self._show_options([], "choose a target to find its drafters")
            return
        try:
            catalog = load_catalog()
        except CatalogError:
            catalog = []
        try:
            options = find_drafters(target, catalog=catalog)
        except (FlashDeskError, OSError) as e:  # an unreadable target: said in the list, nothing offered
            self._show_options([], f"cannot read the target: {e}")
            return
        n = sum(o.usable for o in options)
        self._show_options(options, f"{n} drafter{'s' if n != 1 else ''} found for this target" if options
                           else "no drafter found for this target: plain decoding with the context lookup")

    def _show_options(self, options: list[DrafterOption], headline: str) -> None:
        self.drafter_options = options
        head = next((o for o in options if o.role == ROLE_MTP), None)
        self.mtp_check.setEnabled(head is not None and head.usable)
        self.mtp_check.setToolTip(
            "no MTP head in the chosen target" if head is None
            else f"{head.why}" if head.usable else f"not driven by FlashDesk: {head.why}")
        c = self.found_combo
        c.clear()
        c.addItem(headline, None)
        if options:
            c.addItem("none: plain decoding with the context lookup", _NONE)
        for o in options:
            c.addItem(o.text + (f" · {o.catalog_title}" if o.catalog_title else ""), o)
            item = c.model().item(c.count() - 1)
            item.setToolTip(f"{o.path or 'in the target file'}\n{o.why}")
            item.setEnabled(o.usable and bool(o.path))
        c.setCurrentIndex(0)

    def _use_found(self, index: int) -> None:
        o = self.found_combo.itemData(index)
        if o == _NONE:  # (a str comes back from Qt as a copy)
            self.drafter_edit.setText("")
            self.draft_model_edit.setText("")
        elif isinstance(o, DrafterOption) and o.usable:
            (self.draft_model_edit if o.role == ROLE_DRAFT_MODEL else self.drafter_edit).setText(o.path)

    def show_status(self, text: str) -> None:
        """What is loaded, or what happens next (a split override, a downloaded pair)."""
        self.status_label.setText(text)

    def set_gpu_available(self, on: bool) -> None:
        item = self.device_combo.model().item(1)
        item.setEnabled(on)
        item.setToolTip("" if on else "no GPU found by this build of llama.cpp")
        if not on:
            self.device_combo.setCurrentIndex(0)

    def show_progress(self, stage: str, fraction: float) -> None:
        """fraction < 0: a stage of unknown length (a busy bar)."""
        self.progress.show()
        if fraction < 0:
            self.progress.setRange(0, 0)
            self.progress.setFormat(stage)
            return
        self.progress.setRange(0, 100)
        self.progress.setValue(int(fraction * 100))
        self.progress.setFormat(f"{stage}: %p%")

    def set_busy(self, busy: bool) -> None:
        self.load_button.setEnabled(not busy)
        self.bundled_button.setEnabled(not busy)
        self.unload_button.setEnabled(not busy)
        if not busy:
            self.progress.hide()

    def show_error(self, text: str) -> None:
        self.error_label.setText(text)
        self.error_label.setVisible(bool(text))
