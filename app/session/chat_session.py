"""One loaded engine answering the conversations of a store.

`ChatSession.reply` renders the conversation with the target's chat template
(or the plain fallback), runs the engine and writes the reply to the store
at every step BEFORE yielding it, so whatever a UI has shown is already on
disk when the app is killed.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from app.chat.format import ChatMessage, PromptFormat, prompt_format_of
from app.engine.calibration import CostModel, learn
from app.engine.controller import DraftController, new_controller
from app.engine.dflash import Engine
from app.engine.draft_policy import LOOKUP, DraftPolicy, FixedDraftLength
from app.engine.events import FINISH_CANCELLED
from app.engine.params import GenerationParams
from app.engine.stats import GenerationStats
from app.session.baseline import BASELINE_REQUEST, BASELINE_TOKENS, Baseline, plain_reply_baseline, scratch_store_beside
from app.session.conversation_ops import ConversationError
from app.session.documents import ChatDocuments
from app.session.draft_sources import source_labels
from app.session.settings import ChatSettings
from app.session.summary import RateSeries, ReplySummary, RunningTotals, summarize
from app.store import Store
from app.store.db import StoreError
from app.store.records import STATUS_DONE, STATUS_ERROR, STATUS_INTERRUPTED, STATUS_STOPPED, STATUS_STREAMING


@dataclass(kw_only=True)
class ReplyUpdate:
    """One step of a reply, as a UI shows it (a snapshot: safe to hand to another thread)."""
    conversation_id: int
    message_id: int
    delta: str  # new text
    drafted_chars: int  # how many leading chars of `delta` came from accepted drafts
    content: str  # the whole reply so far
    status: str  # the message's status in the store (streaming, done, stopped)
    stats: GenerationStats
    summary: ReplySummary
    record: dict  # the stats record stored with the message (what a reloaded message shows)
    drafted_spans: list[list[int]] = field(default_factory=list)
    tps_series: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    sources: list[dict] = field(default_factory=list)  # the document sources in the prompt (Source.to_dict())

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def after(self, earlier: ReplyUpdate) -> ReplyUpdate:
        """This update standing for `earlier`'s step as well (a window sent fewer updates than steps):
        both steps' text as one delta, whose leading drafted chars run on into this step's only where
        all of `earlier`'s text was drafted."""
        lead = earlier.drafted_chars + (self.drafted_chars if earlier.drafted_chars == len(earlier.delta) else 0)
        return dataclasses.replace(self, delta=earlier.delta + self.delta, drafted_chars=lead)


class ChatSession:
    """Turns stored conversations into prompts and streams the engine's replies into the store."""

    def __init__(self, engine: Engine, store: Store, baseline: Baseline | None = None,
                 documents: ChatDocuments | None = None):
        self.engine = engine
        self.store = store
        self.baseline = baseline
        # where chats with collections retrieve from (the default documents database unless given)
        self.documents = documents or ChatDocuments()
        self.format: PromptFormat = prompt_format_of(engine.target)
        self._controller: DraftController | None = None  # draft length "auto": made on first use
        names = [Path(engine.target.path).name] + ([Path(engine.drafter.path).name] if engine.drafter else [])
        self.model_label = " + ".join(names)
        self.source_labels = source_labels(engine)  # the stats panel's names for this load's sources

    def close(self) -> None:
        """Close the documents index (the engine and the store belong to the caller)."""
        self.documents.close()

    def calibrate(self) -> CostModel:
        """The cost model draft length "auto" decides by (from the on-disk cache, or measured
        now: a UI calls this while it shows the load, not at the first reply)."""
        return self.controller().cost

    def controller(self) -> DraftController:
        """This session's draft controller (draft length "auto": the context lookup and the DFlash
        drafter, if one is loaded, or plain decoding, step by step, by expected tokens/s); what it
        learns carries over from reply to reply."""
        if self._controller is None:
            self._controller = new_controller(self.engine)
        return self._controller

    def policy_for(self, params: GenerationParams) -> DraftPolicy | None:
        """The draft policy of these settings: "auto" is the controller; a fixed length drafts from
        the DFlash drafter (or, without one, the context lookup); None is the engine's default."""
        if not params.speculative or self.engine.speculation_blocked:
            return None  # (blocked: the engine decodes plain; no controller to calibrate)
        if params.adaptive:
            return self.controller()
        if not self.engine.has_drafter:
            return FixedDraftLength(params.draft_max or 0, LOOKUP)
        return None

    def measure_baseline(self) -> Baseline:
        """Measure (once per loaded model) the plain-decoding speed replies are compared with: plain
        replies through this engine and a scratch store beside this one (app.session.baseline), so
        both sides of the ratio pay the same per-step work and nothing lands in the user's chats."""
        with scratch_store_beside(self.store) as store:
            scratch = ChatSession(self.engine, store, documents=self.documents)
            self.baseline = plain_reply_baseline(scratch, BASELINE_REQUEST, BASELINE_TOKENS)
        return self.baseline

    def prompt_messages(self, conv_id: int) -> list[ChatMessage]:
        conv = self.store.conversation(conv_id)
        out = [ChatMessage("system", conv.system_prompt)] if conv.system_prompt.strip() else []
        for m in self.store.messages(conv_id):
            if m.role in ("user", "assistant") and (m.content.strip() or m.role == "user"):
                out.append(ChatMessage(m.role, m.content))
        if not out or out[-1].role != "user":
            raise ConversationError(f"conversation {conv_id} does not end with a user message to answer")
        return out

    def reply(self, conv_id: int, settings: ChatSettings, cancel: threading.Event | None = None,
              policy: DraftPolicy | None = None) -> Iterator[ReplyUpdate]:
        """Answer the conversation's last user message; one update per decode step."""
        settings.validate()
        messages = self.prompt_messages(conv_id)
        params = settings.to_params(self.format.stop)
        collections = self.store.conversation(conv_id).collections
        grounded = None
        if collections:  # the chat answers from documents: sources for the last user message go in
            grounded = self.documents.prompt(self.engine, self.format, messages, collections, params.max_tokens)
            text = grounded.text
        else:
            text = self.format.render(messages, cancel=cancel)
        sources = [s.to_dict() for s in grounded.sources] if grounded else []
        prompt = self.engine.tokenize(text)
        self.engine.check_room(len(prompt), params.max_tokens)  # before a first reply's calibration
        policy = policy or self.policy_for(params)
        before = RunningTotals()
        for m in self.store.messages(conv_id):
            if m.role == "assistant" and m.stats and "generation" in m.stats:
                before.add(GenerationStats.from_dict(m.stats["generation"]))
        events = self.engine.generate(prompt, params, cancel=cancel, policy=policy)  # may raise ContextOverflow
        # the sources are stored with the message from its first row: a reply shown is never without them
        msg = self.store.add_message(conv_id, "assistant", "", status=STATUS_STREAMING, model=self.model_label,
                                     sources=sources)
        base_tps = self.baseline.tokens_per_s if self.baseline else None
        base_src = self.baseline.source if self.baseline else ""
        content, spans, series = "", [], RateSeries()
        try:
            for ev in events:
                drafted = drafted_chars(self.engine, ev.tokens, ev.drafted, len(ev.text))
                if drafted:
                    _add_span(spans, len(content), len(content) + drafted)
                content += ev.text
                st = ev.stats
                series.add(st.t_decode_s, st.n_generated)
                summ = summarize(st, before, base_tps, base_src, self.source_labels)
                status = STATUS_STREAMING
                if ev.finish_reason is not None:
                    status = STATUS_STOPPED if ev.finish_reason == FINISH_CANCELLED else STATUS_DONE
                final = ev.finish_reason is not None
                payload = {"generation": st.to_dict(history=final),
                           "summary": summ.to_dict(), "tps_series": [round(x, 2) for x in series.points],
                           "finish_reason": ev.finish_reason, "prompt_format": self.format.name}
                if grounded is not None:
                    payload["retrieval"] = grounded.retrieval
                if final and sources:
                    sources = _mark_cited(sources, content)
                # persist first, then show: a crash after the yield loses nothing shown
                self.store.update_message(msg.id, content=content, status=status, stats=payload,
                                          drafted_spans=spans, sources=sources if final and sources else None)
                yield ReplyUpdate(conversation_id=conv_id, message_id=msg.id, delta=ev.text, drafted_chars=drafted,
                                  content=content, status=status, stats=_snapshot(st), summary=summ, record=payload,
                                  drafted_spans=[list(s) for s in spans], tps_series=list(series.points),
                                  finish_reason=ev.finish_reason, sources=[dict(s) for s in sources])
        except GeneratorExit:
            _mark(self.store, msg.id, STATUS_STOPPED, "")
            raise
        except StoreError as e:  # a step could not be saved (a full disk): the reply ends here, what is stored stays
            _mark(self.store, msg.id, STATUS_INTERRUPTED, str(e))
            raise
        except Exception as e:
            _mark(self.store, msg.id, STATUS_ERROR, str(e))
            raise
        finally:
            try:
                self.store.touch(conv_id)
            except StoreError:
                pass  # only the chat's place in the list: the reply's own failure (if any) is what is raised
            if policy is not None and policy is self._controller:
                learn(self.engine, policy.seen)  # the steps it timed, into the cached cost model


def _mark(store: Store, msg_id: int, status: str, error: str) -> None:
    """Set how a reply ended, if the store can still take a write; if not (the disk is still full) the row
    stays 'streaming' and the next start marks it interrupted (Store.recover_interrupted)."""
    # each try needs less room: the error text may not fit, then not even the status on a full page,
    # where dropping the reply's stats (its text stays) shrinks the row
    for fields in ({"error": error or None}, {}, {"stats": {}}):
        try:
            store.update_message(msg_id, status=status, **fields)
            return
        except StoreError:
            continue


def _mark_cited(sources: list[dict], answer: str) -> list[dict]:
    """The sources with `cited` set where the answer mentions their number ([n])."""
    return [{**s, "cited": f"[{s['n']}]" in answer} for s in sources]


def drafted_chars(engine: Engine, tokens: list[int], drafted: list[bool], n_text: int) -> int:
    """Chars of this step's text that came from accepted drafts (the leading tokens of the step)."""
    n_acc = sum(1 for d in drafted if d)
    if n_acc == 0 or n_text == 0:
        return 0
    pieces = b"".join(engine.target.token_to_piece(t) for t in tokens[:n_acc])
    # text held back by a pending stop string shifts things slightly: clamp to what was shown
    return min(len(pieces.decode("utf-8", "ignore")), n_text)


def _add_span(spans: list[list[int]], start: int, end: int) -> None:
    if spans and spans[-1][1] == start:
        spans[-1][1] = end
    else:
        spans.append([start, end])


def _snapshot(st: GenerationStats) -> GenerationStats:
    """A copy the worker will not mutate (the engine updates its stats object in place)."""
    return dataclasses.replace(st, draft_by_pos=list(st.draft_by_pos), accept_by_pos=list(st.accept_by_pos),
                               k_history=[], accepted_history=[], step_s_history=[])
