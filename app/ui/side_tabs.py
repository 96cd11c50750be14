"""The window's right-hand tabs (stats, settings, model), each panel in a scroll area."""

from __future__ import annotations

from PySide6.QtWidgets import QFrame, QScrollArea, QTabWidget, QWidget


class SideTabs(QTabWidget):
    """A panel taller or wider than the room it gets scrolls: the window can be made small
    (down to a 1280x720 screen and below) without squeezing the panels' widgets together."""

    def add_panel(self, panel: QWidget, title: str) -> None:
        area = QScrollArea()
        area.setWidgetResizable(True)
        area.setFrameShape(QFrame.Shape.NoFrame)
        area.setWidget(panel)
        self.addTab(area, title)

    def show_panel(self, panel: QWidget) -> None:
        self.setCurrentIndex(next(i for i in range(self.count()) if self.widget(i).widget() is panel))

    def current_panel(self) -> QWidget | None:
        area = self.currentWidget()
        return area.widget() if area is not None else None
