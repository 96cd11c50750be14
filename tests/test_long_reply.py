"""Long replies and conversations on the bundled pair (Gemma 3 270M Q4_K_M + the shipped drafter).

- Past Gemma's 512-token sliding window, greedy speculation with rejected drafts (a rollback
  in a sliding-window cache at every rejection) gives exactly the plain greedy tokens, DFlash
  and context-lookup drafts alike, and passes the teacher-forced lossless check.
- A conversation through ChatSession (the prompt re-rendered from the store every turn)
  reuses the KV cache from turn to turn (lossless), and a reply after a cancelled one agrees
  with a fresh engine's on the same conversation (lossless by its reference; its greedy text up
  to a near-tie at most).

Identity of speculative and plain decoding (from the same cache state) is demanded because the
patched CPU kernels are batch-invariant (docs/design.md, section 3); the lossless check is the bar
that holds for any kernels.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from app.engine.dflash import Engine
from app.engine.draft_policy import DFLASH, LOOKUP, FixedDraftLength
from app.engine.events import FINISH_CANCELLED
from app.engine.lossless import NEAR_TIE_MARGIN, check_lossless
from app.engine.params import GenerationParams
from app.session.chat_session import ChatSession
from app.session.conversation_ops import send_user_message
from app.session.documents import ChatDocuments
from app.session.settings import ChatSettings
from app.store import Store
from app.store.records import STATUS_DONE, STATUS_STOPPED

pytestmark = pytest.mark.gemma

WINDOW = 512  # Gemma 3's sliding window (15 of its 18 layers)
PROMPT = "Write a long story about a lighthouse keeper who collects lost letters. Chapter 1:"


def rejections_past(stats, n_prompt: int, position: int) -> int:  # noqa: ANN001
    """Steps that verified drafts and rejected some at a cache position past `position`."""
    pos, n = n_prompt - 1, 0
    for k, a in zip(stats.k_history, stats.accepted_history):
        if k > a and pos > position:
            n += 1
        pos += a + 1
    return n


# slow (make test-slow): three replies of 700 and of 1,500 tokens, minutes on two cores; the default
# suite keeps 600 tokens past the window bit for bit (test_cpu_kernels.py)
@pytest.mark.slow
@pytest.mark.parametrize("n", [700, 1500])
def test_a_long_reply_past_the_sliding_window_is_the_plain_reply(gemma_shipped_engine: Engine, n: int) -> None:
    e = gemma_shipped_engine
    prompt = e.tokenize(PROMPT)
    e.reset()
    plain = e.complete(prompt, GenerationParams(max_tokens=n, speculative=False))
    assert len(plain.tokens) == n and len(prompt) + n > WINDOW + 100, "the reply should run past the window"
    for source, k in ((DFLASH, 7), (LOOKUP, 8)):
        e.reset()
        done = e.complete(prompt, GenerationParams(max_tokens=n), policy=FixedDraftLength(k, source))
        st = done.stats
        first = next((i for i, (a, b) in enumerate(zip(plain.tokens, done.tokens)) if a != b), None)
        assert done.tokens == plain.tokens, f"{source}: differs from plain at token {first}"
        assert st.accepted_by_source[source] > 0, source
        # rollbacks in the sliding-window cache: rejected drafts past the window
        assert rejections_past(st, len(prompt), WINDOW) >= 10, source
        n_past = len(prompt) - 1 + len(done.tokens)
        assert e.cache_positions() == (n_past - 1, n_past - 1)
    rep = check_lossless(e, prompt, done.tokens)
    assert rep.n_checked == n and rep.lossless, rep.hard_mismatches


class TokenSpy:
    """Records the prompt and the tokens of every generation an engine runs (ChatSession yields
    text; the lossless check needs tokens)."""

    def __init__(self, engine: Engine, monkeypatch: pytest.MonkeyPatch):
        self.runs: list[dict] = []
        orig = engine.generate

        def generate(prompt, params=None, **kw):  # noqa: ANN001, ANN003, ANN202
            run = {"prompt": list(prompt), "tokens": []}
            self.runs.append(run)
            for ev in orig(prompt, params, **kw):
                run["tokens"] += ev.tokens
                run["stats"] = ev.stats
                yield ev

        monkeypatch.setattr(engine, "generate", generate)


def test_a_conversation_reuses_the_cache_and_a_reply_after_a_cancel_is_a_fresh_engines(
        gemma_shipped_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    e = gemma_shipped_engine
    e.reset()
    store = Store(tmp_path / "fd.sqlite3")
    session = ChatSession(e, store, documents=ChatDocuments(tmp_path / "documents.sqlite3"))
    spy = TokenSpy(e, monkeypatch)
    settings = ChatSettings(max_tokens=40, draft_length=7)  # DFlash, 7 drafts a step
    conv = store.create_conversation().id

    def reply(text: str, cancel: threading.Event | None = None, stop_after: int | None = None) -> list:
        send_user_message(store, conv, text)
        updates = []
        for u in session.reply(conv, settings, cancel=cancel):
            updates.append(u)
            if stop_after is not None and len(updates) == stop_after:
                cancel.set()
        return updates

    def fresh(prompt: list[int]) -> list[int]:
        """What plain decoding of this prompt gives from empty caches."""
        e.reset()
        return e.complete(prompt, GenerationParams(max_tokens=40, speculative=False,
                                                   stop=list(session.format.stop))).tokens

    # turn 1, then turn 2: the re-rendered prompt starts with what the cache holds
    u1 = reply("Write a Python function that reverses a string.")
    u2 = reply("Now write one that counts the vowels in a string.")
    r1, r2 = spy.runs
    assert u1[-1].status == u2[-1].status == STATUS_DONE and u1[-1].content and u2[-1].content
    cached = r1["prompt"] + r1["tokens"][:-1]  # what turn 1 left in the caches
    common = next((i for i, (a, b) in enumerate(zip(cached, r2["prompt"][:-1])) if a != b),
                  min(len(cached), len(r2["prompt"]) - 1))
    assert r2["stats"].n_prompt_reused == common > len(r1["prompt"])  # the first turn and part of its reply
    assert r2["stats"].drafted > 0
    for r in (r1, r2):
        rep = check_lossless(e, r["prompt"], r["tokens"])
        assert rep.lossless, rep.hard_mismatches
    # (the checks leave the caches empty: turn 3 starts from nothing)

    # turn 3 is cancelled after its first step; the partial reply is kept
    cancel = threading.Event()
    u3 = reply("Explain what a palindrome is.", cancel=cancel, stop_after=1)
    assert u3[-1].finish_reason == FINISH_CANCELLED and len(u3) == 2
    assert store.message(u3[-1].message_id).status == STATUS_STOPPED

    # turn 4 after the cancel, against a fresh engine on the same conversation: the lossless check
    # (its reference is a fresh engine decoding one token at a time) and the fresh engine's greedy
    # reply, which it follows up to a near-tie at most. Not always to the end: the reused cache
    # holds K/V computed in other batches than a fresh prefill's (turn 3's prompt, its one step,
    # then the rest), and that rounds differently (measured on this conversation: the first
    # difference at token 28, 0.16 logits from the argmax; with plain decoding throughout too;
    # docs/design.md, section 3). A stale or misplaced cache entry gives hard mismatches instead.
    u4 = reply("Write a function that checks for palindromes.")
    r3, r4 = spy.runs[2], spy.runs[3]
    assert u4[-1].status == STATUS_DONE
    assert r4["stats"].n_prompt_reused >= len(r3["prompt"]) - 1  # the cancelled turn's cache was kept
    rep = check_lossless(e, r4["prompt"], r4["tokens"])
    assert rep.n_checked == len(r4["tokens"]) > 0 and rep.lossless, rep.hard_mismatches
    theirs = fresh(r4["prompt"])
    first = next((i for i, (a, b) in enumerate(zip(r4["tokens"], theirs)) if a != b), None)
    if first is None:
        assert r4["tokens"] == theirs
    else:
        _, deficit = e.reference_scores(r4["prompt"], r4["tokens"][:first + 1])
        assert 0 < deficit[first] <= NEAR_TIE_MARGIN, (first, float(deficit[first]))
    session.close()
    store.close()
