"""The real window on the bundled target (Gemma 3 270M Q4_K_M) with a random DFlash drafter."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from app.session.models import ModelSpec
from app.store.records import STATUS_DONE, STATUS_STOPPED
from tests.ui.conftest import REPLY_TIMEOUT_MS, hold_after_first_update, send

pytestmark = pytest.mark.gemma

# a fixed short draft keeps a CPU run cheap (a random drafter's full 262k head costs ~76 ms a pass)
GEMMA_SETTINGS = {"max_tokens": 8, "draft_length": 3}


def _replies(w):  # noqa: ANN001, ANN202
    return [x for x in w.chat_view.widgets if x.msg.role == "assistant"]


def test_gemma_chat_send_stop_regenerate_edit_restart(qtbot, open_window, gemma_target: Path,
                                                      gemma_random_drafter: Path, tmp_path: Path):
    db = tmp_path / "db.sqlite3"
    spec = ModelSpec(str(gemma_target), str(gemma_random_drafter), n_ctx=2048, n_threads=1)  # see tiny_spec
    w = open_window(db, spec, generation=GEMMA_SETTINGS)
    assert w.model_info.has_drafter and w.model_info.prompt_format.startswith("plain")
    updates = []
    w.controller.worker.replyUpdate.connect(updates.append)

    # send: the reply streams, the panel shows this reply's numbers
    send(qtbot, w, "What is the capital of France?")
    reply = w.store.messages(w.current_conv)[-1]
    assert reply.status == STATUS_DONE and reply.content.strip()
    assert len(updates) > 1 and updates[-1].content == reply.content
    s = updates[-1].summary
    ks = reply.stats["generation"]["k_history"]
    assert s.drafted == sum(ks) > 0 and max(ks) == 3  # the fixed draft length (less near max tokens)
    assert w.stats_panel.acceptance_chart.drafted[:3] == s.drafts_by_pos[:3] and s.drafts_by_pos[3] == 0
    assert w.stats_panel.tau_label.text() == f"{s.tau:.2f}"
    assert s.baseline_tokens_per_s and s.baseline_tokens_per_s > 0
    assert "measured" in w.stats_panel.speedup_label.text()
    assert "tok/s" in _replies(w)[0].stats_label.text()

    # stop mid-reply: the step in flight is the last one
    release = hold_after_first_update(w)
    n_before = len(updates)
    w.input.setPlainText("Name three colours.")
    QTest.keyClick(w.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: len(_replies(w)) == 2, timeout=REPLY_TIMEOUT_MS)
    qtbot.mouseClick(w.stop_button, Qt.MouseButton.LeftButton)
    release.set()
    qtbot.waitUntil(lambda: w.busy_conv is None, timeout=REPLY_TIMEOUT_MS)
    assert len(updates) - n_before == 2 and updates[-1].finish_reason == "cancelled"
    stopped = w.store.messages(w.current_conv)[-1]
    assert stopped.status == STATUS_STOPPED and stopped.content == updates[-2].content

    # regenerate the stopped reply
    qtbot.mouseClick(w.regenerate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.busy_conv is None and w.store.messages(w.current_conv)[-1].id != stopped.id,
                    timeout=REPLY_TIMEOUT_MS)
    msgs = w.store.messages(w.current_conv)
    assert [m.role for m in msgs] == ["user", "assistant", "user", "assistant"]
    assert msgs[-1].status == STATUS_DONE and msgs[-1].content.strip()

    # edit the first question and resend: the later turns go
    first = w.chat_view.widgets[0]
    qtbot.mouseClick(first.edit_button, Qt.MouseButton.LeftButton)
    first.editor.setPlainText("What is the capital of Italy?")
    qtbot.mouseClick(first.save_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.busy_conv is None and len(w.store.messages(w.current_conv)) == 2,
                    timeout=REPLY_TIMEOUT_MS)
    msgs = w.store.messages(w.current_conv)
    assert msgs[0].content == "What is the capital of Italy?" and msgs[1].status == STATUS_DONE
    conv, line = w.current_conv, _replies(w)[0].stats_label.text()
    w.close()

    # restart: a new window on the same database finds the conversation and its stats
    w2 = open_window(db, None)
    assert w2.current_conv == conv
    assert [x.msg.id for x in w2.chat_view.widgets] == [m.id for m in msgs]
    assert _replies(w2)[0].stats_label.text() == line
    assert w2.stats_panel.tau_label.text() != "–"


def test_gemma_drafter_on_another_target_is_refused_and_the_app_keeps_working(
        qtbot, open_window, tiny_spec: ModelSpec, gemma_random_drafter: Path, tmp_path: Path):
    w = open_window(tmp_path / "db.sqlite3", tiny_spec, generation={"max_tokens": 16})
    w.model_panel.drafter_edit.setText(str(gemma_random_drafter))
    qtbot.mouseClick(w.model_panel.load_button, Qt.MouseButton.LeftButton)
    # wait on the label itself: loadFailed is emitted on the worker thread and reaches
    # the window's slot later, through the event loop
    qtbot.waitUntil(lambda: bool(w.model_panel.error_label.text()), timeout=REPLY_TIMEOUT_MS)
    assert str(gemma_random_drafter) in w.model_panel.error_label.text()
    assert w.model_panel.error_label.isVisibleTo(w) and w.banner.isVisibleTo(w)
    send(qtbot, w, "still here")
    assert w.store.messages(w.current_conv)[-1].status == STATUS_DONE
