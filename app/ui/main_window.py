"""The main window: sidebar | chat | stats/settings/model tabs, wired to the engine worker.

Conversation edits (send, regenerate, edit) go to the store here through the
Qt-free app.session.conversation_ops; replies are produced in the worker
thread, which writes them to the store and sends snapshots back. Every worker
signal arrives at a slot here marked @skip_after_shutdown.

Elsewhere: the Tools menu and its panels in tool_panels.py, the GPU split plan's
wiring in split_plan.py, the texts about the model in status_text.py, where the
window opens in window_geometry.py.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QByteArray, Qt, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence, QShowEvent
from PySide6.QtWidgets import QHBoxLayout, QLabel, QMainWindow, QSplitter, QVBoxLayout, QWidget

from app.documents.index import default_db_path
from app.errors import FlashDeskError
from app.session.baseline import Baseline
from app.session.chat_session import ReplyUpdate
from app.session.conversation_ops import edit_user_message, prepare_regenerate, send_user_message
from app.session.models import ModelSpec
from app.session.settings import ChatSettings
from app.store import Store
from app.store.db import StoreError
from app.ui import status_text
from app.ui.chat_view import ChatView
from app.ui.collection_picker import CollectionPicker
from app.ui.compact_button import CompactButton
from app.ui.elided_label import ElidedLabel
from app.ui.input_box import InputBox
from app.ui.list_models import ConversationListModel, MessageListModel
from app.ui.model_panel import ModelPanel
from app.ui.settings_panel import SettingsPanel
from app.ui.shutdown_guard import skip_after_shutdown
from app.ui.side_tabs import SideTabs
from app.ui.sidebar import Sidebar
from app.ui.split_plan import SplitPlanTool
from app.ui.stats_panel import StatsPanel
from app.ui.tool_panels import ToolPanels
from app.ui.window_geometry import column_widths, keep_frame_on_screen, place_window
from app.ui.worker import EngineController, ModelInfo

STATS_INTERVAL_MS = 100

# settings keys
K_GENERATION, K_MODEL, K_LAST_CONV = "generation", "model", "last_conversation"
# the pair being loaded, kept until its load ends: still there at a start, that load crashed the engine (or the app)
K_LOADING = "loading_model"
K_GEOMETRY, K_SPLITTER, K_DRAFT_INPUT, K_COLOUR = "window_geometry", "splitter_state", "input_draft", "colour_drafts"


class MainWindow(QMainWindow):
    def __init__(self, db_path: str | Path, model: ModelSpec | None = None, autoload: bool = True,
                 documents_db: str | Path | None = None):
        super().__init__()
        self.setWindowTitle("FlashDesk")
        self.shut_down = False  # set first thing in shutdown(): worker signals still queued are dropped
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
        self.loading_spec: ModelSpec | None = None  # the pair asked for last (None: the bundled one)
        self._pending_stats: ReplyUpdate | None = None
        self._stats_timer = QTimer(self)
        self._stats_timer.setSingleShot(True)
        self._stats_timer.setInterval(STATS_INTERVAL_MS)
        self._stats_timer.timeout.connect(self._flush_stats)
        self._build()
        self._build_menus()
        self._wire()
        self._restore()
        self.controller.probe_devices()
        crashed = self.store.get_setting(K_LOADING)
        if autoload and model is None and isinstance(crashed, dict):
            self._not_reloaded(crashed)
        elif autoload:
            saved = self.store.get_setting(K_MODEL)
            spec = model or (ModelSpec.from_dict(saved) if isinstance(saved, dict) and saved.get("target") else None)
            self.load_model(spec)

    def _not_reloaded(self, crashed: dict) -> None:
        """The last start ended while it loaded this pair: say so, and leave the choice to the user."""
        spec = ModelSpec.from_dict(crashed) if crashed.get("target") else None
        label = spec.label if spec else "the bundled pair"
        self.show_error(f"FlashDesk stopped while it loaded {label} last time (the engine process crashed or the "
                        f"app was killed), so it was not loaded again. Load it, or pick another pair, in the "
                        f"Model tab.", reload=True)
        if spec is not None:
            self.model_panel.show_spec(spec)
        self.loading_spec = spec
        self.tabs.show_panel(self.model_panel)

    # --- layout ---------------------------------------------------------------
    def _build(self) -> None:
        self.conv_model = ConversationListModel(self.store, self)
        self.msg_model = MessageListModel(self.store, self)
        self.sidebar = Sidebar(self.conv_model)

        self.stats_panel = StatsPanel()
        self.settings_panel = SettingsPanel()
        self.model_panel = ModelPanel()
        self.tabs = SideTabs()
        self.tabs.add_panel(self.stats_panel, "Stats")
        self.tabs.add_panel(self.settings_panel, "Settings")
        self.tabs.add_panel(self.model_panel, "Model")

        self.splitter = QSplitter()
        self.splitter.addWidget(self.sidebar)
        self.splitter.addWidget(self._build_chat_column())
        self.splitter.addWidget(self.tabs)
        self.splitter.setStretchFactor(1, 1)  # the chat column takes what the window gains or loses
        self.setCentralWidget(self.splitter)
        self._set_busy(None)

    def _build_chat_column(self) -> QWidget:
        """The error banner, the transcript, the input box, and the row with Send."""
        center = QWidget()
        cl = QVBoxLayout(center)
        cl.setContentsMargins(4, 4, 4, 4)
        self.banner = QLabel()
        self.banner.setObjectName("errorBanner")
        self.banner.setWordWrap(True)
        self.banner.setStyleSheet("background:#fdecea; color:#8a1c12; padding:6px; border-radius:4px;")
        self.banner.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.banner.hide()
        self.reload_button = CompactButton("Load the model again")  # after the engine process died
        self.reload_button.hide()
        banner_row = QHBoxLayout()
        banner_row.addWidget(self.banner, 1)
        banner_row.addWidget(self.reload_button)
        cl.addLayout(banner_row)
        self.chat_view = ChatView(self.msg_model)
        cl.addWidget(self.chat_view, 1)
        self.input = InputBox()
        cl.addWidget(self.input)
        row = QHBoxLayout()
        self.model_status = ElidedLabel(status_text.NO_MODEL)  # long file names must not widen the window
        self.model_status.setStyleSheet("color:#6a717a;")
        row.addWidget(self.model_status, 1)
        self.collection_picker = CollectionPicker(self.documents_db)
        row.addWidget(self.collection_picker)
        self.regenerate_button = CompactButton("Regenerate")
        self.stop_button = CompactButton("Stop")
        self.send_button = CompactButton("Send")
        self.send_button.setDefault(True)
        for b in (self.regenerate_button, self.stop_button, self.send_button):
            row.addWidget(b)
        cl.addLayout(row)
        return center

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
        self.split_plan = SplitPlanTool(self.controller, self.model_panel, self)
        self.tools = ToolPanels(self, self.tools_menu, self.documents_db, self.split_plan, self.controller)

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
        self.reload_button.clicked.connect(lambda: self.load_model(self.loading_spec))
        self.model_panel.unloadRequested.connect(self.unload_model)
        # the Tools menu's panels, once opened
        self.tools.pairInstalled.connect(self._pair_installed)
        self.tools.collectionsChanged.connect(self.collection_picker.set_available)
        # the worker's signals: every slot is @skip_after_shutdown
        w = self.controller.worker
        w.loadProgress.connect(self._load_progress)
        w.loaded.connect(self._loaded)
        w.loadFailed.connect(self._load_failed)
        w.unloaded.connect(self._unloaded)
        w.baselineReady.connect(self._baseline_ready)
        w.replyUpdate.connect(self._reply_update)
        w.replyFailed.connect(self._reply_failed)
        w.replyEnded.connect(self._reply_ended)
        w.devicesFound.connect(self._devices_found)
        w.planReady.connect(self._plan_ready)
        w.planFailed.connect(self._plan_failed)
        w.engineCrashed.connect(self._engine_crashed)

    def _restore(self) -> None:
        geo = self.store.get_setting(K_GEOMETRY)
        place_window(self, QByteArray.fromHex(geo.encode()) if isinstance(geo, str) else None)
        split = self.store.get_setting(K_SPLITTER)
        if isinstance(split, str):
            self.splitter.restoreState(QByteArray.fromHex(split.encode()))
        else:
            self.splitter.setSizes(column_widths(self.width()))
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
        self.sidebar.clear_search()
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
        """`conv_id`: the chat generating a reply (None: none is)."""
        self.busy_conv = conv_id
        busy = conv_id is not None
        self.send_button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)
        has_reply = any(m.role == "user" for m in self.msg_model.messages())
        self.regenerate_button.setEnabled(not busy and has_reply)
        self.sidebar.set_delete_enabled(not busy or self.current_conv != conv_id)

    # --- the model ------------------------------------------------------------
    def load_model(self, spec: ModelSpec | None) -> None:
        """`spec` None: the bundled pair."""
        if spec is not None:
            spec = self.split_plan.with_split(spec)
        self.loading = True
        self.loading_spec = spec
        self._mark_loading(spec.to_dict() if spec else {"target": None})
        self.model_panel.set_busy(True)
        self.model_panel.show_error("")
        self.model_status.setText(status_text.loading_line(spec))
        auto = self.global_settings.adaptive and self.global_settings.speculative
        self.controller.load(spec, calibrate=auto)

    def _mark_loading(self, value: dict | None) -> None:
        try:
            self.store.set_setting(K_LOADING, value)
        except StoreError as e:  # a full disk or a read-only folder: said; the load itself goes on
            self.show_error(str(e))

    def unload_model(self) -> None:
        self.controller.unload()

    def _pair_installed(self, entry_id: str, target: str, drafter: str) -> None:
        self.model_panel.fill_pair(target, drafter or None)
        self.model_panel.show_status(status_text.installed_text(entry_id))
        self.tabs.show_panel(self.model_panel)

    # --- worker signals -------------------------------------------------------
    @skip_after_shutdown
    def _reply_update(self, u: ReplyUpdate) -> None:
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

    @skip_after_shutdown
    def _reply_failed(self, conv_id: int, message: str) -> None:
        self.show_error(message)
        if conv_id == self.current_conv:
            self.msg_model.reload()

    @skip_after_shutdown
    def _reply_ended(self, conv_id: int) -> None:
        self._set_busy(None)
        if conv_id == self.current_conv:
            self.chat_view.flush()
        self._refresh_list()

    @skip_after_shutdown
    def _load_progress(self, stage: str, frac: float) -> None:
        self.model_panel.show_progress(status_text.load_stage_text(stage), frac)
        if stage == "baseline" and frac >= 1.0:
            self.model_panel.set_busy(False)
            self.loading = False
            self._mark_loading(None)  # the load ended without a crash

    @skip_after_shutdown
    def _loaded(self, info: ModelInfo) -> None:
        self.model_info = info
        if not self.reload_button.isHidden():  # the crash it followed is over
            self.show_error("")
        self.store.set_setting(K_MODEL, info.spec.to_dict())
        self.model_panel.show_spec(info.spec)
        self.model_status.setText(status_text.loaded_line(info))
        self.model_panel.show_status(status_text.loaded_details(info))
        self.settings_panel.show_prompt_format(info.prompt_format)

    @skip_after_shutdown
    def _load_failed(self, message: str) -> None:
        self.loading = False
        self._mark_loading(None)  # refused cleanly: nothing to guard the next start against
        self.model_panel.set_busy(False)
        self.model_panel.show_error(message)
        self.tabs.show_panel(self.model_panel)  # the error sits next to the fields to fix
        self.show_error(message)
        self.model_status.setText(status_text.line_after_failed_load(self.model_info))

    @skip_after_shutdown
    def _engine_crashed(self, message: str) -> None:
        """The engine process died (the window did not): no model now; the chats are all stored.
        A crash during a load leaves K_LOADING set, so the next start does not load that pair again."""
        was_loading, self.loading = self.loading, False
        if self.model_info is not None and not was_loading:
            self.loading_spec = self.model_info.spec
        self.model_info = None
        self.model_panel.set_busy(False)
        self.model_panel.show_error(message)
        self.model_status.setText(status_text.NO_MODEL + " (the engine process stopped)")
        self.show_error(message, reload=True)
        if self.current_conv is not None:
            self.msg_model.reload()  # the reply it streamed, as stored (marked interrupted)

    @skip_after_shutdown
    def _unloaded(self) -> None:
        self.model_info = None
        self.model_status.setText(status_text.NO_MODEL)
        self.model_panel.show_status(status_text.NO_MODEL)

    @skip_after_shutdown
    def _baseline_ready(self, b: Baseline) -> None:
        self.stats_panel.set_baseline(b)

    @skip_after_shutdown
    def _devices_found(self, gpu: bool) -> None:
        self.model_panel.set_gpu_available(gpu)

    @skip_after_shutdown
    def _plan_ready(self, plan: object) -> None:
        self.split_plan.show_plan(plan)

    @skip_after_shutdown
    def _plan_failed(self, message: str) -> None:
        self.split_plan.show_failure(message)
        self.show_error(message)

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
        self.tabs.show_panel(self.stats_panel)

    def show_error(self, text: str, reload: bool = False) -> None:
        """The banner over the chat; `reload`: with the button that loads the last pair again."""
        self.banner.setText(text)
        self.banner.setVisible(bool(text))
        self.reload_button.setVisible(bool(text) and reload)

    # --- showing and closing ---------------------------------------------------
    def showEvent(self, e: QShowEvent) -> None:  # noqa: N802 - Qt override
        super().showEvent(e)
        if not e.spontaneous():  # shown by the app, not restored from minimized by the user
            keep_frame_on_screen(self)

    def closeEvent(self, e: QCloseEvent) -> None:  # noqa: N802
        self.shutdown()
        super().closeEvent(e)

    def shutdown(self) -> None:
        """Save where the user was, stop the worker (within one step) and close the database."""
        if self.shut_down:
            return
        self.shut_down = True
        self._stats_timer.stop()
        self.store.set_setting(K_GEOMETRY, bytes(self.saveGeometry().toHex()).decode())
        self.store.set_setting(K_SPLITTER, bytes(self.splitter.saveState().toHex()).decode())
        self.store.set_setting(K_DRAFT_INPUT, self.input.toPlainText())
        self.tools.shutdown()  # the local server stops, the documents panel's indexing thread joins
        self.controller.shutdown()
        self.store.close()
