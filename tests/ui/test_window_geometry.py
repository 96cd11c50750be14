"""The window fits the screen it opens on: a minimum size under 1280x720 with no widgets on top
of each other, a first size from the screen, and a saved geometry clamped to the screen."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

from PySide6.QtCore import QRect, QSize
from PySide6.QtWidgets import QApplication

from app.ui.main_window import MainWindow
from app.ui.window_geometry import fit_on_screen, start_size

LONG_NAMES = ("gemma-3-270m-it-qat-Q4_K_M-with-a-long-file-name.gguf + "
              "gemma-3-270m-it-dflash-distilled-b16-with-a-long-name.gguf · drafter block 16 · ctx 32768")


def _window(qtbot, db: Path) -> MainWindow:  # noqa: ANN001
    w = MainWindow(db, autoload=False)
    qtbot.addWidget(w)
    return w


def test_the_minimum_size_fits_1280x720_even_with_long_model_names(qtbot, tmp_path: Path):  # noqa: ANN001
    w = _window(qtbot, tmp_path / "db.sqlite3")
    w.show()
    w.model_status.setText(LONG_NAMES)  # what a loaded pair with long file names shows next to Send
    w.collection_picker.set_selected(["papers", "handbooks", "meeting notes 2024", "code"])
    QApplication.processEvents()
    for size in (w.minimumSizeHint(), w.minimumSize()):
        assert size.width() <= 1280 and size.height() <= 720, size
    assert w.model_status.text() == LONG_NAMES and w.model_status.toolTip() == LONG_NAMES


def test_at_its_minimum_size_the_row_with_send_keeps_every_button_whole(qtbot, tmp_path: Path):  # noqa: ANN001
    w = _window(qtbot, tmp_path / "db.sqlite3")
    w.show()
    w.model_status.setText(LONG_NAMES)
    w.resize(w.minimumSizeHint())
    QApplication.processEvents()
    row = [w.model_status, w.collection_picker, w.regenerate_button, w.stop_button, w.send_button]
    for widget in row:
        assert widget.isVisible() and widget.width() >= widget.minimumSizeHint().width(), widget
    for a, b in combinations(row, 2):
        assert not a.geometry().intersects(b.geometry()), (a, b)
    column = w.splitter.widget(1)
    assert all(column.rect().contains(widget.geometry()) for widget in row)


def test_a_first_window_is_sized_from_the_available_screen(qtbot, tmp_path: Path):  # noqa: ANN001
    w = _window(qtbot, tmp_path / "db.sqlite3")
    available = w.screen().availableGeometry()
    assert w.size() == start_size(available.size()).expandedTo(w.minimumSizeHint())
    w.show()
    QApplication.processEvents()
    assert available.contains(w.frameGeometry()), (w.frameGeometry(), available)


def test_a_saved_geometry_larger_than_the_screen_is_clamped_to_it(qtbot, tmp_path: Path):  # noqa: ANN001
    db = tmp_path / "db.sqlite3"
    w = _window(qtbot, db)
    w.show()
    available = w.screen().availableGeometry()
    w.setGeometry(available.x() + 200, available.y() + 100, available.width() + 900, available.height() + 500)
    QApplication.processEvents()
    assert not available.contains(w.frameGeometry())
    w.close()  # saves the geometry

    again = _window(qtbot, db)
    assert available.contains(again.geometry()), (again.geometry(), available)
    again.show()
    QApplication.processEvents()
    for shown in (again.geometry(), again.frameGeometry()):
        assert available.contains(shown), (shown, available)
    assert again.width() >= available.width() - 10 and again.height() >= available.height() - 40  # clamped, not reset
    again.shutdown()


def test_start_size_on_common_screens():
    assert start_size(QSize(1366, 728)) == QSize(1229, 655)  # the 1366x768 laptop, taskbar below
    assert start_size(QSize(1920, 1040)) == QSize(1280, 800)
    assert start_size(QSize(2560, 1400)) == QSize(1280, 800)


def test_fit_on_screen_shrinks_and_moves_inside():
    screen = QRect(0, 0, 1366, 728)
    assert fit_on_screen(QRect(-100, -50, 1567, 800), screen) == screen
    assert fit_on_screen(QRect(1000, 600, 800, 500), screen) == QRect(566, 228, 800, 500)
    assert fit_on_screen(QRect(10, 20, 800, 500), screen) == QRect(10, 20, 800, 500)
    right = QRect(1366, 0, 1920, 1040)  # a second screen to the right
    assert fit_on_screen(QRect(0, 0, 1280, 800), right) == QRect(1366, 0, 1280, 800)
