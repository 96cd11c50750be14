"""SourcesList: the document sources of an answer, "[n] file, page p" rows; clicking
one (or Enter) opens the file at that page (PDF) or line (text and code).

Used under each chat reply that answered from documents. The opener is
app.documents.open_at.open_at unless one is given.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QAbstractItemView, QFrame, QListWidget, QListWidgetItem, QWidget

import app.documents.open_at
from app.errors import FlashDeskError

Opener = Callable[[str, int | None, int | None], object]  # (file, page, line)
_REPEAT_S = 1.0  # a double click reports a click and an activation: one open, not two


def source_text(s: dict) -> str:
    """A source's row: "[n] name, page p" or "[n] name, lines a-b"."""
    if s.get("page") is not None:
        where = f"page {s['page']}"
    elif s.get("line_start") == s.get("line_end"):
        where = f"line {s.get('line_start')}"
    else:
        where = f"lines {s.get('line_start')}-{s.get('line_end')}"
    return f"[{s.get('n')}] {s.get('name')}, {where}"


class SourcesList(QListWidget):
    openFailed = Signal(str)
    opened = Signal(dict)  # the source just opened

    def __init__(self, parent: QWidget | None = None, opener: Opener | None = None, open_on_click: bool = False):
        super().__init__(parent)
        # looked up per list, not bound at import: the window tests replace app.documents.open_at.open_at
        self._opener = opener or app.documents.open_at.open_at
        self._last: tuple[int, float] = (-1, 0.0)
        self.sources: list[dict] = []
        self.itemActivated.connect(self._open)
        if open_on_click:  # in a chat a source reads as a link: one click opens it
            self.itemClicked.connect(self._open)
            self.setCursor(Qt.CursorShape.PointingHandCursor)
            self.setStyleSheet("QListWidget { color: #1a5fb4; background: transparent; }")

    def set_sources(self, sources: list) -> None:
        """`sources`: app.documents.answer.Source objects (or their to_dict() forms)."""
        self.clear()
        self.sources = [s if isinstance(s, dict) else s.to_dict() for s in sources]
        for s in self.sources:
            item = QListWidgetItem(source_text(s))
            tip = [s.get("file", ""), s.get("heading") or "", f"score {float(s.get('score') or 0):.4f}"]
            if s.get("cited"):
                tip.append("cited in the answer")
            item.setToolTip("\n".join(t for t in tip if t))
            self.addItem(item)

    def fit_to_rows(self) -> None:
        """As tall as its rows, no scroll bars (for a list inside a scrolled transcript)."""
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.setFrameShape(QFrame.Shape.NoFrame)
        rows = sum(max(self.sizeHintForRow(i), 1) for i in range(self.count()))
        self.setFixedHeight(rows + 2 * self.frameWidth() + 2)

    def _open(self, item: QListWidgetItem) -> None:
        row = self.row(item)
        now = time.monotonic()
        if self._last[0] == row and now - self._last[1] < _REPEAT_S:
            return
        self._last = (row, now)
        s = self.sources[row]
        page = s.get("page")
        try:
            self._opener(s["file"], page, None if page is not None else s.get("line_start"))
        except FlashDeskError as e:
            self.openFailed.emit(str(e))
            return
        self.opened.emit(dict(s))
