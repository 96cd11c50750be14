"""Worker signals that reach the window after it shut down (queued before, delivered after) do
nothing and raise nothing: the store they would write to is closed by then."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QMetaMethod

from app.engine.stats import GenerationStats
from app.session.baseline import Baseline
from app.session.chat_session import ReplyUpdate
from app.session.models import ModelSpec
from app.session.summary import ReplySummary
from app.ui.main_window import MainWindow
from app.ui.shutdown_guard import skip_after_shutdown
from app.ui.status_text import NO_MODEL
from app.ui.worker import EngineWorker, ModelInfo


def _worker_signal_names() -> set[str]:
    meta = EngineWorker.staticMetaObject
    return {bytes(meta.method(i).name()).decode() for i in range(meta.methodOffset(), meta.methodCount())
            if meta.method(i).methodType() == QMetaMethod.MethodType.Signal}


def _one_of_each(conv_id: int, message_id: int) -> dict[str, tuple]:
    """Arguments for every signal the worker has, as it would send them."""
    info = ModelInfo(ModelSpec("/models/t.gguf", "/models/d.gguf"), "t.gguf + d.gguf", True, 8, "plain", 1024)
    update = ReplyUpdate(conversation_id=conv_id, message_id=message_id, delta="late", drafted_chars=0,
                         content="late", status="done", stats=GenerationStats(), summary=ReplySummary(), record={},
                         finish_reason="stop")
    return {
        "loadProgress": ("baseline", 1.0),
        "loaded": (info,),
        "loadFailed": ("the load failed",),
        "unloaded": (),
        "baselineReady": (Baseline(50.0, "measured here"),),
        "replyUpdate": (update,),
        "replyFailed": (conv_id, "the reply failed"),
        "replyEnded": (conv_id,),
        "devicesFound": (True,),
        "planReady": ({},),
        "planFailed": ("cannot plan t.gguf",),
        "engineCrashed": ("the engine process ended (killed by SIGABRT) while loading t.gguf",),
    }


def test_every_worker_signal_after_shutdown_does_nothing(qtbot, tmp_path: Path):  # noqa: ANN001
    w = MainWindow(tmp_path / "db.sqlite3", autoload=False)
    qtbot.addWidget(w)
    conv = w.new_conversation()
    msg = w.store.add_message(conv, "user", "hello")
    w.close()
    assert w.shut_down
    signals = _one_of_each(conv, msg.id)
    assert set(signals) == _worker_signal_names(), "a new worker signal: add it here (and guard its slot)"

    worker = w.controller.worker
    with qtbot.capture_exceptions() as raised:
        for name, args in signals.items():
            # emitted from this thread, so delivered at once, as a queued one is when the loop runs
            getattr(worker, name).emit(*args)
    assert raised == []
    assert w.model_info is None and w.model_status.text() == NO_MODEL
    assert not w.banner.isVisibleTo(w) and w.banner.text() == ""
    assert not w.model_panel.error_label.text()


def test_before_shutdown_the_same_signals_reach_the_window(qtbot, tmp_path: Path):  # noqa: ANN001
    w = MainWindow(tmp_path / "db.sqlite3", autoload=False)
    qtbot.addWidget(w)
    w.show()
    worker = w.controller.worker
    worker.loadFailed.emit("the load failed")
    assert w.banner.isVisibleTo(w) and w.banner.text() == "the load failed"
    assert w.model_panel.error_label.text() == "the load failed"
    w.shutdown()


def test_the_guard_passes_arguments_through_until_shutdown():
    class Owner:
        shut_down = False

        def __init__(self) -> None:
            self.got: list[tuple] = []

        @skip_after_shutdown
        def slot(self, a: int, b: str = "") -> None:
            self.got.append((a, b))

    o = Owner()
    o.slot(1, b="x")
    o.shut_down = True
    o.slot(2)
    assert o.got == [(1, "x")] and Owner.slot.__name__ == "slot"
