"""llama.cpp runs in the engine process: an abort or a kill there ends that process, never the window.

Real crashes, no mocks: ggml's own abort (GGML_ASSERT text on stderr, SIGABRT) from the child's test hook
while it loads, and a SIGKILL (what an out-of-memory kill does) in the middle of a reply.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from app.host.abort_hook import ABORT_ENV
from app.session.models import ModelSpec
from app.store import Store
from app.store.records import STATUS_DONE, STATUS_INTERRUPTED
from app.ui.main_window import K_LOADING, MainWindow
from tests.ui.conftest import LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, hold_after_first_update, send

CRASH_TIMEOUT_MS = 120_000


def _a_stored_chat(db: Path) -> tuple[int, list[tuple[str, str]]]:
    s = Store(db)
    conv = s.create_conversation("an earlier chat")
    s.add_message(conv.id, "user", "what is two and two")
    s.add_message(conv.id, "assistant", "four")
    rows = [(m.role, m.content) for m in s.messages(conv.id)]
    s.close()
    return conv.id, rows


def test_an_abort_while_loading_leaves_the_window_up_and_is_not_loaded_again(
        qtbot, open_window, tiny_spec: ModelSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN001
    db = tmp_path / "db.sqlite3"
    conv, rows = _a_stored_chat(db)
    monkeypatch.setenv(ABORT_ENV, "load")  # inherited by the engine process the window starts
    w = open_window(db, tiny_spec, wait=False)
    qtbot.waitUntil(lambda: "engine process ended" in w.banner.text(), timeout=CRASH_TIMEOUT_MS)

    text = w.banner.text()
    assert len(text.encode()) < 1024, text
    assert "killed by SIGABRT" in text and "while loading" in text
    assert tiny_spec.target in text and tiny_spec.drafter in text  # the files it was loading
    assert f"GGML_ASSERT({ABORT_ENV}=load) failed" in text  # llama.cpp's (ggml's) last line
    assert w.isVisible() and w.reload_button.isVisibleTo(w)
    assert w.model_info is None and not w.loading and w.model_panel.error_label.text() == text
    # every chat is still there
    assert [(m.role, m.content) for m in w.store.messages(conv)] == rows
    assert isinstance(w.store.get_setting(K_LOADING), dict)
    w.shutdown()

    # the next start does not load that pair again, and says why
    monkeypatch.delenv(ABORT_ENV)
    w2 = MainWindow(db)  # as `flashdesk` opens it: autoload on, no model given
    qtbot.addWidget(w2)
    w2.show()
    try:
        assert not w2.loading and w2.model_info is None
        assert "was not loaded again" in w2.banner.text() and tiny_spec.label in w2.banner.text()
        assert w2.model_panel.spec().target == tiny_spec.target
        # the offer to load it again works (the hook is off now): the marker goes once it has loaded
        qtbot.mouseClick(w2.reload_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: w2.model_info is not None and not w2.loading, timeout=LOAD_TIMEOUT_MS)
        assert w2.store.get_setting(K_LOADING) is None and w2.reload_button.isHidden()
    finally:
        w2.shutdown()


def test_a_kill_mid_reply_marks_it_interrupted_and_the_app_goes_on(qtbot, open_window, tiny_spec: ModelSpec,  # noqa: ANN001
                                                                   tmp_path: Path):
    db = tmp_path / "db.sqlite3"
    conv, rows = _a_stored_chat(db)
    w = open_window(db, tiny_spec, generation={"max_tokens": 300, "draft_length": 2})
    first = []
    w.controller.worker.replyUpdate.connect(first.append)
    release = hold_after_first_update(w)  # the engine process waits for this step's ack: provably mid-reply
    w.new_conversation()
    w.input.setPlainText("tell me a long story")
    QTest.keyClick(w.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: len(first) == 1, timeout=REPLY_TIMEOUT_MS)
    w.controller.worker.host.kill()  # SIGKILL, as the kernel's out-of-memory killer sends it
    release.set()
    qtbot.waitUntil(lambda: w.busy_conv is None, timeout=CRASH_TIMEOUT_MS)

    text = w.banner.text()
    assert "killed by SIGKILL" in text and "while running" in text and tiny_spec.target in text, text
    reply = w.store.messages(w.current_conv)[-1]
    assert reply.status == STATUS_INTERRUPTED and "SIGKILL" in reply.error
    assert reply.content == first[0].content != ""  # what the window showed was stored first
    assert [(m.role, m.content) for m in w.store.messages(conv)] == rows
    assert w.model_info is None and w.reload_button.isVisibleTo(w)

    # load again from the banner's button; the next reply is served by a fresh engine process
    qtbot.mouseClick(w.reload_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.model_info is not None and not w.loading, timeout=LOAD_TIMEOUT_MS)
    assert w.model_info.spec.target == tiny_spec.target
    send(qtbot, w, "hello")
    assert w.store.messages(w.current_conv)[-1].status == STATUS_DONE


def test_a_kill_while_idle_is_said_without_a_request(qtbot, open_window, tiny_spec: ModelSpec,  # noqa: ANN001
                                                     tmp_path: Path):
    w = open_window(tmp_path / "db.sqlite3", tiny_spec)
    assert w.model_info is not None
    w.controller.worker.host.kill()  # an out-of-memory kill with nothing running
    qtbot.waitUntil(lambda: "engine process ended" in w.banner.text(), timeout=CRASH_TIMEOUT_MS)
    text = w.banner.text()
    assert "killed by SIGKILL" in text and "while idle with" in text and tiny_spec.target in text, text
    assert w.model_info is None and w.reload_button.isVisibleTo(w) and w.isVisible()
    qtbot.mouseClick(w.reload_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.model_info is not None and not w.loading, timeout=LOAD_TIMEOUT_MS)
    send(qtbot, w, "hello")
    assert w.store.messages(w.current_conv)[-1].status == STATUS_DONE
