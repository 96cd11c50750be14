"""The message input: Enter sends, Shift+Enter starts a new line."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit


class InputBox(QPlainTextEdit):
    submitted = Signal()

    def __init__(self, parent=None):  # noqa: ANN001
        super().__init__(parent)
        self.setPlaceholderText("Message (Enter sends, Shift+Enter for a new line)")
        self.setMaximumHeight(120)

    def keyPressEvent(self, e: QKeyEvent) -> None:  # noqa: N802
        if e.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
                e.modifiers() & Qt.KeyboardModifier.ShiftModifier):
            self.submitted.emit()
            return
        super().keyPressEvent(e)
