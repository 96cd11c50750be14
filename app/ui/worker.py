"""The engine's proxy: a worker QObject on its own QThread, talking to the engine process.

llama.cpp runs in a child process (app.host): an abort, a segfault or an
out-of-memory kill there ends that process only, and the window says which
model, how it ended and llama.cpp's last line (engineCrashed). The worker
thread sends one request at a time to it and turns its messages into the
signals below, so the UI never waits on the engine. Stop is a
threading.Event per request, set directly from the UI thread; the worker
passes it on to the child at once (the child stops after its step in flight;
it runs at most REPLY_WINDOW updates ahead of what was shown, and sends a
reply's steps at most every UPDATE_INTERVAL_S: the store has each one).

The local server (app.server) runs its generations there too, on the loaded
pair: WorkerExecutor queues each job into this thread (run_job), behind or
ahead of the chat's replies, and the job's reports come back from the child.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, QThread, QTimer, Signal, Slot

from app.errors import FlashDeskError
from app.host.process import EngineCrashed, EngineProcess
from app.host.protocol import (
    Failed,
    JobReport,
    Load,
    Loaded,
    LoadProgress,
    ModelInfo,
    Plan,
    ProbeDevices,
    Reply,
    Result,
    ServeJob,
    Unload,
)
from app.server.errors import server_error
from app.server.service import ENDED, Job, model_id_of
from app.server.service import Failed as JobFailed
from app.session.chat_session import ReplyUpdate
from app.session.models import ModelSpec
from app.session.settings import ChatSettings
from app.store import Store

# steps the engine process may decode ahead of the window's acks (app.host.protocol.Reply.window): 0 costs
# ~1.3 ms a token more on a loaded 2-core CPU (each step waits for this thread, which shares a GIL with the UI);
# 4 keeps a stuck window from falling far behind (notes/notes.md, "The engine process")
REPLY_WINDOW = 4
WATCH_MS = 1000  # how often an idle engine process is checked for life

__all__ = ["EngineController", "EngineWorker", "LoadRequest", "ModelInfo", "ReplyRequest", "WorkerExecutor"]


@dataclass
class ReplyRequest:
    conversation_id: int
    settings: ChatSettings
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass
class LoadRequest:
    spec: ModelSpec | None  # None: the bundled pair
    calibrate: bool = False  # measure the adaptive policy's costs now (draft length "auto" is in use)
    cancel: threading.Event = field(default_factory=threading.Event)


class EngineWorker(QObject):
    """Lives in the worker thread; owns the engine process and a Store connection (for marking a reply
    the process left streaming when it died)."""

    loadProgress = Signal(str, float)  # stage ("target", "drafter", "baseline"), fraction 0..1
    loaded = Signal(object)  # ModelInfo
    loadFailed = Signal(str)
    unloaded = Signal()
    baselineReady = Signal(object)  # app.session.baseline.Baseline
    replyUpdate = Signal(object)  # ReplyUpdate
    replyFailed = Signal(int, str)  # conversation id, message
    replyEnded = Signal(int)  # conversation id: always sent last, after an update, a failure or nothing
    devicesFound = Signal(bool)  # a GPU is usable
    planReady = Signal(object)  # app.scheduler.SplitPlan for the ModelSpec asked
    planFailed = Signal(str)
    engineCrashed = Signal(str)  # the engine process died: what it ran, how it ended, llama.cpp's last line

    def __init__(self, db_path: Path, documents_db: Path | None = None, reply_window: int = REPLY_WINDOW):
        super().__init__()
        self._db_path = db_path
        self.host = EngineProcess(db_path, documents_db)
        self.reply_window = reply_window  # steps the child may decode ahead of the window (Reply.window)
        self._store: Store | None = None
        self.last_crash: EngineCrashed | None = None
        # the id the local server names the loaded model by; read from the server's thread
        self.served_model_id: str | None = None
        # between requests, a look at whether the process still lives (an out-of-memory kill while idle is
        # said at once, not at the next message); it cannot fire during a request: this thread is in it
        self._watch = QTimer(self)
        self._watch.setInterval(WATCH_MS)
        self._watch.timeout.connect(self._check_idle)

    def _the_store(self) -> Store:
        if self._store is None:  # opened in the worker thread: sqlite connections stay in their thread
            self._store = Store(self._db_path)
        return self._store

    @Slot()
    def start_watching(self) -> None:
        self._watch.start()

    @Slot()
    def _check_idle(self) -> None:
        crash = self.host.died()
        if crash is not None:
            self._crashed(crash)

    def _crashed(self, crash: EngineCrashed) -> None:
        self.last_crash = crash
        self.served_model_id = None
        self.engineCrashed.emit(str(crash))

    def _ask(self, msg: object, cancel: threading.Event | None = None,
             on_message: Callable[[object], None] | None = None) -> bool:
        """Run one request in the engine process; False if the process died (engineCrashed said so)."""
        try:
            self.host.request(msg, on_message or self._dispatch, cancel)
            return True
        except EngineCrashed as e:
            self._crashed(e)
        except OSError as e:  # the process could not be started at all
            self._crashed(EngineCrashed(f"cannot start the engine process: {e}", "the engine process did not start"))
        return False

    def _dispatch(self, m: object) -> None:
        """The child's messages as this worker's signals."""
        if isinstance(m, ReplyUpdate):
            self.replyUpdate.emit(m)
        elif isinstance(m, LoadProgress):
            self.loadProgress.emit(m.stage, m.fraction)
        elif isinstance(m, Loaded):
            self.host.loaded_as(m.info.spec)
            self.served_model_id = model_id_of(m.info.spec.target)
            self.loaded.emit(m.info)
        elif isinstance(m, Failed):
            if m.kind == "reply":
                self.replyFailed.emit(m.conversation_id, m.message)
            elif m.kind == "plan":
                self.planFailed.emit(m.message)
            elif m.kind == "devices":
                self.devicesFound.emit(False)
            else:
                self.loadFailed.emit(m.message)
        elif isinstance(m, Result):
            if m.kind == "baseline":
                self.baselineReady.emit(m.value)
            elif m.kind == "plan":
                self.planReady.emit(m.value)
            elif m.kind == "devices":
                self.devicesFound.emit(bool(m.value))
            elif m.kind == "unloaded":
                self.host.forget_model()
                self.served_model_id = None
                self.unloaded.emit()

    @Slot()
    def probe_devices(self) -> None:
        if not self._ask(ProbeDevices()):
            self.devicesFound.emit(False)

    @Slot(object)
    def load(self, req: LoadRequest) -> None:
        if req.cancel.is_set():  # superseded by a newer load before it started
            return
        self._ask(Load(req.spec, req.calibrate), req.cancel)

    @Slot(object)
    def plan(self, spec: ModelSpec) -> None:
        """Plan `spec` on this machine's devices (detecting them loads the native libraries: in the child)."""
        self._ask(Plan(spec))

    @Slot()
    def unload(self) -> None:
        self._ask(Unload())

    @Slot(object)
    def generate(self, req: ReplyRequest) -> None:
        try:
            if req.cancel.is_set():
                return
            if not self._ask(Reply(req.conversation_id, req.settings, self.reply_window), req.cancel):
                self._mark_interrupted(req.conversation_id)
        finally:
            self.replyEnded.emit(req.conversation_id)

    def _mark_interrupted(self, conv_id: int) -> None:
        """The child died mid-reply: its last stored step stays, marked interrupted (not streaming)."""
        try:
            self._the_store().mark_interrupted(conv_id, self.last_crash.short)
        except FlashDeskError as e:  # the disk is full too: the next start marks it (recover_interrupted)
            self.replyFailed.emit(conv_id, str(e))

    @Slot(object)
    def run_job(self, job: Job) -> None:
        """A local server's generation, in the engine process on the loaded pair (the chat session's
        draft controller); its reports come back to the job here."""
        job.relay(self._relay)

    def _relay(self, job: Job) -> None:
        def on_message(m: object) -> None:
            if isinstance(m, JobReport):
                job.report(m.item)
            elif isinstance(m, Failed):
                job.report(JobFailed(server_error(m.message)))

        if not self._ask(ServeJob(job.request, job.max_tokens), job.cancel, on_message) and job.state != ENDED:
            job.report(JobFailed(server_error(self.last_crash.short)))

    @Slot()
    def shutdown(self) -> None:
        self._watch.stop()
        self.served_model_id = None
        self.host.close()
        if self._store is not None:
            self._store.close()
            self._store = None
        QThread.currentThread().quit()


class EngineController(QObject):
    """The UI thread's handle on the worker: request signals out, the worker's signals in."""

    _loadRequested = Signal(object)
    _unloadRequested = Signal()
    _generateRequested = Signal(object)
    _shutdownRequested = Signal()
    _probeRequested = Signal()
    _planRequested = Signal(object)
    _jobRequested = Signal(object)

    def __init__(self, db_path: Path, parent: QObject | None = None, documents_db: Path | None = None,
                 reply_window: int = REPLY_WINDOW):
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName("flashdesk-engine")
        self.worker = EngineWorker(db_path, documents_db, reply_window)
        self.worker.moveToThread(self.thread)
        self._loadRequested.connect(self.worker.load)
        self._unloadRequested.connect(self.worker.unload)
        self._generateRequested.connect(self.worker.generate)
        self._shutdownRequested.connect(self.worker.shutdown)
        self._probeRequested.connect(self.worker.probe_devices)
        self._planRequested.connect(self.worker.plan)
        self._jobRequested.connect(self.worker.run_job)
        self.thread.started.connect(self.worker.start_watching)
        self.current_reply: ReplyRequest | None = None
        self.current_load: LoadRequest | None = None
        self.thread.start()

    def probe_devices(self) -> None:
        self._probeRequested.emit()

    def plan(self, spec: ModelSpec) -> None:
        """Plan `spec` in the worker thread: planReady or planFailed answers (after a load or reply in flight)."""
        self._planRequested.emit(spec)

    def load(self, spec: ModelSpec | None, calibrate: bool = False) -> None:
        if self.current_load is not None:
            self.current_load.cancel.set()  # a newer choice wins over a load still running
        self.current_load = LoadRequest(spec, calibrate)
        self._loadRequested.emit(self.current_load)

    def unload(self) -> None:
        self._unloadRequested.emit()

    def generate(self, conv_id: int, settings: ChatSettings) -> ReplyRequest:
        self.current_reply = ReplyRequest(conv_id, settings)
        self._generateRequested.emit(self.current_reply)
        return self.current_reply

    def stop(self) -> None:
        """Stop the running reply after the current step (also one not started yet)."""
        if self.current_reply is not None:
            self.current_reply.cancel.set()

    def submit_job(self, job: Job) -> None:
        """Queue a local server's generation into the worker thread (callable from any thread)."""
        self._jobRequested.emit(job)

    def shutdown(self, timeout_ms: int = 30000) -> None:
        """Stop everything, free the engine in its thread, and join the thread."""
        self.stop()
        if self.current_load is not None:
            self.current_load.cancel.set()
        if self.thread.isRunning():
            self._shutdownRequested.emit()
            self.thread.wait(timeout_ms)


class WorkerExecutor:
    """The local server's EngineExecutor over the app's engine worker: the model the app has
    loaded, its jobs run in the worker thread."""

    def __init__(self, controller: EngineController):
        self._controller = controller

    def model_id(self) -> str | None:
        return self._controller.worker.served_model_id

    def submit(self, job: Job) -> None:
        self._controller.submit_job(job)
