"""The Tools menu: other issues' panels appear once their module exists, and open on demand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from PySide6.QtWidgets import QDialog, QWidget

import app.ui.main_window as mw


@pytest.fixture
def fake_panels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """Two real modules on sys.path standing in for panels of other issues, and one that is absent."""
    pkg = tmp_path / "fd_panels"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "dlg.py").write_text("from PySide6.QtCore import Signal\nfrom PySide6.QtWidgets import QDialog\n"
                                "class Dlg(QDialog):\n    installed = Signal(str, str, str)\n")
    (pkg / "dock.py").write_text("from PySide6.QtWidgets import QLabel\n"
                                 "class Panel(QLabel):\n    def __init__(self, parent=None):\n"
                                 "        super().__init__('panel', parent)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(mw, "TOOL_HOOKS", [("fd_panels.dlg", "Dlg", "Dialog tool", "dialog"),
                                           ("fd_panels.dock", "Panel", "Dock tool", "dock"),
                                           ("fd_panels.missing", "X", "Missing tool", "dialog")])
    yield
    for m in ("fd_panels", "fd_panels.dlg", "fd_panels.dock"):
        sys.modules.pop(m, None)


def test_tools_menu_lists_existing_panels_and_opens_them(qtbot, fake_panels, tmp_path: Path):
    w = mw.MainWindow(tmp_path / "db.sqlite3", autoload=False)
    qtbot.addWidget(w)
    w.show()
    actions = {a.text(): a for a in w.tools_menu.actions()}
    assert set(actions) == {"Dialog tool", "Dock tool"}
    actions["Dialog tool"].trigger()
    dlg = next(c for c in w.findChildren(QDialog) if c.isVisible())
    dlg.installed.emit("qwen3-8b", "/models/t.gguf", "/models/d.gguf")  # a pair the manager downloaded
    assert w.model_panel.spec().target == "/models/t.gguf" and w.model_panel.spec().drafter == "/models/d.gguf"
    assert w.tabs.currentWidget() is w.model_panel
    actions["Dock tool"].trigger()
    dock = w._docks["Dock tool"]
    assert dock.isVisible() and isinstance(dock.widget(), QWidget) and dock.widget().text() == "panel"
    w.shutdown()


def test_gpu_split_plan_shows_the_pair_in_the_model_tab(qtbot, tiny_chat_pair, tmp_path: Path) -> None:
    """The real plan panel: planned on this machine's devices for the pair in the Model tab; a split
    override is kept for the next load."""
    w = mw.MainWindow(tmp_path / "db.sqlite3", autoload=False)
    qtbot.addWidget(w)
    w.show()
    t, d = tiny_chat_pair
    w.model_panel.target_edit.setText(str(t))
    w.model_panel.drafter_edit.setText(str(d))
    action = next(a for a in w.tools_menu.actions() if a.text() == "GPU split plan")
    action.trigger()
    view = w._docks["GPU split plan"].widget()
    assert "CPU / RAM" in [view.grid.itemAt(i).widget().text() for i in range(view.grid.count())
                           if hasattr(view.grid.itemAt(i).widget(), "text")]
    assert "fits" in view.verdict.text()
    view.splitOverride.emit([3.0, 1.0])
    assert w._split == [3.0, 1.0] and "applies when the model is next loaded" in w.model_panel.status_label.text()
    w.shutdown()
