"""Qt list models over the store: the conversation list and the messages of one conversation."""

from __future__ import annotations

from PySide6.QtCore import QAbstractListModel, QModelIndex, QPersistentModelIndex, Qt

from app.store import Conversation, Message, Store

ConvIdRole = Qt.ItemDataRole.UserRole + 1
MessageRole = Qt.ItemDataRole.UserRole + 2
_Index = QModelIndex | QPersistentModelIndex


class ConversationListModel(QAbstractListModel):
    """The sidebar: conversations, most recent first, filtered by a search string."""

    def __init__(self, store: Store, parent=None):  # noqa: ANN001
        super().__init__(parent)
        self._store = store
        self._rows: list[Conversation] = []
        self._search = ""
        self.reload()

    def reload(self, search: str | None = None) -> None:
        if search is not None:
            self._search = search
        self.beginResetModel()
        self._rows = self._store.conversations(self._search)
        self.endResetModel()

    def rowCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008, N802 - Qt's signature
        return 0 if parent.isValid() else len(self._rows)

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> object:
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        c = self._rows[index.row()]
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole):
            return c.title
        if role == Qt.ItemDataRole.ToolTipRole:
            return c.title
        if role == ConvIdRole:
            return c.id
        return None

    def flags(self, index: _Index) -> Qt.ItemFlag:
        return super().flags(index) | Qt.ItemFlag.ItemIsEditable  # rename in place (F2 / double-click)

    def setData(self, index: _Index, value: object, role: int = Qt.ItemDataRole.EditRole) -> bool:  # noqa: N802
        if role != Qt.ItemDataRole.EditRole or not index.isValid():
            return False
        c = self._rows[index.row()]
        self._store.rename_conversation(c.id, str(value))
        self._rows[index.row()] = self._store.conversation(c.id)
        self.dataChanged.emit(index, index)
        return True

    def row_of(self, conv_id: int) -> int:
        return next((i for i, c in enumerate(self._rows) if c.id == conv_id), -1)

    def conversation_at(self, row: int) -> Conversation | None:
        return self._rows[row] if 0 <= row < len(self._rows) else None


class MessageListModel(QAbstractListModel):
    """The messages of the open conversation; streamed replies update their row in place."""

    def __init__(self, store: Store, parent=None):  # noqa: ANN001
        super().__init__(parent)
        self._store = store
        self._rows: list[Message] = []
        self.conversation_id: int | None = None

    def load(self, conv_id: int | None) -> None:
        self.beginResetModel()
        self.conversation_id = conv_id
        self._rows = self._store.messages(conv_id) if conv_id is not None else []
        self.endResetModel()

    def reload(self) -> None:
        self.load(self.conversation_id)

    def rowCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008, N802
        return 0 if parent.isValid() else len(self._rows)

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> object:
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        m = self._rows[index.row()]
        if role == Qt.ItemDataRole.DisplayRole:
            return m.content
        if role == MessageRole:
            return m
        return None

    def message_at(self, row: int) -> Message:
        return self._rows[row]

    def messages(self) -> list[Message]:
        return list(self._rows)

    def apply_update(self, msg_id: int, content: str, status: str, stats: dict | None,
                     drafted_spans: list[list[int]], sources: list[dict] | None = None) -> None:
        """A streamed step of message `msg_id` (appended the first time it is seen);
        `sources`: its document sources, when the step carries them."""
        row = next((i for i, m in enumerate(self._rows) if m.id == msg_id), -1)
        if row < 0:
            msg = self._store.message(msg_id)
            self.beginInsertRows(QModelIndex(), len(self._rows), len(self._rows))
            self._rows.append(msg)
            self.endInsertRows()
            row = len(self._rows) - 1
        m = self._rows[row]
        m.content, m.status, m.stats, m.drafted_spans = content, status, stats, drafted_spans
        if sources is not None:
            m.sources = sources
        idx = self.index(row)
        self.dataChanged.emit(idx, idx)
