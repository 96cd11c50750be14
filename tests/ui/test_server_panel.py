"""The Server panel (Tools menu): the local server on the model the window has loaded, sharing the
engine worker with the chat; the request log; off, unload and close."""

from __future__ import annotations

import threading
from pathlib import Path

import openai
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtTest import QTest

from app.server.service import model_id_of
from app.session.models import ModelSpec
from app.ui.server_panel import ServerPanel
from app.ui.tool_panels import SERVER
from tests.ui.conftest import LOAD_TIMEOUT_MS, REPLY_TIMEOUT_MS, hold_after_first_update, send

KEY = "panel-key"


def open_panel(w) -> ServerPanel:  # noqa: ANN001
    next(a for a in w.tools_menu.actions() if a.text() == SERVER).trigger()
    panel = w.tools.server_panel
    assert w.tools.server_dock.isVisible() and w.tools.server_dock.widget() is panel
    return panel


def client(panel: ServerPanel, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=panel.base_url, api_key=key, max_retries=0, timeout=REPLY_TIMEOUT_MS / 1000)


def test_the_server_panel_serves_the_loaded_model_next_to_the_chat(qtbot, open_window, tiny_spec: ModelSpec,  # noqa: ANN001
                                                                   tmp_path: Path) -> None:
    w = open_window(tmp_path / "db.sqlite3", tiny_spec, generation={"max_tokens": 12})
    panel = open_panel(w)
    assert not panel.serving and panel.base_url == ""
    panel.port.setValue(0)  # any free port
    panel.key.setText(KEY)
    panel.enabled.setChecked(True)
    assert panel.serving and panel.base_url.startswith("http://127.0.0.1:") and panel.base_url.endswith("/v1")
    assert not panel.port.isEnabled() and not panel.key.isEnabled()
    panel.copy_button.click()
    assert QGuiApplication.clipboard().text() == panel.base_url

    model = model_id_of(tiny_spec.target)
    assert [m.id for m in client(panel).models.list().data] == [model]
    with pytest.raises(openai.AuthenticationError):
        client(panel, "wrong").models.list()

    # a server request and a chat reply at once: both run in the engine worker, one after the other
    answers: list = []
    asking = threading.Thread(target=lambda: answers.append(client(panel).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hello there"}], max_tokens=12, temperature=0)))
    asking.start()
    send(qtbot, w, "hello there")
    asking.join(REPLY_TIMEOUT_MS / 1000)
    reply = w.store.messages(w.current_conv)[-1]
    assert reply.role == "assistant" and reply.content.strip()
    done = answers[0]
    assert done.choices[0].message.content and done.usage.completion_tokens == done.timings["predicted_n"]
    assert done.timings["draft_mode"] == "hybrid"

    qtbot.waitUntil(lambda: panel.log.rowCount() == 1, timeout=REPLY_TIMEOUT_MS)
    cells = [panel.log.item(0, c).text() for c in range(panel.log.columnCount())]
    assert cells[1] == "chat"
    assert cells[2] == f"{done.usage.prompt_tokens} + {done.usage.completion_tokens}"
    assert float(cells[3]) > 0 and cells[4] == f"{done.timings['tau']:.2f}" and cells[5] in ("stop", "length")

    # the model the app has loaded, or none: unloaded, the server says 503
    w.controller.unload()
    qtbot.waitUntil(lambda: w.controller.worker.served_model_id is None, timeout=LOAD_TIMEOUT_MS)
    assert client(panel).models.list().data == []
    with pytest.raises(openai.InternalServerError) as e:
        client(panel).chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 503

    url = panel.base_url
    panel.enabled.setChecked(False)
    assert not panel.serving and panel.base_url == "" and panel.port.isEnabled()
    with pytest.raises(openai.APIConnectionError):
        openai.OpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=5).models.list()


def test_a_taken_port_is_said_and_stopping_fails_what_waits(qtbot, open_window, tiny_spec: ModelSpec,  # noqa: ANN001
                                                            tmp_path: Path) -> None:
    w = open_window(tmp_path / "db.sqlite3", tiny_spec, generation={"max_tokens": 8})
    panel = open_panel(w)
    panel.port.setValue(0)
    panel.enabled.setChecked(True)
    port = int(panel.base_url.removesuffix("/v1").rsplit(":", 1)[1])

    second = ServerPanel(panel.executor)  # the same worker: a second server on the same port
    qtbot.addWidget(second)
    second.port.setValue(port)
    second.enabled.setChecked(True)
    assert not second.serving and not second.enabled.isChecked()
    assert "cannot listen" in second.status.text()

    # a server request waiting behind a chat reply (held mid-way) when the server stops: a 503 at
    # once, and the worker skips it afterwards
    release = hold_after_first_update(w)
    w.input.setPlainText("hello there")
    QTest.keyClick(w.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: w.busy_conv is not None, timeout=REPLY_TIMEOUT_MS)
    service = panel.service
    errors: list = []

    def waiting_request() -> None:
        try:
            client(panel, "none").completions.create(model=model_id_of(tiny_spec.target), prompt="a", max_tokens=4)
        except openai.APIStatusError as e:
            errors.append(e)

    waiting = threading.Thread(target=waiting_request)
    waiting.start()
    qtbot.waitUntil(lambda: service.pending == 1, timeout=REPLY_TIMEOUT_MS)
    panel.enabled.setChecked(False)
    waiting.join(30)
    assert [e.status_code for e in errors] == [503] and "stopping" in errors[0].message
    release.set()
    qtbot.waitUntil(lambda: w.busy_conv is None, timeout=REPLY_TIMEOUT_MS)
    assert w.store.messages(w.current_conv)[-1].content.strip()
    assert service.pending == 0 and len(service.records) == 0

    # closing the window while serving stops the server
    panel.enabled.setChecked(True)
    url = panel.base_url
    w.shutdown()
    assert not panel.serving
    with pytest.raises(openai.APIConnectionError):
        openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=5).models.list()
