"""The chat transcript: one MessageWidget per row of a MessageListModel.

Rendering Markdown is the costly part of streaming, so each widget renders
at most every RENDER_INTERVAL_MS however fast steps arrive; the worker
thread never waits for the UI.
"""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.session.summary import ReplySummary
from app.store import Message
from app.store.records import STATUS_ERROR, STATUS_INTERRUPTED, STATUS_STOPPED, STATUS_STREAMING
from app.ui.list_models import MessageListModel
from app.ui.markdown_view import COPY_SCHEME, RenderedText, render_drafted, render_markdown
from app.ui.sources_list import Opener, SourcesList

RENDER_INTERVAL_MS = 100  # 10 renders a second read as smooth; each costs a Markdown parse and a relayout
_STATUS_NOTE = {STATUS_STREAMING: "streaming…", STATUS_STOPPED: "stopped", STATUS_INTERRUPTED:
                "interrupted (the app closed while this streamed; the text is kept)", STATUS_ERROR: "failed"}


def sources_note(msg: Message) -> str:
    """What the line above a reply's sources says ("" for a reply not answered from documents)."""
    retrieval = (msg.stats or {}).get("retrieval")
    if msg.sources:
        return "Sources (click to open):"
    if retrieval is None:
        return ""
    notes = "; ".join(retrieval.get("notes") or [])
    return "No passage of " + ", ".join(retrieval.get("collections") or []) + " matched this question" + (
        f" ({notes})" if notes else "")


def message_stats_line(record: dict | None) -> str:
    """The one-line stats shown under a reply."""
    if not record or "summary" not in record:
        return ""
    s = ReplySummary.from_dict(record["summary"])
    parts = [f"{s.n_generated} tokens", f"{s.tokens_per_s:.1f} tok/s", f"τ {s.tau:.2f}"]
    if s.speedup is not None:
        parts.append(f"{s.speedup:.2f}× vs measured plain")
    if s.drafted:
        parts.append(f"{s.accepted}/{s.drafted} drafts accepted")
    used = {"lookup": "lookup", "dflash": "DFlash", "draft-model": "draft model", "mtp": "MTP head",
            "eagle3": "EAGLE-3"}
    if s.sources_used:
        parts.append("drafted by " + " + ".join(used.get(x, x) for x in s.sources_used))
    return " · ".join(parts)


class _AutoHeightBrowser(QTextBrowser):
    """A QTextBrowser as tall as its document (the scroll area does the scrolling)."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setOpenLinks(False)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.document().documentLayout().documentSizeChanged.connect(self._fit)

    def _fit(self) -> None:
        h = int(self.document().size().height()) + 6
        if self.height() != h:
            self.setFixedHeight(h)

    def resizeEvent(self, e) -> None:  # noqa: N802, ANN001
        super().resizeEvent(e)
        self._fit()


class MessageWidget(QFrame):
    """One message: header, rendered text, per-message stats, and its actions."""

    editSubmitted = Signal(int, str)  # message id, new text (edit-and-resend)
    regenerateRequested = Signal()
    statsRequested = Signal(int)  # message id: show its stats in the panel
    openFailed = Signal(str)  # a source file could not be opened: why

    def __init__(self, msg: Message, parent: QWidget | None = None, opener: Opener | None = None):
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setObjectName(f"message-{msg.id}")
        self.msg = msg
        self._opener = opener
        self._shown_sources: list[dict] | None = None
        self.sources_view: SourcesList | None = None  # made for replies that answered from documents
        self.colour_drafts = False
        self._rendered = RenderedText("")
        self._dirty = False
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(RENDER_INTERVAL_MS)
        self._timer.timeout.connect(self._render)

        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 6, 8, 6)
        head = QHBoxLayout()
        self.role_label = QLabel()
        self.status_label = QLabel()
        self.status_label.setStyleSheet("color:#8a6d00;")
        head.addWidget(self.role_label)
        head.addWidget(self.status_label)
        head.addStretch(1)
        self.copy_button = QPushButton("Copy")
        self.edit_button = QPushButton("Edit")
        self.regenerate_button = QPushButton("Regenerate")
        for b in (self.copy_button, self.edit_button, self.regenerate_button):
            b.setFlat(True)
            b.setCursor(Qt.CursorShape.PointingHandCursor)
            head.addWidget(b)
        lay.addLayout(head)

        self.body = _AutoHeightBrowser()
        self.body.anchorClicked.connect(self._anchor)
        lay.addWidget(self.body)
        self.editor = QPlainTextEdit()
        self.editor.hide()
        lay.addWidget(self.editor)
        edit_row = QHBoxLayout()
        self.save_button = QPushButton("Save && resend")
        self.cancel_button = QPushButton("Cancel")
        edit_row.addStretch(1)
        edit_row.addWidget(self.save_button)
        edit_row.addWidget(self.cancel_button)
        self._edit_row = QWidget()
        self._edit_row.setLayout(edit_row)
        self._edit_row.hide()
        lay.addWidget(self._edit_row)
        self.sources_label = QLabel()
        self.sources_label.setStyleSheet("color:#6a717a; font-size:11px;")
        self.sources_label.setWordWrap(True)
        self.sources_label.hide()
        lay.addWidget(self.sources_label)
        self._sources_at = lay.count()  # where the list goes once there are sources
        self.stats_label = QLabel()
        self.stats_label.setStyleSheet("color:#6a717a; font-size:11px;")
        self.stats_label.setCursor(Qt.CursorShape.PointingHandCursor)
        self.stats_label.mousePressEvent = lambda _e: self.statsRequested.emit(self.msg.id)
        lay.addWidget(self.stats_label)

        self.copy_button.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.msg.content))
        self.edit_button.clicked.connect(self.start_edit)
        self.save_button.clicked.connect(self._submit_edit)
        self.cancel_button.clicked.connect(self._end_edit)
        self.regenerate_button.clicked.connect(self.regenerateRequested)
        self.set_message(msg, immediate=True)

    def set_message(self, msg: Message, immediate: bool = False) -> None:
        self.msg = msg
        user = msg.role == "user"
        note = _STATUS_NOTE.get(msg.status, "")
        if msg.status == STATUS_ERROR and msg.error:
            note = f"failed: {msg.error}"
        elif msg.status == STATUS_INTERRUPTED and msg.error:  # cut off by a crash or a failed write
            note = f"interrupted: {msg.error}; the text is kept"
        # only what changed: this runs at every streamed step, and each label change relayouts
        for label, text in ((self.role_label, "<b>You</b>" if user else
                             f"<b>Assistant</b> <span style='color:#8a9099;'>{msg.model}</span>"),
                            (self.status_label, note), (self.stats_label, message_stats_line(msg.stats))):
            if label.text() != text:
                label.setText(text)
        if immediate or not self._timer.isActive():  # the tooltip is only read on hover: no need every step
            self.stats_label.setToolTip(_stats_tooltip(msg.stats))
        self.edit_button.setVisible(user)
        self.stats_label.setVisible(not user)
        self._show_sources(msg)
        self._dirty = True
        if immediate:
            self._render()
        elif not self._timer.isActive():
            self._timer.start()

    def _show_sources(self, msg: Message) -> None:
        # only when they change: this runs at every streamed step, and they are set once per reply
        note = sources_note(msg)
        if self.sources_label.text() != note:
            self.sources_label.setText(note)
            self.sources_label.setVisible(bool(note))
        if msg.sources == self._shown_sources:
            return
        self._shown_sources = [dict(s) for s in msg.sources]
        if self.sources_view is None and msg.sources:
            self.sources_view = SourcesList(opener=self._opener, open_on_click=True)
            self.sources_view.setObjectName("sources")
            self.sources_view.openFailed.connect(self.openFailed)
            self.layout().insertWidget(self._sources_at, self.sources_view)
        if self.sources_view is not None:
            self.sources_view.set_sources(msg.sources)
            self.sources_view.fit_to_rows()
            self.sources_view.setVisible(bool(msg.sources))

    def set_regenerate_visible(self, on: bool) -> None:
        self.regenerate_button.setVisible(on)

    def set_colour_drafts(self, on: bool) -> None:
        if on != self.colour_drafts:
            self.colour_drafts = on
            self._dirty = True
            self._render()

    def flush(self) -> None:
        """Render now if a render is pending (tests and the final step)."""
        if self._dirty:
            self._timer.stop()
            self._render()

    def _render(self) -> None:
        self._dirty = False
        m = self.msg
        if m.role == "assistant" and self.colour_drafts:
            self._rendered = render_drafted(m.content, m.drafted_spans)
        elif m.role == "user":
            self._rendered = render_drafted(m.content, [])  # the user's text shown as typed
        else:
            self._rendered = render_markdown(m.content)
        self.body.setHtml(self._rendered.html)

    def plain_text(self) -> str:
        return self.body.toPlainText()

    def _anchor(self, url: QUrl) -> None:
        if url.scheme() == COPY_SCHEME:
            try:
                QGuiApplication.clipboard().setText(self._rendered.code_blocks[int(url.path())])
            except (ValueError, IndexError):
                pass

    def start_edit(self) -> None:
        self.editor.setPlainText(self.msg.content)
        self.body.hide()
        self.editor.show()
        self._edit_row.show()
        self.editor.setFocus()

    def _submit_edit(self) -> None:
        text = self.editor.toPlainText()
        if text.strip():
            self._end_edit()
            self.editSubmitted.emit(self.msg.id, text)

    def _end_edit(self) -> None:
        self.editor.hide()
        self._edit_row.hide()
        self.body.show()


def _stats_tooltip(record: dict | None) -> str:
    if not record or "summary" not in record:
        return ""
    s = ReplySummary.from_dict(record["summary"])
    rates = ", ".join(f"{r:.0%}" for r, d in zip(s.acceptance_by_pos, s.drafts_by_pos, strict=False) if d)
    return (f"τ {s.tau:.2f} (running {s.tau_running:.2f})\n{s.tokens_per_s:.1f} tok/s\n"
            f"draft {s.t_draft_s * 1000:.0f} ms · verify {s.t_verify_s * 1000:.0f} ms · "
            f"inject {s.t_inject_s * 1000:.0f} ms · other {s.t_other_s * 1000:.0f} ms\n"
            f"acceptance by position: {rates or '–'}\nclick to show in the stats panel")


class ChatView(QScrollArea):
    """Binds to a MessageListModel: rebuilds on reset, appends on insert, updates on change."""

    editSubmitted = Signal(int, str)
    regenerateRequested = Signal()
    statsRequested = Signal(int)
    openFailed = Signal(str)  # a reply's source file could not be opened: why

    def __init__(self, model: MessageListModel, parent: QWidget | None = None, opener: Opener | None = None):
        super().__init__(parent)
        self.setWidgetResizable(True)
        self._model = model
        self._opener = opener  # opens a source at its page or line (default: app.documents.open_at)
        self._inner = QWidget()
        self._layout = QVBoxLayout(self._inner)
        self._layout.addStretch(1)
        self.setWidget(self._inner)
        self.widgets: list[MessageWidget] = []
        self.colour_drafts = False
        self._stick_to_bottom = True
        self.verticalScrollBar().rangeChanged.connect(self._range_changed)
        self.verticalScrollBar().valueChanged.connect(self._scrolled)
        model.modelReset.connect(self._rebuild)
        model.rowsInserted.connect(self._inserted)
        model.dataChanged.connect(self._changed)
        self._rebuild()

    def _make(self, msg: Message) -> MessageWidget:
        w = MessageWidget(msg, opener=self._opener)
        w.set_colour_drafts(self.colour_drafts)
        w.openFailed.connect(self.openFailed)
        w.editSubmitted.connect(self.editSubmitted)
        w.regenerateRequested.connect(self.regenerateRequested)
        w.statsRequested.connect(self.statsRequested)
        return w

    def _rebuild(self) -> None:
        for w in self.widgets:
            self._layout.removeWidget(w)
            # hidden and unparented now: deleteLater waits for the main loop, and until then the old
            # widget would still paint under the new one
            w.hide()
            w.setParent(None)
            w.deleteLater()
        self.widgets = []
        for m in self._model.messages():
            w = self._make(m)
            self._layout.insertWidget(self._layout.count() - 1, w)
            self.widgets.append(w)
        self._stick_to_bottom = True
        self._update_regenerate()

    def _inserted(self, _parent: QModelIndex, first: int, last: int) -> None:
        for row in range(first, last + 1):
            w = self._make(self._model.message_at(row))
            self._layout.insertWidget(row, w)
            self.widgets.insert(row, w)
        self._update_regenerate()

    def _changed(self, top: QModelIndex, bottom: QModelIndex) -> None:
        for row in range(top.row(), bottom.row() + 1):
            if 0 <= row < len(self.widgets):
                msg = self._model.message_at(row)
                self.widgets[row].set_message(msg, immediate=msg.status != STATUS_STREAMING)

    def _update_regenerate(self) -> None:
        last_assistant = max((i for i, w in enumerate(self.widgets) if w.msg.role == "assistant"), default=-1)
        for i, w in enumerate(self.widgets):
            w.set_regenerate_visible(i == last_assistant)

    def set_colour_drafts(self, on: bool) -> None:
        self.colour_drafts = on
        for w in self.widgets:
            w.set_colour_drafts(on)

    def flush(self) -> None:
        for w in self.widgets:
            w.flush()

    def _scrolled(self, value: int) -> None:
        self._stick_to_bottom = value >= self.verticalScrollBar().maximum() - 4

    def _range_changed(self, _lo: int, hi: int) -> None:
        if self._stick_to_bottom:  # follow the stream unless the user scrolled up to read
            self.verticalScrollBar().setValue(hi)
