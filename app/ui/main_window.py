"""The main window: sidebar | chat | stats/settings/model tabs, wired to the engine worker.

Conversation edits (send, regenerate, edit) go to the store here through the
Qt-free app.session.conversation_ops; replies are produced in the worker
thread, which writes them to the store and sends snapshots back.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

from PySide6.QtCore import QByteArray, Qt, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QDockWidget,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QPushButton,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app.documents.index import default_db_path
from app.errors import FlashDeskError
from app.session.chat_session import ReplyUpdate
from app.session.conversation_ops import edit_user_message, prepare_regenerate, send_user_message
from app.session.models import ModelSpec
from app.session.settings import ChatSettings
from app.store import Store
from app.ui.chat_view import ChatView
from app.ui.collection_picker import CollectionPicker
from app.ui.input_box import InputBox
from app.ui.list_models import ConversationListModel, MessageListModel
from app.ui.model_panel import ModelPanel
from app.ui.settings_panel import SettingsPanel
from app.ui.sidebar import Sidebar
from app.ui.stats_panel import StatsPanel
from app.ui.worker import EngineController, ModelInfo

# (module, class, menu text, how it opens): other issues' panels, shown only once their module exists
TOOL_HOOKS = [
    ("app.ui.model_manager", "ModelManagerDialog", "Model manager…", "dialog"),
    ("app.ui.plan_view", "PlanView", "GPU split plan", "dock"),
    ("app.ui.documents_panel", "DocumentsPanel", "Documents", "dock"),
]

STATS_INTERVAL_MS = 100

# settings keys
K_GENERATION, K_MODEL, K_LAST_CONV = "generation", "model", "last_conversation"
K_GEOMETRY, K_SPLITTER, K_DRAFT_INPUT, K_COLOUR = "window_geometry", "splitter_state", "input_draft", "colour_drafts"


class MainWindow(QMainWindow):
    def __init__(self, db_path: str | Path, model: ModelSpec | None = None, autoload: bool = True,
                 documents_db: str | Path | None = None):
        super().__init__()
        self.setWindowTitle("FlashDesk")
        self.store = Store(db_path)
        self.store.recover_interrupted()
        # one documents index for the Documents panel, the chat's collection picker and retrieval
        self.documents_db = Path(documents_db) if documents_db else default_db_path()
        self.controller = EngineController(self.store.path, self, documents_db=self.documents_db)
        self.global_settings = ChatSettings.from_dict(self.store.get_setting(K_GENERATION))
        self.current_conv: int | None = None
        self.busy_conv: int | None = None
        self.model_info: ModelInfo | None = None
        self.loading = False
        self._closed = False
        self._pending_stats: ReplyUpdate | None = None
        self._stats_timer = QTimer(self)
        self._stats_timer.setSingleShot(True)
        self._stats_timer.setInterval(STATS_INTERVAL_MS)
        self._stats_timer.timeout.connect(self._flush_stats)
        self._build()
        self._wire()
        self._restore()
        self.controller.probe_devices()
        if autoload:
            saved = self.store.get_setting(K_MODEL)
            spec = model or (ModelSpec.from_dict(saved) if isinstance(saved, dict) and saved.get("target") else None)
            self.load_model(spec)

    # --- layout ---------------------------------------------------------------
    def _build(self) -> None:
        self.conv_model = ConversationListModel(self.store, self)
        self.msg_model = MessageListModel(self.store, self)
        self.sidebar = Sidebar(self.conv_model)

        center = QWidget()
        cl = QVBoxLayout(center)
        cl.setContentsMargins(4, 4, 4, 4)
        self.banner = QLabel()
        self.banner.setObjectName("errorBanner")
        self.banner.setWordWrap(True)
        self.banner.setStyleSheet("background:#fdecea; color:#8a1c12; padding:6px; border-radius:4px;")
        self.banner.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.banner.hide()
        cl.addWidget(self.banner)
        self.chat_view = ChatView(self.msg_model)
        cl.addWidget(self.chat_view, 1)
        self.input = InputBox()
        cl.addWidget(self.input)
        row = QHBoxLayout()
        self.model_status = QLabel("no model loaded")
        self.model_status.setStyleSheet("color:#6a717a;")
        row.addWidget(self.model_status, 1)
        self.collection_picker = CollectionPicker(self.documents_db)
        row.addWidget(self.collection_picker)
        self.regenerate_button = QPushButton("Regenerate")
        self.stop_button = QPushButton("Stop")
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        for b in (self.regenerate_button, self.stop_button, self.send_button):
            row.addWidget(b)
        cl.addLayout(row)

        self.stats_panel = StatsPanel()
        self.settings_panel = SettingsPanel()
        self.model_panel = ModelPanel()
        self.tabs = QTabWidget()
        self.tabs.addTab(self.stats_panel, "Stats")
        self.tabs.addTab(self.settings_panel, "Settings")
        self.tabs.addTab(self.model_panel, "Model")

        self.splitter = QSplitter()
        self.splitter.addWidget(self.sidebar)
        self.splitter.addWidget(center)
        self.splitter.addWidget(self.tabs)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([220, 640, 340])
        self.setCentralWidget(self.splitter)
        self.resize(1280, 800)
        self._build_menus()
        self._set_busy(None)

    def _build_menus(self) -> None:
        fm = self.menuBar().addMenu("&File")
        new = QAction("&New chat", self, shortcut=QKeySequence.StandardKey.New)
        new.triggered.connect(self.new_conversation)
        fm.addAction(new)
        quit_ = QAction("&Quit", self, shortcut=QKeySequence.StandardKey.Quit)
        quit_.triggered.connect(self.close)
        fm.addAction(quit_)
        vm = self.menuBar().addMenu("&View")
        self.colour_action = QAction("&Colour tokens from accepted drafts", self, checkable=True)
        self.colour_action.toggled.connect(self._colour_drafts)
        vm.addAction(self.colour_action)
        self.tools_menu = self.menuBar().addMenu("&Tools")
        self._docks: dict[str, QDockWidget] = {}
        self._split: list[float] = []  # the GPU split override from the plan panel (empty: automatic)
        for mod_name, cls_name, text, kind in TOOL_HOOKS:
            # found now, imported on first use: a panel's dependencies must not delay the first window
            if not _module_exists(mod_name):
                continue
            act = QAction(text, self)
            act.triggered.connect(lambda _=False, m=mod_name, c=cls_name, k=kind, t=text: self._open_tool(m, c, k, t))
            self.tools_menu.addAction(act)
        self.tools_menu.menuAction().setVisible(bool(self.tools_menu.actions()))

    def _open_tool(self, mod_name: str, cls_name: str, kind: str, title: str) -> None:
        cls = _optional_class(mod_name, cls_name)
        if cls is None:
            self.show_error(f"{title} is not available: {mod_name} could not be loaded (see the terminal)")
            return
        if kind == "dialog":
            dlg = cls(self)
            dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
            if hasattr(dlg, "installed"):  # the model manager: a downloaded pair is offered in the Model tab
                dlg.installed.connect(self._model_installed)
            dlg.show()
            return
        dock = self._docks.get(title)
        if dock is None:
            dock = QDockWidget(title, self)
            # the documents panel works on the index the chats retrieve from
            widget = cls(dock, db_path=self.documents_db) if hasattr(cls, "collectionsChanged") else cls(dock)
            dock.setWidget(widget)
            if hasattr(widget, "splitOverride"):  # the GPU split plan: overrides apply at the next load
                widget.splitOverride.connect(self._split_override)
            if hasattr(widget, "collectionsChanged"):  # new or removed collections show in the chat's picker
                widget.collectionsChanged.connect(self.collection_picker.set_available)
                self.collection_picker.set_available(widget.collection_names())
            self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, dock)
            self._docks[title] = dock
        if hasattr(dock.widget(), "set_plan"):
            self._show_plan(dock.widget())
        dock.show()
        dock.raise_()

    def _show_plan(self, view: QWidget) -> None:
        """Plan the pair in the Model tab on this machine's devices and show it."""
        from app.session.models import plan_for

        spec = self.model_panel.spec()
        spec.split = self._split or None
        if not spec.target:
            return
        try:
            view.set_plan(plan_for(spec))
        except Exception as e:  # a bad path or an unreadable GGUF: said in the Model tab, the app goes on
            self.model_panel.show_error(f"cannot plan {spec.label}: {e}")

    def _split_override(self, split: list) -> None:
        self._split = [float(x) for x in split]
        self.model_panel.status_label.setText(
            "split ratio " + (":".join(f"{x:g}" for x in self._split) if self._split else "automatic")
            + ": applies when the model is next loaded on the GPU")
        view = self._docks.get("GPU split plan")
        if view is not None:
            self._show_plan(view.widget())

    # --- wiring ---------------------------------------------------------------
    def _wire(self) -> None:
        self.input.submitted.connect(self.send)
        self.send_button.clicked.connect(self.send)
        self.stop_button.clicked.connect(self.stop)
        self.regenerate_button.clicked.connect(self.regenerate)
        self.chat_view.regenerateRequested.connect(self.regenerate)
        self.chat_view.editSubmitted.connect(self.edit_and_resend)
        self.chat_view.statsRequested.connect(self._show_message_stats)
        self.chat_view.openFailed.connect(self.show_error)
        self.collection_picker.collectionsEdited.connect(self._collections_edited)
        self.sidebar.conversationSelected.connect(self.open_conversation)
        self.sidebar.newRequested.connect(self.new_conversation)
        self.sidebar.deleteRequested.connect(self.delete_conversation)
        self.settings_panel.settingsEdited.connect(self._settings_edited)
        self.settings_panel.systemPromptEdited.connect(self._system_prompt_edited)
        self.model_panel.loadRequested.connect(self.load_model)
        self.model_panel.unloadRequested.connect(self.unload_model)
        w = self.controller.worker
        w.loadProgress.connect(self._load_progress)
        w.loaded.connect(self._loaded)
        w.loadFailed.connect(self._load_failed)
        w.unloaded.connect(self._unloaded)
        w.baselineReady.connect(self._baseline_ready)
        w.replyUpdate.connect(self._reply_update)
        w.replyFailed.connect(self._reply_failed)
        w.replyEnded.connect(self._reply_ended)
        w.devicesFound.connect(self.model_panel.set_gpu_available)

    def _restore(self) -> None:
        geo = self.store.get_setting(K_GEOMETRY)
        if isinstance(geo, str):
            self.restoreGeometry(QByteArray.fromHex(geo.encode()))
        split = self.store.get_setting(K_SPLITTER)
        if isinstance(split, str):
            self.splitter.restoreState(QByteArray.fromHex(split.encode()))
        self.input.setPlainText(str(self.store.get_setting(K_DRAFT_INPUT, "") or ""))
        self.colour_action.setChecked(bool(self.store.get_setting(K_COLOUR, False)))
        last = self.store.get_setting(K_LAST_CONV)
        convs = self.store.conversations()
        ids = [c.id for c in convs]
        if last in ids:
            self.sidebar.select(last)
        elif ids:
            self.sidebar.select(ids[0])
        else:
            self._show_settings()

    # --- conversations --------------------------------------------------------
    def new_conversation(self) -> int:
        conv = self.store.create_conversation()
        self.conv_model.reload("")
        self.sidebar.search.clear()
        self.sidebar.select(conv.id)
        self.input.setFocus()
        return conv.id

    def open_conversation(self, conv_id: int) -> None:
        self.current_conv = conv_id
        self.store.set_setting(K_LAST_CONV, conv_id)
        self.msg_model.load(conv_id)
        self._show_settings()
        last = next((m for m in reversed(self.msg_model.messages()) if m.role == "assistant"), None)
        if last is not None:
            self.stats_panel.show_record(last.stats, f"Last reply ({last.status})")
        else:
            self.stats_panel.clear()
        self._set_busy(self.busy_conv)

    def delete_conversation(self, conv_id: int) -> None:
        if conv_id == self.busy_conv:
            self.show_error("this chat is generating a reply: stop it before deleting the chat")
            return
        self.store.delete_conversation(conv_id)
        self.conv_model.reload()
        if conv_id == self.current_conv:
            self.current_conv = None
            self.msg_model.load(None)
            self._show_settings()
            first = self.conv_model.conversation_at(0)
            if first is not None:
                self.sidebar.select(first.id)

    def _refresh_list(self) -> None:
        self.conv_model.reload()
        if self.current_conv is not None:
            self.sidebar.select(self.current_conv, emit=False)

    # --- sending --------------------------------------------------------------
    def send(self) -> None:
        text = self.input.toPlainText()
        if not text.strip() or self.busy_conv is not None:
            return
        conv = self.current_conv if self.current_conv is not None else self.new_conversation()
        try:
            send_user_message(self.store, conv, text)
        except FlashDeskError as e:
            self.show_error(str(e))
            return
        self.input.clear()
        self.msg_model.reload()
        self._refresh_list()
        self._start_reply(conv)

    def regenerate(self) -> None:
        if self.current_conv is None or self.busy_conv is not None:
            return
        try:
            prepare_regenerate(self.store, self.current_conv)
        except FlashDeskError as e:
            self.show_error(str(e))
            return
        self.msg_model.reload()
        self._start_reply(self.current_conv)

    def edit_and_resend(self, msg_id: int, text: str) -> None:
        if self.busy_conv is not None:
            self.show_error("wait for the reply to finish (or stop it) before editing")
            return
        try:
            msg = edit_user_message(self.store, msg_id, text)
        except FlashDeskError as e:
            self.show_error(str(e))
            return
        self.msg_model.reload()
        self._start_reply(msg.conversation_id)

    def stop(self) -> None:
        self.controller.stop()

    def _start_reply(self, conv_id: int) -> None:
        self.show_error("")
        if self.model_info is None and not self.loading:
            self.show_error("no model is loaded: load one in the Model tab, then press Regenerate "
                            "(your message is saved)")
            return
        self._set_busy(conv_id)
        self.stats_panel.clear("Waiting for the model…" if self.loading else "Starting…")
        self.controller.generate(conv_id, self.settings_for(conv_id))

    def settings_for(self, conv_id: int | None) -> ChatSettings:
        if conv_id is None:
            return self.global_settings
        return self.global_settings.merged(self.store.conversation(conv_id).overrides)

    def _set_busy(self, conv_id: int | None) -> None:
        self.busy_conv = conv_id
        busy = conv_id is not None
        self.send_button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)
        has_reply = any(m.role == "user" for m in self.msg_model.messages())
        self.regenerate_button.setEnabled(not busy and has_reply)
        self.sidebar.delete_button.setEnabled(not busy or self.current_conv != conv_id)

    # --- worker signals -------------------------------------------------------
    def _reply_update(self, u: ReplyUpdate) -> None:
        if self._closed:  # a step queued before shutdown; the store is closed
            return
        if u.conversation_id == self.current_conv:
            self.msg_model.apply_update(u.message_id, u.content, u.status, u.record, u.drafted_spans,
                                        u.sources if u.finish_reason is not None else None)
            # the panel redraws at most every STATS_INTERVAL_MS (a GPU can stream hundreds of steps a
            # second); the last step shows at once
            self._pending_stats = u
            if u.finish_reason is not None:
                self._stats_timer.stop()
                self._flush_stats()
            elif not self._stats_timer.isActive():
                self._stats_timer.start()

    def _flush_stats(self) -> None:
        u, self._pending_stats = self._pending_stats, None
        if u is not None and u.conversation_id == self.current_conv:
            state = "Streaming…" if u.finish_reason is None else f"Finished ({u.finish_reason})"
            self.stats_panel.show_summary(u.summary, u.tps_series, state)

    def _reply_failed(self, conv_id: int, message: str) -> None:
        if self._closed:  # a step queued before shutdown; the store is closed
            return
        self.show_error(message)
        if conv_id == self.current_conv:
            self.msg_model.reload()

    def _reply_ended(self, conv_id: int) -> None:
        if self._closed:  # a step queued before shutdown; the store is closed
            return
        self._set_busy(None)
        if conv_id == self.current_conv:
            self.chat_view.flush()
        self._refresh_list()

    def load_model(self, spec: ModelSpec | None) -> None:
        if spec is not None and self._split:
            spec.split = list(self._split)
        self.loading = True
        self.model_panel.set_busy(True)
        self.model_panel.show_error("")
        self.model_status.setText("loading " + (spec.label if spec else "the bundled pair") + "…")
        auto = self.global_settings.adaptive and self.global_settings.speculative
        self.controller.load(spec, calibrate=auto)

    def unload_model(self) -> None:
        self.controller.unload()

    def _model_installed(self, entry_id: str, target: str, drafter: str) -> None:
        self.model_panel.target_edit.setText(target)
        self.model_panel.drafter_edit.setText(drafter or "")
        self.model_panel.status_label.setText(f"downloaded {entry_id}: press Load to use it")
        self.tabs.setCurrentWidget(self.model_panel)

    def _load_progress(self, stage: str, frac: float) -> None:
        if self._closed:  # a step queued before shutdown; the store is closed
            return
        label = {"baseline": "measuring plain baseline", "calibrating": "calibrating draft costs"}.get(
            stage, f"loading {stage}")
        self.model_panel.show_progress(label, frac)
        if stage == "baseline" and frac >= 1.0:
            self.model_panel.set_busy(False)
            self.loading = False

    def _loaded(self, info: ModelInfo) -> None:
        if self._closed:  # a step queued before shutdown; the store is closed
            return
        self.model_info = info
        self.store.set_setting(K_MODEL, info.spec.to_dict())
        self.model_panel.show_spec(info.spec)
        drafter = f"drafter block {info.block_size}" if info.has_drafter else "no drafter: plain decoding"
        self.model_status.setText(f"{info.label} · {drafter} · ctx {info.n_ctx}")
        self.model_panel.status_label.setText(f"loaded: {info.label}\n{drafter}\nprompt format: {info.prompt_format}")
        self.settings_panel.format_label.setText(f"prompt format: {info.prompt_format}")

    def _load_failed(self, message: str) -> None:
        if self._closed:  # a step queued before shutdown; the store is closed
            return
        self.loading = False
        self.model_panel.set_busy(False)
        self.model_panel.show_error(message)
        self.tabs.setCurrentWidget(self.model_panel)  # the error sits next to the fields to fix
        self.show_error(message)
        self.model_status.setText(f"loaded: {self.model_info.label}" if self.model_info else "no model loaded")

    def _unloaded(self) -> None:
        if self._closed:  # a step queued before shutdown; the store is closed
            return
        self.model_info = None
        self.model_status.setText("no model loaded")
        self.model_panel.status_label.setText("no model loaded")

    def _baseline_ready(self, b) -> None:  # noqa: ANN001 - app.session.baseline.Baseline
        if self._closed:  # a step queued before shutdown; the store is closed
            return
        self.stats_panel.set_baseline(b)

    # --- settings -------------------------------------------------------------
    def _show_settings(self) -> None:
        conv = self.store.conversation(self.current_conv) if self.current_conv is not None else None
        s = self.global_settings.merged(conv.overrides if conv else None)
        self.settings_panel.show_settings(s, bool(conv and conv.overrides), conv.system_prompt if conv else None)
        self.collection_picker.set_selected(conv.collections if conv else [])

    def _collections_edited(self, names: list[str]) -> None:
        if self.current_conv is None:  # ticked before the first message: the chat starts here
            self.new_conversation()
        self.store.set_collections(self.current_conv, names)
        self.collection_picker.set_selected(names)

    def _settings_edited(self, s: ChatSettings, this_chat: bool) -> None:
        if this_chat and self.current_conv is not None:
            self.store.set_overrides(self.current_conv, s.to_dict())
        else:
            if self.current_conv is not None:
                self.store.set_overrides(self.current_conv, {})
            self.global_settings = s
            self.store.set_setting(K_GENERATION, s.to_dict())

    def _system_prompt_edited(self, text: str) -> None:
        if self.current_conv is not None:
            self.store.set_system_prompt(self.current_conv, text)

    def _colour_drafts(self, on: bool) -> None:
        self.chat_view.set_colour_drafts(on)
        self.store.set_setting(K_COLOUR, on)

    def _show_message_stats(self, msg_id: int) -> None:
        m = self.store.message(msg_id)
        self.stats_panel.show_record(m.stats, f"Reply #{msg_id} ({m.status})")
        self.tabs.setCurrentWidget(self.stats_panel)

    def show_error(self, text: str) -> None:
        self.banner.setText(text)
        self.banner.setVisible(bool(text))

    # --- closing --------------------------------------------------------------
    def closeEvent(self, e: QCloseEvent) -> None:  # noqa: N802
        self.shutdown()
        super().closeEvent(e)

    def shutdown(self) -> None:
        """Save where the user was, stop the worker (within one step) and close the database."""
        if self._closed:
            return
        self._closed = True
        self.store.set_setting(K_GEOMETRY, bytes(self.saveGeometry().toHex()).decode())
        self.store.set_setting(K_SPLITTER, bytes(self.splitter.saveState().toHex()).decode())
        self.store.set_setting(K_DRAFT_INPUT, self.input.toPlainText())
        for dock in self._docks.values():  # panels with their own threads (the indexer) join them now
            if hasattr(dock.widget(), "shutdown"):
                dock.widget().shutdown()
        self.controller.shutdown()
        self.store.close()


def _module_exists(mod_name: str) -> bool:
    try:
        return importlib.util.find_spec(mod_name) is not None
    except (ImportError, ValueError):
        return False


def _optional_class(mod_name: str, cls_name: str) -> type | None:
    """A class from a module that may not exist yet (another issue's panel)."""
    try:
        mod = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        if e.name and mod_name.startswith(e.name):
            return None  # not written yet: no menu entry
        print(f"flashdesk: {mod_name} is unavailable: {e}", file=sys.stderr)
        return None
    except Exception as e:  # a broken optional panel must not keep the app from starting
        print(f"flashdesk: {mod_name} failed to import: {type(e).__name__}: {e}", file=sys.stderr)
        return None
    return getattr(mod, cls_name, None)
