"""The conversation sidebar: search, new, rename, delete; a view over ConversationListModel."""

from __future__ import annotations

from PySide6.QtCore import QItemSelectionModel, QModelIndex, Qt, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLineEdit,
    QListView,
    QMenu,
    QMessageBox,
    QVBoxLayout,
    QWidget,
)

from app.ui.compact_button import CompactButton
from app.ui.list_models import ConversationListModel, ConvIdRole


class Sidebar(QWidget):
    conversationSelected = Signal(int)
    newRequested = Signal()
    deleteRequested = Signal(int)

    def __init__(self, model: ConversationListModel, parent: QWidget | None = None):
        super().__init__(parent)
        self.model = model
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats…")
        self.search.setClearButtonEnabled(True)
        lay.addWidget(self.search)
        row = QHBoxLayout()
        self.new_button = CompactButton("New chat")
        self.rename_button = CompactButton("Rename")
        self.delete_button = CompactButton("Delete")
        for b in (self.new_button, self.rename_button, self.delete_button):
            row.addWidget(b)
        lay.addLayout(row)
        self.list = QListView()
        self.list.setModel(model)
        self.list.setEditTriggers(QAbstractItemView.EditTrigger.EditKeyPressed
                                  | QAbstractItemView.EditTrigger.DoubleClicked)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        lay.addWidget(self.list)
        self.confirm_delete = True  # tests turn the dialog off

        self.search.textChanged.connect(self._search)
        self.new_button.clicked.connect(self.newRequested)
        self.rename_button.clicked.connect(self._rename)
        self.delete_button.clicked.connect(self._delete)
        self.list.selectionModel().currentChanged.connect(self._current_changed)
        self.list.customContextMenuRequested.connect(self._menu)
        model.modelReset.connect(self._reconnect)
        self._selected: int | None = None

    def _reconnect(self) -> None:
        if self._selected is not None:
            self.select(self._selected, emit=False)

    def _search(self, text: str) -> None:
        self.model.reload(text)

    def _current_changed(self, cur: QModelIndex, _prev: QModelIndex) -> None:
        if cur.isValid():
            cid = cur.data(ConvIdRole)
            if cid != self._selected:
                self._selected = cid
                self.conversationSelected.emit(cid)

    def select(self, conv_id: int, emit: bool = True) -> None:
        row = self.model.row_of(conv_id)
        self._selected = conv_id
        if row >= 0:
            sm = self.list.selectionModel()
            sm.blockSignals(not emit)
            sm.setCurrentIndex(self.model.index(row), QItemSelectionModel.SelectionFlag.ClearAndSelect)
            sm.blockSignals(False)
        if emit:
            self.conversationSelected.emit(conv_id)

    def clear_search(self) -> None:
        self.search.clear()

    def set_delete_enabled(self, on: bool) -> None:
        """Off while the selected chat is generating a reply."""
        self.delete_button.setEnabled(on)

    def selected_id(self) -> int | None:
        return self._selected

    def _rename(self) -> None:
        idx = self.list.currentIndex()
        if idx.isValid():
            self.list.edit(idx)

    def _delete(self) -> None:
        idx = self.list.currentIndex()
        if not idx.isValid():
            return
        if self.confirm_delete and QMessageBox.question(
                self, "Delete chat", f"Delete “{idx.data()}” and all its messages?") != QMessageBox.StandardButton.Yes:
            return
        self.deleteRequested.emit(idx.data(ConvIdRole))

    def _menu(self, pos) -> None:  # noqa: ANN001
        idx = self.list.indexAt(pos)
        if not idx.isValid():
            return
        self.list.setCurrentIndex(idx)
        menu = QMenu(self)
        ren = QAction("Rename", menu)
        ren.triggered.connect(self._rename)
        dele = QAction("Delete", menu)
        dele.triggered.connect(self._delete)
        menu.addAction(ren)
        menu.addAction(dele)
        menu.exec(self.list.viewport().mapToGlobal(pos))
