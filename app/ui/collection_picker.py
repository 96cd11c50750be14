"""CollectionPicker: a button next to Send whose menu ticks the document collections
the open chat answers from (the collections of the documents index the
Documents panel keeps). The list is re-read each time the menu opens.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu, QToolButton, QWidget

from app.documents.index import DocumentIndex
from app.errors import FlashDeskError

_LABEL_CHARS = 32


class CollectionPicker(QToolButton):
    collectionsEdited = Signal(list)  # the ticked collection names, after a user tick

    def __init__(self, db_path: Path, parent: QWidget | None = None):
        super().__init__(parent)
        self.db_path = Path(db_path)
        self.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.setToolTip("Answer from documents: tick the collections this chat retrieves from\n"
                        "(build collections in Tools → Documents)")
        self._menu = QMenu(self)
        self._menu.aboutToShow.connect(self.refresh)
        self.setMenu(self._menu)
        self._available: list[str] = []
        self._selected: list[str] = []
        self._problem = ""
        self._rebuild()

    def selected(self) -> list[str]:
        return list(self._selected)

    def set_selected(self, names: list[str]) -> None:
        """Show the open chat's collections (no signal: this is not an edit)."""
        self._selected = list(names)
        self._rebuild()

    def set_available(self, names: list[str]) -> None:
        """The index's collections, as the documents panel reports them."""
        self._available = list(names)
        self._problem = ""
        self._rebuild()

    def refresh(self) -> None:
        """Re-read the collections from the documents index."""
        self._problem = ""
        if not self.db_path.exists():  # nothing indexed yet; opening would create the file
            self._available = []
        else:
            try:
                with DocumentIndex(self.db_path) as index:
                    self._available = index.collection_names()
            except FlashDeskError as e:
                self._available, self._problem = [], str(e)
        self._rebuild()

    def action_for(self, name: str) -> QAction | None:
        return next((a for a in self._menu.actions() if a.isCheckable() and a.data() == name), None)

    def _rebuild(self) -> None:
        for act in self._menu.actions():
            # later, not now: this can run inside an action's own toggled signal
            self._menu.removeAction(act)
            act.deleteLater()
        # a chat may name a collection removed since: listed so it can be unticked
        names = self._available + [n for n in self._selected if n not in self._available]
        for name in names:
            missing = name not in self._available
            act = QAction(name + (" (not in the index)" if missing else ""), self._menu, checkable=True)
            act.setData(name)
            act.setChecked(name in self._selected)
            act.toggled.connect(lambda on, n=name: self._toggled(n, on))
            self._menu.addAction(act)
        if not names:
            empty = self._menu.addAction(self._problem or "No collections yet: Tools → Documents")
            empty.setEnabled(False)
        self._update_label()

    def _update_label(self) -> None:
        label = ", ".join(self._selected)
        if len(label) > _LABEL_CHARS:
            label = label[:_LABEL_CHARS - 1] + "…"
        self.setText(f"Documents: {label or 'none'}")

    def _toggled(self, name: str, on: bool) -> None:
        if on and name not in self._selected:
            self._selected.append(name)
        elif not on and name in self._selected:
            self._selected.remove(name)
        self._update_label()
        self.collectionsEdited.emit(list(self._selected))
