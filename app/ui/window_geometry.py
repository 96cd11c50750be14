"""Where the main window opens: sized from the screen it opens on, or where the user left it,
kept inside that screen's available area (a 1366x768 laptop lost Send and the stats panel
below the screen's edge to a fixed 1280x800 window)."""

from __future__ import annotations

from PySide6.QtCore import QByteArray, QPoint, QRect, QSize
from PySide6.QtGui import QGuiApplication, QScreen
from PySide6.QtWidgets import QWidget

PREFERRED_SIZE = QSize(1280, 800)  # the size on a large screen
SCREEN_SHARE = 0.9  # at most this share of the available width and height: the frame needs room too
COLUMN_WIDTHS = (220, 640, 380)  # sidebar, chat, side tabs in a window of about PREFERRED_SIZE


def start_size(available: QSize) -> QSize:
    """The window's first size on a screen whose available area is `available` (Qt raises it to
    the window's minimum size on a screen smaller still)."""
    return PREFERRED_SIZE.boundedTo(QSize(int(available.width() * SCREEN_SHARE),
                                          int(available.height() * SCREEN_SHARE)))


def column_widths(window_width: int) -> list[int]:
    """The columns' first widths, scaled to the window (the splitter holds each at its minimum)."""
    scale = window_width / sum(COLUMN_WIDTHS)
    return [round(w * scale) for w in COLUMN_WIDTHS]


def fit_on_screen(geometry: QRect, available: QRect) -> QRect:
    """`geometry` shrunk to at most `available`'s size and moved inside it."""
    size = geometry.size().boundedTo(available.size())
    x = min(max(geometry.x(), available.left()), available.left() + available.width() - size.width())
    y = min(max(geometry.y(), available.top()), available.top() + available.height() - size.height())
    return QRect(QPoint(x, y), size)


def place_window(window: QWidget, saved: QByteArray | None) -> None:
    """Before the first show: restore `saved` (from QWidget.saveGeometry) if it is valid, clamped
    to the available area of the screen it lies on; else size the window from its screen."""
    if saved is not None and window.restoreGeometry(saved):
        if not (window.isMaximized() or window.isFullScreen()):  # those the window manager fits itself
            window.setGeometry(fit_on_screen(window.geometry(), _screen_of(window).availableGeometry()))
        return
    window.resize(start_size(window.screen().availableGeometry().size()))


def keep_frame_on_screen(window: QWidget) -> None:
    """Once shown, when the platform knows the frame (title bar, borders): the frame inside the
    available area too. A no-op where the frame comes later or already fits."""
    frame = window.frameGeometry()
    fitted = fit_on_screen(frame, _screen_of(window).availableGeometry())
    if fitted == frame:
        return
    inner = window.geometry()
    window.setGeometry(fitted.adjusted(inner.left() - frame.left(), inner.top() - frame.top(),
                                       inner.right() - frame.right(), inner.bottom() - frame.bottom()))


def _screen_of(window: QWidget) -> QScreen:
    return QGuiApplication.screenAt(window.geometry().center()) or window.screen()
