"""Choosing the target and drafter GGUF files, context length and device; load/unload with progress."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
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

from app.session.models import DEVICE_CPU, DEVICE_GPU, ModelSpec


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
        form.addRow("Target", self._with_browse(self.target_edit, "Choose the target model"))
        form.addRow("Drafter", self._with_browse(self.drafter_edit, "Choose the DFlash drafter"))
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
                         self.ctx_spin.value(), self.device_combo.currentData())

    def show_spec(self, spec: ModelSpec) -> None:
        self.target_edit.setText(spec.target)
        self.drafter_edit.setText(spec.drafter or "")
        self.ctx_spin.setValue(spec.n_ctx)
        i = self.device_combo.findData(spec.device)
        if i >= 0 and self.device_combo.model().item(i).isEnabled():
            self.device_combo.setCurrentIndex(i)

    def fill_pair(self, target: str, drafter: str | None) -> None:
        """Put a pair in the fields (the user presses Load to use it)."""
        self.target_edit.setText(target)
        self.drafter_edit.setText(drafter or "")

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
