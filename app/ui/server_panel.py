"""The Server panel: the OpenAI-compatible local server on the model the app has loaded.

On/off, the port, an optional API key, the URL to copy, and a live log of the requests (time,
tokens, tok/s, tau). The panel only starts and stops the server (app.server) and shows its log;
generations run in the app's engine worker, through the EngineExecutor it is given. The app's
server binds the loopback address only.
"""

from __future__ import annotations

import time

from PySide6.QtCore import Signal, Slot
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.errors import FlashDeskError
from app.server.config import DEFAULT_HOST, DEFAULT_PORT, ServerConfig
from app.server.service import EngineExecutor, GenerationService, RequestRecord

COLUMNS = ["Time", "Request", "Tokens", "tok/s", "τ", "Result"]
MAX_ROWS = 200


class ServerPanel(QWidget):
    recordAdded = Signal(object)  # a RequestRecord, emitted in the engine's thread, shown in the UI's

    def __init__(self, executor: EngineExecutor, parent: QWidget | None = None):
        super().__init__(parent)
        self.executor = executor  # where the server's generations run (the app's engine worker)
        self._server = None  # app.server.runner.BackgroundServer while serving
        self.enabled = QCheckBox("Serve the loaded model")
        self.port = QSpinBox()
        self.port.setRange(0, 65535)
        self.port.setSpecialValueText("any free port")  # 0
        self.port.setValue(DEFAULT_PORT)
        self.key = QLineEdit()
        self.key.setPlaceholderText("none: only programs on this computer can connect anyway")
        self.url = QLineEdit()
        self.url.setReadOnly(True)
        self.url.setPlaceholderText("off")
        self.copy_button = QPushButton("Copy")
        self.copy_button.setEnabled(False)
        self.status = QLabel("Off.")
        self.status.setWordWrap(True)
        self.log = QTableWidget(0, len(COLUMNS))
        self.log.setHorizontalHeaderLabels(COLUMNS)
        self.log.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.log.verticalHeader().setVisible(False)
        self.log.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.log.horizontalHeader().setStretchLastSection(True)

        form = QFormLayout()
        form.addRow(self.enabled)
        form.addRow("Port", self.port)
        form.addRow("API key", self.key)
        url_row = QHBoxLayout()
        url_row.addWidget(self.url, 1)
        url_row.addWidget(self.copy_button)
        form.addRow("URL", url_row)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.status)
        layout.addWidget(QLabel("Requests"))
        layout.addWidget(self.log, 1)

        self.enabled.toggled.connect(self.set_serving)
        self.copy_button.clicked.connect(self.copy_url)
        self.recordAdded.connect(self.add_record)

    @property
    def serving(self) -> bool:
        return self._server is not None

    @property
    def service(self) -> GenerationService | None:
        """The running server's service (its queue and log), None while off."""
        return self._server.service if self._server is not None else None

    @property
    def base_url(self) -> str:
        """What an OpenAI client takes as base_url ("" while off)."""
        return self.url.text()

    @Slot(bool)
    def set_serving(self, on: bool) -> None:
        if on and self._server is None:
            self._start()
        elif not on and self._server is not None:
            self._stop()
        self._show_state()

    def _start(self) -> None:
        from app.server.runner import BackgroundServer  # noqa: PLC0415 - FastAPI loads when first served, not with the window

        config = ServerConfig(host=DEFAULT_HOST, port=self.port.value(), api_key=self.key.text().strip() or None)
        try:
            server = BackgroundServer(self.executor, config)
        except FlashDeskError as e:  # the port is taken, ...
            self.status.setText(f"Not serving: {e}")
            self.enabled.blockSignals(True)
            self.enabled.setChecked(False)
            self.enabled.blockSignals(False)
            return
        server.service.add_listener(lambda record: self._from_engine(server, record))
        self._server = server
        # the model is whichever the app has loaded at each request (none: 503), so the text names none
        self.status.setText(f"Serving the model the app has loaded{', API key required' if config.api_key else ''}.")

    def _stop(self) -> None:
        server, self._server = self._server, None
        server.stop()
        self.status.setText("Off.")

    def _from_engine(self, server: object, record: RequestRecord) -> None:
        """In the engine's thread: records of a server this panel has stopped are dropped."""
        if server is self._server:
            self.recordAdded.emit(record)

    def _show_state(self) -> None:
        on = self._server is not None
        self.url.setText(f"{self._server.url}/v1" if on else "")
        self.copy_button.setEnabled(on)
        self.port.setEnabled(not on)
        self.key.setEnabled(not on)

    @Slot()
    def copy_url(self) -> None:
        QGuiApplication.clipboard().setText(self.url.text())

    @Slot(object)
    def add_record(self, r: RequestRecord) -> None:
        if self.log.rowCount() >= MAX_ROWS:
            self.log.removeRow(0)
        row = self.log.rowCount()
        self.log.insertRow(row)
        ok = not r.error and r.completion_tokens > 0
        cells = [time.strftime("%H:%M:%S", time.localtime(r.submitted_at)),
                 f"{r.kind}{' (stream)' if r.stream else ''}",
                 f"{r.prompt_tokens} + {r.completion_tokens}" if ok else "",
                 f"{r.tokens_per_s:.1f}" if ok else "",
                 f"{r.tau:.2f}" if ok else "",
                 r.error or r.finish_reason]
        for col, text in enumerate(cells):
            self.log.setItem(row, col, QTableWidgetItem(text))
        self.log.scrollToBottom()

    def shutdown(self) -> None:
        """Stop serving (the window is closing): what is queued fails, what runs is cancelled."""
        if self._server is not None:
            self._stop()
