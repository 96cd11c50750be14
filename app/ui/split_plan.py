"""The GPU split plan tool's wiring: which pair to plan (the Model tab's, with the user's split
override), asking the engine worker for the plan, and showing the answer in the PlanView.

Planning detects the devices (loading the native libraries, probing the GPUs) and reads the
GGUF headers, so it runs in the worker thread; the window hands the worker's planReady and
planFailed to show_plan and show_failure.
"""

from __future__ import annotations

from PySide6.QtCore import QObject

from app.session.models import ModelSpec
from app.ui.model_panel import ModelPanel
from app.ui.plan_view import PlanView
from app.ui.status_text import split_override_text
from app.ui.worker import EngineController


class SplitPlanTool(QObject):
    def __init__(self, controller: EngineController, model_panel: ModelPanel, parent: QObject | None = None):
        super().__init__(parent)
        self._controller = controller
        self._model_panel = model_panel
        self.view: PlanView | None = None  # made when the Tools menu first opens it
        self.split: list[float] = []  # the user's override, one share per GPU (empty: automatic)

    def attach(self, view: PlanView) -> None:
        self.view = view
        view.splitOverride.connect(self.set_split)

    def with_split(self, spec: ModelSpec) -> ModelSpec:
        """`spec` with the user's override, if there is one (loading on the GPU applies it)."""
        if self.split:
            spec.split = list(self.split)
        return spec

    def request_plan(self) -> None:
        """Ask the worker to plan the pair in the Model tab (nothing to plan without a target)."""
        spec = self.with_split(self._model_panel.spec())
        if self.view is None or not spec.target:
            return
        self.view.show_note(f"planning {spec.label}…")
        self._controller.plan(spec)

    def show_plan(self, plan: object) -> None:
        """`plan`: the worker's SplitPlan."""
        if self.view is not None:
            self.view.set_plan(plan)

    def show_failure(self, message: str) -> None:
        if self.view is not None:
            self.view.show_note(message)

    def set_split(self, split: list) -> None:
        """The plan view's override (empty: automatic): kept for the next load, and planned now."""
        self.split = [float(x) for x in split]
        self._model_panel.show_status(split_override_text(self.split))
        self.request_plan()
