"""Waiting on the window from a script that drives it (scripts/screenshot.py, measure_app.py, first_reply.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import QEventLoop, QTimer


def wait_until(cond: Callable[[], bool], timeout_s: float = 900) -> None:
    """Run the real event loop until cond() holds (TimeoutError after timeout_s). A Python loop around
    processEvents would spin on the GIL and the CPU, and slow the worker thread it is waiting for."""
    loop, t0 = QEventLoop(), time.time()

    def check() -> None:
        if cond() or time.time() - t0 > timeout_s:
            loop.quit()

    timer = QTimer()
    timer.timeout.connect(check)
    timer.start(25)
    if not cond():
        loop.exec()
    timer.stop()
    if not cond():
        raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for the app")
