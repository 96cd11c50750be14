"""The Tools menu and what it opens: the model manager (a dialog), the GPU split plan, the
documents panel and the local server (docks on the right).

Each panel is made the first time it is opened, not with the window: the documents panel
opens its index and resumes unfinished indexing in its own thread when it is made.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtWidgets import QDockWidget, QMainWindow, QMenu, QWidget

from app.ui.documents_panel import DocumentsPanel
from app.ui.model_manager import ModelManagerDialog
from app.ui.plan_view import PlanView
from app.ui.server_panel import ServerPanel
from app.ui.split_plan import SplitPlanTool
from app.ui.worker import EngineController, WorkerExecutor

MODEL_MANAGER = "Model manager…"
SPLIT_PLAN = "GPU split plan"
DOCUMENTS = "Documents"
SERVER = "Local server (OpenAI API)"


class ToolPanels(QObject):
    pairInstalled = Signal(str, str, str)  # entry id, target path, drafter path: a pair the model manager downloaded
    collectionsChanged = Signal(list)  # the documents index's collection names, for the chat's collection picker

    def __init__(self, window: QMainWindow, menu: QMenu, documents_db: Path, split_plan: SplitPlanTool,
                 engine: EngineController):
        super().__init__(window)
        self._window = window
        self._documents_db = documents_db  # the index the chats retrieve from
        self._split_plan = split_plan
        self._engine = engine  # the local server generates on the app's loaded pair, in its worker
        self.plan_dock: QDockWidget | None = None
        self.documents_dock: QDockWidget | None = None
        self.documents_panel: DocumentsPanel | None = None
        self.server_dock: QDockWidget | None = None
        self.server_panel: ServerPanel | None = None
        menu.addAction(MODEL_MANAGER).triggered.connect(self.open_model_manager)
        menu.addAction(SPLIT_PLAN).triggered.connect(self.open_split_plan)
        menu.addAction(DOCUMENTS).triggered.connect(self.open_documents)
        menu.addAction(SERVER).triggered.connect(self.open_server)

    def open_model_manager(self) -> ModelManagerDialog:
        """A new dialog each time; a pair it downloads comes out as pairInstalled."""
        dialog = ModelManagerDialog(self._window)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.installed.connect(self.pairInstalled)
        dialog.show()
        return dialog

    def open_split_plan(self) -> QDockWidget:
        """Show the plan dock and plan the pair in the Model tab (again: the fields may have changed)."""
        if self.plan_dock is None:
            view = PlanView()
            self._split_plan.attach(view)
            self.plan_dock = self._add_dock(SPLIT_PLAN, view)
        self._split_plan.request_plan()
        self._raise(self.plan_dock)
        return self.plan_dock

    def open_documents(self) -> QDockWidget:
        if self.documents_dock is None:
            panel = DocumentsPanel(db_path=self._documents_db)
            panel.collectionsChanged.connect(self.collectionsChanged)
            self.documents_panel = panel
            self.documents_dock = self._add_dock(DOCUMENTS, panel)
            self.collectionsChanged.emit(panel.collection_names())
        self._raise(self.documents_dock)
        return self.documents_dock

    def open_server(self) -> QDockWidget:
        if self.server_dock is None:
            self.server_panel = ServerPanel(WorkerExecutor(self._engine))
            self.server_dock = self._add_dock(SERVER, self.server_panel)
        self._raise(self.server_dock)
        return self.server_dock

    def shutdown(self) -> None:
        """Stop the local server (before the engine worker goes) and join the documents panel's
        indexing thread (the other panels own no thread)."""
        if self.server_panel is not None:
            self.server_panel.shutdown()
        if self.documents_panel is not None:
            self.documents_panel.shutdown()

    def _add_dock(self, title: str, widget: QWidget) -> QDockWidget:
        dock = QDockWidget(title, self._window)
        dock.setWidget(widget)
        self._window.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, dock)
        return dock

    @staticmethod
    def _raise(dock: QDockWidget) -> None:
        dock.show()
        dock.raise_()
