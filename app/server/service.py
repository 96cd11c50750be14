"""One engine, one generation at a time.

The HTTP side submits a GenerationRequest; the service admits it into a bounded queue (or
refuses with 429) and hands a Job to the EngineExecutor, which runs jobs one after another in
the one thread that may touch the engine. A job reports back through a sink (a function that
is safe to call from that thread): Started once the prompt fits, a Piece per decode step with
text, then Finished (or Failed). A job whose client went away is cancelled: it ends at the next
decode step (Engine.generate's cancel event) or, still queued, never starts.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from queue import SimpleQueue
from typing import Protocol

from app.chat.format import ChatMessage, PromptFormat, TemplateRenderError, prompt_format_of, with_format_stops
from app.chat.tools import tools_refusal
from app.engine.controller import DraftController
from app.engine.dflash import Engine
from app.engine.draft_policy import DraftPolicy
from app.engine.events import FINISH_CANCELLED
from app.engine.params import GenerationParams, InvalidParams
from app.engine.sampling import TokenLogprob
from app.engine.stats import GenerationStats
from app.errors import ContextOverflow, FlashDeskError
from app.server.errors import ApiError, bad_request, server_error, unavailable
from app.session.chat_session import ChatSession

log = logging.getLogger("flashdesk.server")

CHAT = "chat"
COMPLETION = "completion"
SERVED_MODE = "hybrid"  # the draft mode every served model uses (app.engine.controller)
RECORDS_KEPT = 500
RETRY_AFTER_MAX_S = 120


@dataclass
class GenerationRequest:
    """A validated request (app.server.schemas), before the engine thread tokenizes it."""
    kind: str  # CHAT or COMPLETION
    model: str
    messages: list[ChatMessage] = field(default_factory=list)  # CHAT
    prompt: str = ""  # COMPLETION
    max_tokens: int | None = None  # None: as many as the server allows and the context holds
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 40
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    logit_bias: dict[int, float] = field(default_factory=dict)
    grammar: str | None = None  # GBNF (response_format, json_schema and grammar all become one)
    logprobs: int | None = None  # None: none; n: each token's logprob and n alternatives
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    return_tokens: bool = False
    tools: list[dict] = field(default_factory=list)  # CHAT: OpenAI's tool objects, for the template; the
    # reply is then read for tool calls (app.chat.tools)


@dataclass
class ServedModel:
    """What jobs run on, handed to them in the engine's thread: never touched from another."""
    engine: Engine
    format: PromptFormat
    policy: DraftPolicy  # the hybrid controller, kept for the server's life (or the chat session's)
    name: str

    @classmethod
    def for_engine(cls, engine: Engine, policy: DraftPolicy) -> ServedModel:
        return cls(engine, prompt_format_of(engine.target), policy, model_id_of(engine.target.path))

    @classmethod
    def for_session(cls, session: ChatSession) -> ServedModel:
        """The app's loaded pair, with the chat session's own controller (what it learned carries over)."""
        return cls(session.engine, session.format, session.controller(), model_id_of(session.engine.target.path))


def model_id_of(target_path: str | Path) -> str:
    """The id clients name the model by: the target file's name without .gguf."""
    return Path(target_path).name.removesuffix(".gguf")


ModelProvider = Callable[[], ServedModel | None]


class EngineExecutor(Protocol):
    def model_id(self) -> str | None:
        """The id of the model jobs run on now (None: none loaded)."""

    def submit(self, job: Job) -> None:
        """Run job.run(provider) in the engine's thread, after what was submitted before (provider()
        gives the model then, or None when none is loaded); may be called from any thread."""


# what a job reports, in order: Started, Piece..., then Finished; or Failed at any point
@dataclass
class Started:
    prompt_tokens: int


@dataclass
class Logprob:
    """One reply token's log-probability, as clients see it: its text and bytes, and the top ones."""
    token: str
    bytes: list[int]
    logprob: float
    top: list[tuple[str, list[int], float]]


@dataclass
class Piece:
    text: str
    logprobs: list[Logprob] | None = None  # of this step's tokens, when asked


@dataclass
class Finished:
    finish_reason: str
    text: str
    tokens: list[int]
    stats: dict  # GenerationStats.to_dict()
    logprobs: list[Logprob] | None = None  # of every reply token, when asked


@dataclass
class Failed:
    error: ApiError


Sink = Callable[[Started | Piece | Finished | Failed], None]


@dataclass
class RequestRecord:
    """One served request, as the log shows it."""
    kind: str
    model: str
    stream: bool
    submitted_at: float  # time.time()
    started_at: float = 0.0
    ended_at: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    tokens_per_s: float = 0.0  # decode speed (the engine's)
    tau: float = 0.0
    finish_reason: str = ""
    error: str = ""

    @property
    def queued_s(self) -> float:
        return max(0.0, self.started_at - self.submitted_at) if self.started_at else 0.0

    def to_dict(self) -> dict:
        return {"kind": self.kind, "model": self.model, "stream": self.stream, "submitted_at": self.submitted_at,
                "started_at": self.started_at, "ended_at": self.ended_at, "queued_s": round(self.queued_s, 4),
                "prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "completion_tokens": self.completion_tokens, "tokens_per_s": round(self.tokens_per_s, 2),
                "tau": round(self.tau, 3), "finish_reason": self.finish_reason, "error": self.error}


QUEUED, RUNNING, ENDED = "queued", "running", "ended"


class Job:
    """One request's generation. run() is called by the executor in the engine's thread."""

    def __init__(self, service: GenerationService, request: GenerationRequest, sink: Sink):
        self.request = request
        self.cancel = threading.Event()
        self.record = RequestRecord(request.kind, request.model, request.stream, time.time())
        self._service = service
        self._sink = sink
        self.state = QUEUED  # changed under the service's lock

    def abandon(self) -> None:
        """The client is gone: a queued job never starts, a running one stops at the next step."""
        self.cancel.set()
        self._service.withdraw(self)

    def send(self, item: Started | Piece | Finished | Failed) -> None:
        try:
            self._sink(item)
        except RuntimeError:  # the event loop is gone (server stopped): nobody is listening
            self.cancel.set()

    def run(self, served: ModelProvider) -> None:
        """In the engine's thread: `served()` is asked for the model only once the job starts (it may
        calibrate the draft controller; its errors are this request's)."""
        if not self._service.start(self):
            return  # abandoned while queued, or the server stopped
        try:
            self._generate(served())
        except ApiError as e:
            self._fail(e)
        except InvalidParams as e:  # e.g. a logit_bias id past the vocabulary, a grammar llama.cpp refused
            self._fail(bad_request(str(e), e.param))
        except ContextOverflow as e:
            self._fail(bad_request(str(e), "max_tokens", "context_length_exceeded"))
        except TemplateRenderError as e:  # the model's chat template refused the conversation
            self._fail(bad_request(str(e), "messages"))
        except FlashDeskError as e:  # e.g. a decode llama.cpp refused: its message is meant for users
            self._fail(server_error(str(e)))
        except Exception as e:  # a bug: logged with its traceback here, the client gets one line
            log.exception("generation failed")
            self._fail(server_error(f"the generation failed ({type(e).__name__})"))
        finally:
            self._service.end(self)  # if not ended yet (a bug's exception)

    @property
    def max_tokens(self) -> int:
        """The server's cap on tokens for a request that names none."""
        return self._service.max_tokens

    def relay(self, generate: Callable[[Job], None]) -> None:
        """Like run(), for a generation made elsewhere (the app's engine process): `generate(self)`
        has it made there and hands each report it gets back to `self.report`."""
        if not self._service.start(self):
            return  # abandoned while queued, or the server stopped
        try:
            generate(self)
        finally:
            self._service.end(self)  # if no Finished or Failed came (the engine process died)

    def report(self, item: Started | Piece | Finished | Failed) -> None:
        """One report of a generation made elsewhere: the record follows it, then the client hears it."""
        r = self.record
        if isinstance(item, Started):
            r.prompt_tokens = item.prompt_tokens
        elif isinstance(item, Finished):
            st = item.stats
            r.cached_tokens, r.completion_tokens = st["n_prompt_reused"], st["n_generated"]
            r.tokens_per_s, r.tau, r.finish_reason = st["tokens_per_s"], st["tau"], item.finish_reason
            self._service.end(self)
        elif isinstance(item, Failed):
            r.error = item.error.message
            self._service.end(self)
        self.send(item)

    def _fail(self, e: ApiError) -> None:
        self.record.error = e.message
        self._service.end(self)  # logged before the client hears: its record is there when it does
        self.send(Failed(e))

    def _generate(self, model: ServedModel | None) -> None:
        req = self.request
        if model is None:
            raise unavailable("no model is loaded")
        if model.name != req.model:
            raise ApiError(404, f"the model {req.model!r} is not loaded (now: {model.name!r})",
                           code="model_not_found", param="model")
        engine = model.engine
        if req.kind == CHAT:
            _check_tools(req, model.format)
            # a client that goes away stops the rendering
            text = model.format.render(req.messages, cancel=self.cancel, tools=req.tools or None)
            stop = with_format_stops(model.format.stop, req.stop)
        else:
            text, stop = req.prompt, list(req.stop)
        prompt = engine.tokenize(text)
        max_tokens = req.max_tokens
        if max_tokens is None:  # not asked: up to the server's limit, within the context
            max_tokens = max(1, min(self._service.max_tokens, engine.n_ctx - len(prompt)))
        seed = secrets.randbits(32) if req.seed is None else req.seed % (1 << 64)
        params = GenerationParams(max_tokens=max_tokens, temperature=req.temperature, top_k=req.top_k,
                                  top_p=req.top_p, min_p=req.min_p, seed=seed, stop=stop,
                                  presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
                                  repeat_penalty=req.repeat_penalty, repeat_last_n=req.repeat_last_n,
                                  logit_bias=dict(req.logit_bias), grammar=req.grammar, logprobs=req.logprobs)
        events = engine.generate(prompt, params, cancel=self.cancel, policy=model.policy)  # checks the context
        self.record.prompt_tokens = len(prompt)
        self.send(Started(len(prompt)))
        tokens: list[int] = []
        parts: list[str] = []
        logprobs: list[Logprob] | None = None if req.logprobs is None else []
        ev = None
        try:
            for ev in events:
                tokens += ev.tokens
                step = None if ev.logprobs is None else _logprobs(engine, ev.tokens, ev.logprobs)
                if step:
                    logprobs += step
                if ev.text or step:
                    parts.append(ev.text)
                    self.send(Piece(ev.text, step))
        finally:
            _forget_history(model.policy)
        assert ev is not None  # generate yields at least the final event
        self._finish(ev.stats, ev.finish_reason or FINISH_CANCELLED, "".join(parts), tokens, logprobs)

    def _finish(self, st: GenerationStats, reason: str, text: str, tokens: list[int],
                logprobs: list[Logprob] | None = None) -> None:
        r = self.record
        r.cached_tokens = st.n_prompt_reused
        r.completion_tokens = st.n_generated
        r.tokens_per_s = st.tokens_per_s
        r.tau = st.tau
        r.finish_reason = reason
        self._service.end(self)
        self.send(Finished(reason, text, tokens, st.to_dict(), logprobs))


def _check_tools(req: GenerationRequest, fmt: PromptFormat) -> None:
    """A 400 for tools, tool calls or tool results that the model's chat template cannot take."""
    if not (req.tools or any(m.role == "tool" or m.tool_calls for m in req.messages)):
        return
    why = tools_refusal(fmt)
    if why is not None:
        raise bad_request(f"tools cannot be used with this model: {why}", "tools" if req.tools else "messages")


def _logprobs(engine: Engine, tokens: list[int], found: list[TokenLogprob]) -> list[Logprob]:
    """A step's logprobs as text (an end-of-generation token shows none, so it has none)."""
    def piece(t: int) -> tuple[str, list[int]]:
        b = engine.target.token_to_piece(t)
        return b.decode("utf-8", "replace"), list(b)

    out = []
    for t, lp in zip(tokens, found):
        if engine.target.is_eog(t):
            continue
        text, raw = piece(t)
        out.append(Logprob(text, raw, lp.logprob, [(*piece(i), v) for i, v in lp.top]))
    return out


def _forget_history(policy: DraftPolicy) -> None:
    """The controller keeps one entry per step for the benches; over a server's life that only grows."""
    if isinstance(policy, DraftController):
        policy.history.clear()
        policy.predicted_step_s.clear()


class GenerationService:
    """Admission (a bounded queue), the jobs in flight, and the log of served requests."""

    def __init__(self, executor: EngineExecutor, max_queue: int = 8, max_tokens: int = 2048):
        self.executor = executor
        self.max_queue = max_queue
        self.max_tokens = max_tokens
        self.records: deque[RequestRecord] = deque(maxlen=RECORDS_KEPT)
        self._listeners: list[Callable[[RequestRecord], None]] = []
        self._lock = threading.Lock()
        self._jobs: list[Job] = []  # admitted and not ended, in order
        self._closed = False

    def model_id(self) -> str | None:
        return self.executor.model_id()

    def add_listener(self, fn: Callable[[RequestRecord], None]) -> None:
        """fn(record) after each request ends, called in the engine's thread."""
        self._listeners.append(fn)

    @property
    def pending(self) -> int:
        """Requests admitted and not ended (the running one included)."""
        with self._lock:
            return len(self._jobs)

    def submit(self, request: GenerationRequest, sink: Sink) -> Job:
        """Queue a generation, or raise ApiError: 429 (with Retry-After) when the queue is full."""
        with self._lock:
            if self._closed:
                raise unavailable("the server is stopping")
            if len(self._jobs) > self.max_queue:  # one runs (or is about to), max_queue wait
                raise ApiError(429, f"the server is busy ({len(self._jobs)} requests in flight): retry later",
                               type_="rate_limit_error", code="queue_full",
                               headers={"Retry-After": str(self._retry_after())})
            job = Job(self, request, sink)
            self._jobs.append(job)
        self.executor.submit(job)
        return job

    def start(self, job: Job) -> bool:
        """Called by the job as it starts in the engine thread: False if it must not run."""
        with self._lock:
            if job.state != QUEUED:
                return False
            job.state = RUNNING
        job.record.started_at = time.time()
        return True

    def end(self, job: Job) -> None:
        """Called by the job when it has run (in the engine thread)."""
        with self._lock:
            if job.state == ENDED:
                return
            job.state = ENDED
            self._jobs.remove(job)
        self._log(job.record)

    def withdraw(self, job: Job) -> None:
        """A queued job leaves the queue now (its client is gone); a running one ends by itself."""
        with self._lock:
            if job.state != QUEUED:
                return
            job.state = ENDED
            self._jobs.remove(job)
        job.record.finish_reason = FINISH_CANCELLED
        self._log(job.record)

    def _log(self, record: RequestRecord) -> None:
        record.ended_at = time.time()
        self.records.append(record)
        for fn in self._listeners:
            try:
                fn(record)
            except Exception:  # a broken listener must not stop the engine thread
                log.exception("request log listener failed")

    def close(self) -> None:
        """No new requests; queued ones fail with 503 now, the running one stops at its next step."""
        with self._lock:
            self._closed = True
            jobs = list(self._jobs)
            queued = [j for j in jobs if j.state == QUEUED]
            for j in queued:
                j.state = ENDED
                self._jobs.remove(j)
        for j in jobs:
            j.cancel.set()
        for j in queued:
            j.send(Failed(unavailable("the server is stopping")))

    def _retry_after(self) -> int:
        """Seconds until a place in the queue frees up (the running request ends), from how long
        recent requests took."""
        recent = [r.ended_at - r.started_at for r in list(self.records)[-8:] if r.started_at]
        per = sum(recent) / len(recent) if recent else 1.0
        return max(1, min(RETRY_AFTER_MAX_S, math.ceil(per)))


class ThreadExecutor:
    """The engine's own thread (`flashdesk serve`, the bench): jobs run there one after another."""

    def __init__(self, model: ServedModel):
        self._model = model
        self._queue: SimpleQueue[Job | None] = SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="flashdesk-server-engine", daemon=True)
        self._thread.start()

    def model_id(self) -> str | None:
        return self._model.name

    def submit(self, job: Job) -> None:
        self._queue.put(job)

    def close(self, timeout: float = 30.0) -> None:
        """Stop after the job in flight (cancel it first: GenerationService.close)."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _loop(self) -> None:
        while (job := self._queue.get()) is not None:
            job.run(lambda: self._model)
