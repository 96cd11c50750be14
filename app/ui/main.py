"""Starting the desktop app: `flashdesk` with no subcommand lands in run_app."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from app.ui.qt_libs import check_before_qt

_T0 = time.perf_counter()  # close enough to process start: this module is imported first thing by cmd_app


def run_app(args: argparse.Namespace | None = None) -> int:
    """Open the main window (the model loads in the background); headless fallback without a display."""
    from app.ui.headless import has_display, run_headless  # noqa: PLC0415 - after _T0: start-up time includes it

    if getattr(args, "headless", False) or not has_display():
        return run_headless()
    problem = check_before_qt()
    if problem:  # said before Qt tries: its own message suggests reinstalling, and the window never opens
        print(f"flashdesk: {problem}", file=sys.stderr)
        return 1
    from PySide6.QtCore import QTimer  # noqa: PLC0415 - Qt only with a display (a server may lack QtGui's GL libs)
    from PySide6.QtWidgets import QApplication  # noqa: PLC0415 - Qt only with a display

    from app.store import Store, default_data_dir  # noqa: PLC0415 - after _T0: start-up time includes it
    from app.ui.main_window import MainWindow  # noqa: PLC0415 - Qt only with a display

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("FlashDesk")
    app.setOrganizationName("FlashDesk")
    data_dir = Path(getattr(args, "data_dir", None) or default_data_dir())
    win = MainWindow(data_dir / Store.FILENAME)
    win.show()
    if getattr(args, "report_startup", False):
        # printed once the event loop has painted the window: what a user waits for
        QTimer.singleShot(0, lambda: print(f"first window shown at {time.time():.3f} "
                                           f"({time.perf_counter() - _T0:.3f} s after app.ui.main was imported)",
                                           flush=True))
    quit_after = getattr(args, "quit_after", None)
    if quit_after is not None:
        QTimer.singleShot(int(quit_after * 1000), win.close)
    rc = app.exec()
    win.shutdown()
    return rc
