"""The engine process: `python -m app.host.child FD DB [DOCUMENTS_DB]`, started by app.host.process.

It owns the Engine, the ChatSession and its own Store connection (SQLite WAL
takes two processes); a reply's steps are written to the store here, before
they are sent, as in-process, so a crash loses nothing the window showed.
llama.cpp's stderr (where a GGML_ASSERT lands) goes to the log file the parent
opened for it. The main thread runs one request at a time; a reader thread
takes the parent's Cancel and Ack while it decodes.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from app.errors import FlashDeskError
from app.host.abort_hook import abort_here_if_asked
from app.host.protocol import (
    UPDATE_INTERVAL_S,
    Ack,
    Cancel,
    Done,
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
    Shutdown,
    Unload,
)
from app.server.service import GenerationService, Job, ModelProvider, ServedModel
from app.session.chat_session import ChatSession
from app.session.documents import ChatDocuments
from app.session.draft_sources import draft_source_lines
from app.session.models import bundled_spec, check_spec, gpu_available, load_engine, plan_for
from app.store import Store

_KIND = {Load: "load", Unload: "load", Reply: "reply", Plan: "plan", ProbeDevices: "devices", ServeJob: "job"}


@dataclass
class Flow:
    """What the reader thread hands the running request: its cancel event and its step credits."""
    cancel: threading.Event = field(default_factory=threading.Event)
    acks: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))


class Host:
    def __init__(self, conn: Connection, db_path: Path, documents_db: Path | None):
        self._conn = conn
        self._db_path = db_path
        self._documents_db = documents_db
        self._store: Store | None = None
        self._engine = None
        self._session: ChatSession | None = None
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._flow = Flow()
        threading.Thread(target=self._read, name="flashdesk-host-reader", daemon=True).start()

    def _read(self) -> None:
        """Requests go to the main thread; Cancel and Ack act on the request running now."""
        while True:
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):  # the app is gone: stop the step in flight, then exit
                self._flow.cancel.set()
                self._flow.acks.release(1 << 20)
                self._requests.put((Shutdown(), self._flow))
                return
            if isinstance(msg, Cancel):
                self._flow.cancel.set()
            elif isinstance(msg, Ack):
                self._flow.acks.release()
            else:  # a new request: the parent sends it only after the last one's Done
                self._flow = Flow(acks=threading.Semaphore(getattr(msg, "window", 0)))
                self._requests.put((msg, self._flow))

    def send(self, msg: object) -> None:
        self._conn.send(msg)

    def serve(self) -> None:
        while True:
            req, flow = self._requests.get()
            if isinstance(req, Shutdown):
                self._close_engine()
                if self._store is not None:
                    self._store.close()
                return
            handler = {Load: self._load, Unload: self._unload, Reply: self._reply, Plan: self._plan,
                       ProbeDevices: self._probe, ServeJob: self._serve_job}[type(req)]
            try:
                handler(req, flow)
            except Exception as e:  # a bug here: the window says it in one line, this process goes on
                self.send(Failed(_KIND[type(req)], f"{type(e).__name__}: {e}", getattr(req, "conversation_id", 0)))
            finally:
                self.send(Done())

    def _the_store(self) -> Store:
        if self._store is None:
            self._store = Store(self._db_path)
        return self._store

    def _probe(self, _req: ProbeDevices, _flow: Flow) -> None:
        try:
            self.send(Result("devices", gpu_available()))
        except (OSError, FlashDeskError):
            self.send(Result("devices", False))

    def _load(self, req: Load, flow: Flow) -> None:
        try:
            spec = req.spec or bundled_spec()
            # from the headers, before the loaded pair is given up: a mismatch keeps the old one working
            checked = check_spec(spec)

            def progress(stage: str, frac: float) -> bool:
                self.send(LoadProgress(stage, float(frac)))
                abort_here_if_asked("load")  # test hook: at the first load progress report
                return not flow.cancel.is_set()

            store = self._the_store()
            self._close_engine()
            engine = load_engine(spec, progress, checked)
        except (FlashDeskError, OSError, ValueError) as e:
            if not flow.cancel.is_set():  # a superseded load's "cancelled" is no news to the user
                self.send(Failed("load", str(e)))
            return
        self._engine = engine
        self._session = session = ChatSession(engine, store, documents=ChatDocuments(self._documents_db))
        self.send(Loaded(ModelInfo(spec, session.model_label, engine.has_drafter, engine.block_size,
                                   session.format.name, engine.n_ctx, draft_source_lines(engine, spec))))
        if req.calibrate and engine.has_drafter and not engine.speculation_blocked:
            # the cost model "auto" needs, measured (or read from the cache) while the user watches the load
            self.send(LoadProgress("calibrating", -1.0))
            try:
                session.calibrate()
            except FlashDeskError as e:
                self.send(Failed("load", f"calibrating the draft-length costs failed: {e}"))
        self.send(LoadProgress("baseline", 0.0))
        try:
            self.send(Result("baseline", session.measure_baseline()))
        except FlashDeskError as e:
            self.send(Failed("load", f"measuring the plain-decoding baseline failed: {e}"))
        self.send(LoadProgress("baseline", 1.0))

    def _unload(self, _req: Unload, _flow: Flow) -> None:
        self._close_engine()
        self.send(Result("unloaded"))

    def _plan(self, req: Plan, _flow: Flow) -> None:
        spec = req.spec
        try:
            self.send(Result("plan", plan_for(spec)))
        except FlashDeskError as e:
            self.send(Failed("plan", f"cannot plan {spec.label}: {e}"))
        except Exception as e:  # a bad path or an unreadable GGUF: said in the window, the app goes on
            self.send(Failed("plan", f"cannot plan {spec.label}: {type(e).__name__}: {e}"))

    def _reply(self, req: Reply, flow: Flow) -> None:
        conv = req.conversation_id
        try:
            if self._session is None:
                raise FlashDeskError("no model is loaded: load one in the Model tab")
            if flow.cancel.is_set():
                return
            held, sent_at = None, None  # a step not sent yet, and when the last one was
            for update in self._session.reply(conv, req.settings, flow.cancel):
                update = update.after(held) if held is not None else update
                now = time.monotonic()
                if update.finish_reason is None and sent_at is not None and now - sent_at < UPDATE_INTERVAL_S:
                    held = update  # stored already; the next update sent stands for it
                    continue
                held, sent_at = None, now
                self.send(update)
                abort_here_if_asked("reply")  # test hook: after the first reply step
                if update.finish_reason is None:
                    flow.acks.acquire()  # at most `window` updates ahead of what the window has shown
        except FlashDeskError as e:
            self.send(Failed("reply", str(e), conv))
        except Exception as e:  # keep the app alive on any engine error; the message says what happened
            self.send(Failed("reply", f"{type(e).__name__}: {e}", conv))

    def _serve_job(self, req: ServeJob, flow: Flow) -> None:
        """The server job runs here through the server's own Job code; its reports go back to the parent's job."""
        session = self._session
        service = GenerationService(_Inline(lambda: ServedModel.for_session(session) if session else None, flow),
                                    max_queue=1, max_tokens=req.max_tokens)
        service.submit(req.request, lambda item: self.send(JobReport(item)))

    def _close_engine(self) -> None:
        if self._session is not None:
            self._session.close()
        if self._engine is not None:
            self._engine.close()
        self._engine = None
        self._session = None


class _Inline:
    """An EngineExecutor that runs the job at once, in this thread, cancelled by the parent's Cancel."""

    def __init__(self, provider: ModelProvider, flow: Flow):
        self._provider = provider
        self._flow = flow

    def model_id(self) -> str | None:
        model = self._provider()
        return model.name if model else None

    def submit(self, job: Job) -> None:
        job.cancel = self._flow.cancel
        job.run(self._provider)


def main(argv: list[str]) -> int:
    fd, db = int(argv[0]), Path(argv[1])
    documents_db = Path(argv[2]) if len(argv) > 2 and argv[2] else None
    Host(Connection(fd), db, documents_db).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
