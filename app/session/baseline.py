"""The plain-decoding baseline a reply's speedup is measured against.

Plain replies through the same session a chat's replies take (its prompt
format, its per-step store writes and stats), just measured, on this machine:
the speedup shown is a ratio of two replies timed the same way, never a reply
against a loop that leaves the session's work out. (The cached calibration's
plain step, the window's baseline before, has none of that work: the window's
line read 0.77-0.93x where plain replies in the same window measured 1.29x
median, docs/bench/first-reply-window-cpu.json at 35eab9a.)
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from app.session.conversation_ops import send_user_message
from app.session.settings import ChatSettings
from app.store import Store

if TYPE_CHECKING:
    from app.engine.stats import GenerationStats
    from app.session.chat_session import ChatSession

# a neutral request for the window's baseline, made at load before any prompt is known (lowercase: tiny
# test vocabularies have no capitals)
BASELINE_REQUEST = "tell me a short story about a lighthouse keeper and the sea"
BASELINE_TOKENS = 24
SOURCE_PLAIN_REPLY = "plain replies"  # timed through the same session (its store, its per-step work)
WARM_UP_TOKENS = 4  # the untimed reply before the timed ones
BASELINE_REPLIES = 3  # timed plain replies, their median the baseline: one 19-token reply (~0.2 s) swings ~10%


@dataclass
class Baseline:
    tokens_per_s: float
    source: str  # how it was measured
    n_tokens: int = 0

    def to_dict(self) -> dict:
        return {"tokens_per_s": round(self.tokens_per_s, 3), "source": self.source, "n_tokens": self.n_tokens}


def plain_reply_baseline(session: ChatSession, prompt: str, max_tokens: int, warm_up: bool = True) -> Baseline:
    """The median speed of BASELINE_REPLIES plain replies to `prompt`, each in a new conversation of
    `session`'s store, after a short untimed one (`warm_up`): the process's first decode pays the
    model's page faults and thread start-up, and a baseline that paid them made the headless line
    overstate the speedup (printed 1.46x where a warm plain process measured 1.30x, median of 10, stop
    37). The median: two plain replies in a row differed by up to 10%, and one baseline read 41.8
    tok/s, half the ~80 of the plain process next to it (stop 37)."""
    if warm_up:
        _plain_reply(session, prompt, WARM_UP_TOKENS)
    stats = [_plain_reply(session, prompt, max_tokens) for _ in range(BASELINE_REPLIES)]
    return Baseline(statistics.median(st.tokens_per_s for st in stats), SOURCE_PLAIN_REPLY, stats[0].n_generated)


@contextmanager
def scratch_store_beside(store: Store) -> Iterator[Store]:
    """A throwaway store that writes as `store` does (a file in a temporary folder beside it, the same
    pragmas; in memory for an in-memory one), so that a baseline's replies pay the same per-step writes
    as the user's without touching the user's conversations; removed, folder and all, on exit."""
    with ExitStack() as stack:  # (unwound in reverse: the store closes before its folder goes)
        if str(store.path) == ":memory:":
            path: str | Path = ":memory:"
        else:
            path = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=".baseline-",
                                                                        dir=Path(store.path).parent)))
        scratch = Store(path)
        stack.callback(scratch.close)
        yield scratch


def _plain_reply(session: ChatSession, prompt: str, max_tokens: int) -> GenerationStats:
    conv = session.store.create_conversation()
    send_user_message(session.store, conv.id, prompt)
    return list(session.reply(conv.id, ChatSettings(max_tokens=max_tokens, speculative=False)))[-1].stats
