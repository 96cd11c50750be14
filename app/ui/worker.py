"""The engine in a worker QObject on its own QThread (GPT4All's ChatLLM shape).

The UI never touches the engine: it emits request signals (queued into the
worker thread) and receives snapshots (ReplyUpdate, Baseline, SplitPlan)
through queued signals; whatever loads native libraries or probes devices
runs here too. Stop is a threading.Event per request, set directly from the
UI thread, because the worker is busy inside the decode loop and only checks
the event between steps.

The local server (app.server) runs its generations here too, on the loaded
pair: WorkerExecutor queues each job into this thread (run_job), behind or
ahead of the chat's replies, so one thread alone ever touches the engine.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.errors import FlashDeskError
from app.server.service import Job, ServedModel, model_id_of
from app.session.chat_session import ChatSession
from app.session.documents import ChatDocuments
from app.session.models import ModelSpec, bundled_spec, check_spec, gpu_available, load_engine, plan_for
from app.session.settings import ChatSettings
from app.store import Store


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


@dataclass
class ModelInfo:
    spec: ModelSpec
    label: str
    has_drafter: bool
    block_size: int
    prompt_format: str
    n_ctx: int


class EngineWorker(QObject):
    """Lives in the worker thread; owns the Engine, the ChatSession and its own Store connection."""

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

    def __init__(self, db_path: Path, documents_db: Path | None = None):
        super().__init__()
        self._db_path = db_path
        self._documents_db = documents_db  # the documents index chats with collections retrieve from
        self._store: Store | None = None
        self._engine = None
        self._session: ChatSession | None = None
        # the id the local server names the loaded model by; read from the server's thread
        self.served_model_id: str | None = None

    def _the_store(self) -> Store:
        if self._store is None:  # opened in the worker thread: sqlite connections stay in their thread
            self._store = Store(self._db_path)
        return self._store

    @Slot()
    def probe_devices(self) -> None:
        try:
            self.devicesFound.emit(gpu_available())
        except (OSError, FlashDeskError):
            self.devicesFound.emit(False)

    @Slot(object)
    def load(self, req: LoadRequest) -> None:
        if req.cancel.is_set():  # superseded by a newer load before it started
            return
        try:
            spec = req.spec or bundled_spec()
            # from the headers, before the loaded pair is given up: a mismatch keeps the old one working
            checked = check_spec(spec)

            def progress(stage: str, frac: float) -> bool:
                self.loadProgress.emit(stage, float(frac))
                return not req.cancel.is_set()

            self._close_engine()
            engine = load_engine(spec, progress, checked)
        except (FlashDeskError, OSError, ValueError) as e:
            if not req.cancel.is_set():  # a superseded load's "cancelled" is no news to the user
                self.loadFailed.emit(str(e))
            return
        self._engine = engine
        self._session = ChatSession(engine, self._the_store(), documents=ChatDocuments(self._documents_db))
        self.served_model_id = model_id_of(spec.target)
        self.loaded.emit(ModelInfo(spec, self._session.model_label, engine.has_drafter,
                                   engine.block_size, self._session.format.name, engine.n_ctx))
        if req.calibrate and engine.has_drafter:
            self._calibrate()
        self.loadProgress.emit("baseline", 0.0)
        try:
            self.baselineReady.emit(self._session.measure_baseline())
        except FlashDeskError as e:
            self.loadFailed.emit(f"measuring the plain-decoding baseline failed: {e}")
        self.loadProgress.emit("baseline", 1.0)

    def _calibrate(self) -> None:
        """Measure (or read from the on-disk cache) the cost model "auto" needs, while the user
        watches the load progress, instead of silently at the first reply."""
        self.loadProgress.emit("calibrating", -1.0)  # -1: no fraction known
        try:
            self._session.calibrate()
        except FlashDeskError as e:
            self.loadFailed.emit(f"calibrating the draft-length costs failed: {e}")

    @Slot(object)
    def plan(self, spec: ModelSpec) -> None:
        """Plan `spec` on this machine's devices (detecting them loads the native libraries)."""
        try:
            self.planReady.emit(plan_for(spec))
        except FlashDeskError as e:
            self.planFailed.emit(f"cannot plan {spec.label}: {e}")
        except Exception as e:  # a bad path or an unreadable GGUF: said in the window, the app goes on
            self.planFailed.emit(f"cannot plan {spec.label}: {type(e).__name__}: {e}")

    @Slot()
    def unload(self) -> None:
        self._close_engine()
        self.unloaded.emit()

    @Slot(object)
    def generate(self, req: ReplyRequest) -> None:
        try:
            if self._session is None:
                raise FlashDeskError("no model is loaded: load one in the Model tab")
            if req.cancel.is_set():
                return
            for update in self._session.reply(req.conversation_id, req.settings, req.cancel):
                self.replyUpdate.emit(update)
        except FlashDeskError as e:
            self.replyFailed.emit(req.conversation_id, str(e))
        except Exception as e:  # keep the app alive on any engine error; the message says what happened
            self.replyFailed.emit(req.conversation_id, f"{type(e).__name__}: {e}")
        finally:
            self.replyEnded.emit(req.conversation_id)

    @Slot(object)
    def run_job(self, job: Job) -> None:
        """A local server's generation, on the loaded pair with the chat session's draft controller."""
        session = self._session
        job.run(lambda: ServedModel.for_session(session) if session is not None else None)

    @Slot()
    def shutdown(self) -> None:
        self._close_engine()
        if self._store is not None:
            self._store.close()
            self._store = None
        QThread.currentThread().quit()

    def _close_engine(self) -> None:
        self.served_model_id = None
        if self._session is not None:
            self._session.close()
        if self._engine is not None:
            self._engine.close()
        self._engine = None
        self._session = None


class EngineController(QObject):
    """The UI thread's handle on the worker: request signals out, the worker's signals in."""

    _loadRequested = Signal(object)
    _unloadRequested = Signal()
    _generateRequested = Signal(object)
    _shutdownRequested = Signal()
    _probeRequested = Signal()
    _planRequested = Signal(object)
    _jobRequested = Signal(object)

    def __init__(self, db_path: Path, parent: QObject | None = None, documents_db: Path | None = None):
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName("flashdesk-engine")
        self.worker = EngineWorker(db_path, documents_db)
        self.worker.moveToThread(self.thread)
        self._loadRequested.connect(self.worker.load)
        self._unloadRequested.connect(self.worker.unload)
        self._generateRequested.connect(self.worker.generate)
        self._shutdownRequested.connect(self.worker.shutdown)
        self._probeRequested.connect(self.worker.probe_devices)
        self._planRequested.connect(self.worker.plan)
        self._jobRequested.connect(self.worker.run_job)
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
