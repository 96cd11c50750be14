"""Fixtures for driving the real FlashDesk window (offscreen) on real models."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from app.session.models import ModelSpec

# The tiny test vocabulary has lowercase letters, digits, space, newline, '.' and ',' only (no byte
# fallback for the rest), so the tiny target gets a chat template that writes nothing else.
TINY_TEMPLATE = ("{% for m in messages %}{{ m.role[0] }} {{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}a {% endif %}")
LOAD_TIMEOUT_MS = 300_000
REPLY_TIMEOUT_MS = 300_000


@pytest.fixture(scope="session")
def tiny_chat_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from gguf_tools.synth import write_tiny_pair

    return write_tiny_pair(tmp_path_factory.mktemp("tiny-chat"), "qwen3", chat_template=TINY_TEMPLATE)


@pytest.fixture
def tiny_spec(tiny_chat_pair: tuple[Path, Path]) -> ModelSpec:
    t, d = tiny_chat_pair
    # one llama.cpp thread: on a 2-core machine shared with other jobs, a thread pool spinning at
    # its barriers makes decoding erratic (and these tests slow); the app's default is all cores
    return ModelSpec(str(t), str(d), n_ctx=1024, n_threads=1)


@pytest.fixture
def open_window(qtbot) -> Callable:  # noqa: ANN001
    """open_window(db, spec) -> a shown MainWindow whose model (and plain baseline) has loaded."""
    from app.ui.main_window import MainWindow

    opened = []

    def _open(db: Path, spec: ModelSpec | None, wait: bool = True, generation: dict | None = None) -> MainWindow:
        if generation is not None:
            from app.store import Store

            s = Store(db)  # the user's saved settings, as a previous session left them
            s.set_setting("generation", generation)
            s.close()
        w = MainWindow(db, model=spec, autoload=spec is not None)
        w.sidebar.confirm_delete = False
        qtbot.addWidget(w)
        w.show()
        opened.append(w)
        if wait and spec is not None:
            qtbot.waitUntil(lambda: w.model_info is not None and not w.loading, timeout=LOAD_TIMEOUT_MS)
        return w

    yield _open
    for w in opened:
        w.shutdown()


def send(qtbot, w, text: str) -> None:  # noqa: ANN001
    """Type a message and press Enter, as a user does; wait for the reply to end."""
    w.input.setFocus()
    w.input.setPlainText(text)
    QTest.keyClick(w.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.busy_conv is None, timeout=REPLY_TIMEOUT_MS)
    w.chat_view.flush()


def hold_after_first_update(w) -> threading.Event:  # noqa: ANN001
    """Block the worker right after it emits its first reply step, until the returned event is set.

    The UI gets that step (queued before the worker blocks), so a test can press Stop while the
    reply is provably mid-way, with no timing involved: the engine process is put in lockstep
    (reply window 0), so it waits for the worker's ack of that step before it decodes the next."""
    w.controller.worker.reply_window = 0
    release = threading.Event()
    seen = []

    def gate(_update) -> None:  # noqa: ANN001 - runs in the worker thread
        if not seen:
            seen.append(1)
            release.wait(60)

    w.controller.worker.replyUpdate.connect(gate, Qt.ConnectionType.DirectConnection)
    return release
