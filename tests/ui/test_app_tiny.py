"""The real window with the real engine on a tiny random pair: every chat action end to end."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from app.session.models import ModelSpec
from app.store import Store
from app.store.records import STATUS_DONE, STATUS_STOPPED
from app.ui.chat_view import MessageWidget
from tests.ui.conftest import REPLY_TIMEOUT_MS, hold_after_first_update, send

SHORT = {"max_tokens": 40}  # tiny random models ramble: keep replies short


def _assistant_widgets(w):  # noqa: ANN001, ANN202
    return [x for x in w.chat_view.widgets if x.msg.role == "assistant"]


def test_send_streams_a_reply_and_updates_the_stats_panel(qtbot, open_window, tiny_spec, tmp_path: Path):
    w = open_window(tmp_path / "db.sqlite3", tiny_spec, generation=SHORT)
    assert w.model_info.has_drafter and w.model_info.block_size == 8
    assert "measured here" in w.stats_panel.baseline_label.text()
    updates = []
    w.controller.worker.replyUpdate.connect(updates.append)
    send(qtbot, w, "hello there")

    assert len(updates) > 1, "the reply should stream in several steps"
    assert [m.role for m in w.msg_model.messages()] == ["user", "assistant"]
    reply = _assistant_widgets(w)[0]
    stored = w.store.messages(w.current_conv)[-1]
    assert stored.status == STATUS_DONE and stored.content == updates[-1].content
    assert reply.plain_text().strip() == stored.content.strip() != ""
    # the stats panel shows the last step's numbers, which the session computed
    s = updates[-1].summary
    assert w.stats_panel.tau_label.text() == f"{s.tau:.2f}"
    assert s.drafted > 0 and sum(w.stats_panel.acceptance_chart.drafted) > 0
    assert w.stats_panel.sparkline.points == updates[-1].tps_series and len(updates[-1].tps_series) > 1
    assert "measured" in w.stats_panel.speedup_label.text()
    assert w.stats_panel.state_label.text().startswith("Finished")
    # where the tokens came from: the shares of the sources that produced them, and a row each
    assert sum(w.stats_panel.source_bar.parts.values()) == pytest.approx(1.0)
    for src in s.sources_used:
        assert {"lookup": "context lookup", "dflash": "DFlash drafter"}[src] in w.stats_panel.source_label.text()
    # the reply keeps its own stats, shown under it, with the sources that drafted it
    assert "tok/s" in reply.stats_label.text() and "τ" in reply.stats_label.text()
    assert s.sources_used and "drafted by" in reply.stats_label.text()
    # the first message named the chat
    assert w.conv_model.conversation_at(0).title == "hello there"


def test_the_window_is_sent_fewer_updates_than_steps_and_loses_no_text(qtbot, open_window, tiny_spec,
                                                                          tmp_path: Path):
    # a tiny pair decodes a step in well under UPDATE_INTERVAL_S: most steps reach the window inside a
    # later update, whose delta carries their text
    w = open_window(tmp_path / "db.sqlite3", tiny_spec, generation={"max_tokens": 200})
    updates = []
    w.controller.worker.replyUpdate.connect(updates.append)
    send(qtbot, w, "tell me a story")
    stored = w.store.messages(w.current_conv)[-1]
    steps = len(stored.stats["generation"]["k_history"])
    assert 2 <= len(updates) < steps, (len(updates), steps)
    assert "".join(u.delta for u in updates) == updates[-1].content == stored.content


def test_stop_takes_effect_within_one_step(qtbot, open_window, tiny_spec, tmp_path: Path):
    w = open_window(tmp_path / "db.sqlite3", tiny_spec, generation=SHORT)
    w.settings_panel.max_tokens.setValue(400)
    w.settings_panel.draft_length.setCurrentIndex(w.settings_panel.draft_length.findData(2))
    release = hold_after_first_update(w)
    steps = []
    w.controller.worker.replyUpdate.connect(steps.append)
    w.input.setPlainText("tell me a story")
    QTest.keyClick(w.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: len(_assistant_widgets(w)) == 1, timeout=REPLY_TIMEOUT_MS)
    assert w.stop_button.isEnabled()
    qtbot.mouseClick(w.stop_button, Qt.MouseButton.LeftButton)
    release.set()
    qtbot.waitUntil(lambda: w.busy_conv is None, timeout=REPLY_TIMEOUT_MS)

    # the step in flight when Stop was pressed ends the reply: one more event, the cancellation
    assert len(steps) == 2 and steps[-1].finish_reason == "cancelled"
    msg = w.store.messages(w.current_conv)[-1]
    assert msg.status == STATUS_STOPPED and msg.content == steps[0].content
    assert "stopped" in _assistant_widgets(w)[0].status_label.text()
    assert w.send_button.isEnabled() and not w.stop_button.isEnabled()


def test_regenerate_replaces_the_last_reply(qtbot, open_window, tiny_spec, tmp_path: Path):
    w = open_window(tmp_path / "db.sqlite3", tiny_spec, generation=SHORT)
    send(qtbot, w, "hello")
    first = w.store.messages(w.current_conv)[-1]
    qtbot.mouseClick(w.regenerate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.busy_conv is None and w.store.messages(w.current_conv)[-1].id != first.id,
                    timeout=REPLY_TIMEOUT_MS)
    msgs = w.store.messages(w.current_conv)
    assert [m.role for m in msgs] == ["user", "assistant"]
    assert msgs[-1].status == STATUS_DONE and msgs[-1].stats is not None
    # greedy decoding: the same answer again, from the same prompt
    assert msgs[-1].content == first.content
    assert len(w.chat_view.widgets) == 2


def test_edit_and_resend_drops_later_messages(qtbot, open_window, tiny_spec, tmp_path: Path):
    w = open_window(tmp_path / "db.sqlite3", tiny_spec, generation=SHORT)
    send(qtbot, w, "first question")
    send(qtbot, w, "second question")
    assert len(w.store.messages(w.current_conv)) == 4
    # a rebuilt transcript leaves no stale widget behind (deleteLater alone waits for the main loop)
    assert len(w.chat_view._inner.findChildren(MessageWidget, options=Qt.FindChildOption.FindDirectChildrenOnly)) == 4
    first_user = w.chat_view.widgets[0]
    qtbot.mouseClick(first_user.edit_button, Qt.MouseButton.LeftButton)
    assert first_user.editor.isVisible()
    first_user.editor.setPlainText("another question")
    qtbot.mouseClick(first_user.save_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.busy_conv is None and len(w.store.messages(w.current_conv)) == 2,
                    timeout=REPLY_TIMEOUT_MS)
    msgs = w.store.messages(w.current_conv)
    assert [(m.role, m.status) for m in msgs] == [("user", STATUS_DONE), ("assistant", STATUS_DONE)]
    assert msgs[0].content == "another question"
    assert [x.msg.id for x in w.chat_view.widgets] == [m.id for m in msgs]


def test_restart_reopens_the_conversation_with_its_stats(qtbot, open_window, tiny_spec, tmp_path: Path):
    db = tmp_path / "db.sqlite3"
    w = open_window(db, tiny_spec, generation=SHORT)
    send(qtbot, w, "remember me")
    conv, reply = w.current_conv, w.store.messages(w.current_conv)[-1]
    stats_line = _assistant_widgets(w)[0].stats_label.text()
    tau_text = w.stats_panel.tau_label.text()
    w.input.setPlainText("an unsent draft")
    w.close()

    w2 = open_window(db, None)  # a new window on the same database; the saved model choice is not loaded
    assert w2.current_conv == conv and w2.sidebar.selected_id() == conv
    assert [x.msg.id for x in w2.chat_view.widgets] == [reply.id - 1, reply.id]
    again = _assistant_widgets(w2)[0]
    again.flush()
    assert again.plain_text().strip() == reply.content.strip()
    assert again.stats_label.text() == stats_line
    assert w2.stats_panel.tau_label.text() == tau_text
    assert w2.input.toPlainText() == "an unsent draft"
    assert w2.store.get_setting("model")["target"] == tiny_spec.target


def test_mismatched_drafter_shows_the_error_and_the_app_keeps_working(qtbot, open_window, tiny_spec,
                                                                     tmp_path: Path):
    from gguf_tools.synth import TinyShape, write_tiny_pair

    _, other_drafter = write_tiny_pair(tmp_path / "other", "qwen3", shape=TinyShape(n_embd=32, head_dim=8))
    w = open_window(tmp_path / "db.sqlite3", tiny_spec, generation=SHORT)
    failures = []
    w.controller.worker.loadFailed.connect(failures.append)
    w.model_panel.drafter_edit.setText(str(other_drafter))
    qtbot.mouseClick(w.model_panel.load_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: bool(failures), timeout=REPLY_TIMEOUT_MS)

    err = w.model_panel.error_label
    assert err.isVisibleTo(w) and str(other_drafter) in err.text() and "hidden size differs" in err.text()
    assert w.banner.isVisibleTo(w) and "hidden size differs" in w.banner.text()
    assert w.model_panel.load_button.isEnabled()
    # the pair that was loaded still answers
    send(qtbot, w, "still there")
    assert w.store.messages(w.current_conv)[-1].status == STATUS_DONE
    assert not w.banner.isVisibleTo(w)


def test_settings_persist_and_can_be_overridden_per_chat(qtbot, open_window, tiny_spec, tmp_path: Path):
    db = tmp_path / "db.sqlite3"
    w = open_window(db, tiny_spec, generation=SHORT)
    send(qtbot, w, "one")
    w.settings_panel.max_tokens.setValue(7)
    w.settings_panel.override.setChecked(True)
    w.settings_panel.draft_length.setCurrentIndex(w.settings_panel.draft_length.findData(3))
    w.settings_panel.system_prompt.setPlainText("be brief")
    assert w.settings_for(w.current_conv).draft_length == 3
    assert w.settings_for(None).max_tokens == 7 and w.settings_for(None).draft_length == "auto"
    send(qtbot, w, "two")
    st = w.store.messages(w.current_conv)[-1].stats["generation"]
    assert st["n_generated"] <= 7 and max(st["k_history"]) <= 3
    w.close()

    w2 = open_window(db, None)
    assert w2.settings_panel.override.isChecked() and w2.settings_panel.draft_length.currentData() == 3
    assert w2.settings_panel.system_prompt.toPlainText() == "be brief"
    assert w2.global_settings.max_tokens == 7
    w2.new_conversation()
    assert not w2.settings_panel.override.isChecked() and w2.settings_panel.draft_length.currentData() == "auto"


def test_sidebar_new_rename_search_delete(qtbot, open_window, tmp_path: Path):
    w = open_window(tmp_path / "db.sqlite3", None)
    a = w.new_conversation()
    w.store.add_message(a, "user", "about lighthouses")
    b = w.new_conversation()
    qtbot.waitUntil(lambda: w.current_conv == b)
    w.conv_model.setData(w.conv_model.index(w.conv_model.row_of(b)), "renamed chat")
    assert w.store.conversation(b).title == "renamed chat"
    w.sidebar.search.setText("lighthouse")
    assert w.conv_model.rowCount() == 1 and w.conv_model.conversation_at(0).id == a
    w.sidebar.search.setText("")
    w.sidebar.select(b)
    qtbot.mouseClick(w.sidebar.delete_button, Qt.MouseButton.LeftButton)
    assert [c.id for c in w.store.conversations()] == [a] and w.current_conv == a


def test_sending_without_a_model_keeps_the_message(qtbot, open_window, tmp_path: Path):
    w = open_window(tmp_path / "db.sqlite3", None)
    w.input.setPlainText("is anyone there")
    QTest.keyClick(w.input, Qt.Key.Key_Return)
    assert "no model is loaded" in w.banner.text()
    assert [m.content for m in w.store.messages(w.current_conv)] == ["is anyone there"]
    assert w.input.toPlainText() == "" and w.send_button.isEnabled()


def test_colour_drafted_tokens_view(qtbot, open_window, tiny_spec, tmp_path: Path):
    w = open_window(tmp_path / "db.sqlite3", tiny_spec, generation=SHORT)
    send(qtbot, w, "hello")
    reply = _assistant_widgets(w)[0]
    # a random drafter is rarely right; mark a span as drafted to see the view draw it
    w.store.update_message(reply.msg.id, drafted_spans=[[0, 2]])
    w.msg_model.reload()
    w.colour_action.setChecked(True)
    reply = _assistant_widgets(w)[0]
    assert "background-color" in reply.body.toHtml()
    w.colour_action.setChecked(False)
    assert Store(tmp_path / "db.sqlite3").get_setting("colour_drafts") is False


def test_model_spec_round_trip():
    spec = ModelSpec("/m/t.gguf", None, 2048, "gpu")
    assert ModelSpec.from_dict(spec.to_dict()) == spec and spec.mtp
    off = ModelSpec("/m/t.gguf", mtp=False)
    assert ModelSpec.from_dict(off.to_dict()) == off
    assert ModelSpec.from_dict({"target": "/m/t.gguf"}).mtp  # a spec saved before the switch: the head on
    assert spec.label == "t.gguf"


def test_unload_then_send_says_no_model_and_keeps_the_message(qtbot, open_window, tiny_spec, tmp_path: Path):
    w = open_window(tmp_path / "db.sqlite3", tiny_spec, generation=SHORT)
    qtbot.mouseClick(w.model_panel.unload_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.model_info is None, timeout=REPLY_TIMEOUT_MS)
    assert w.model_status.text() == "no model loaded"
    w.input.setPlainText("anyone")
    QTest.keyClick(w.input, Qt.Key.Key_Return)
    assert "no model is loaded" in w.banner.text()
    assert [m.content for m in w.store.messages(w.current_conv)] == ["anyone"]
