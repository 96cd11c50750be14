"""Context lookup: draft the tokens that followed the last time the context read
as it reads now.

The index maps every n-gram (n = 1..max_n) of the conversation's token ids
(system prompt, documents, earlier turns, the reply so far) to the position
where it last ended, how often it occurred and whether every occurrence was
followed by the same token. To draft after the anchor (the last emitted
token), take the longest n such that the n tokens ending at the anchor
occurred before, and propose what followed the last occurrence. The draft's
confidence is the match length n and that agreement: over the 230 plain outputs
of docs/bench/hybrid-attn-cpu.json replayed (scripts/lookup_replay.py,
docs/bench/lookup-replay-cpu.json; a reply's first step and drafts that end the
reply counted apart), a draft's first token passed 96% of the time after an
n-gram always followed by the same token, 80% after one seen once and 43% after
one followed by different tokens (HumanEval; chat: 94/65/27%, documents, of
34/61/40 drafts: 76/56/18%). No model runs; the index grows by max_n dictionary
writes per token, and a query costs at most max_n lookups (16 us per reply token
on this CPU, a query at every position and the prompt's indexing included; the
same replay). A prompt (or a turn's new tokens: BULK_MIN or more) is indexed in
bulk with numpy, at prefill when the reply is speculative (`index_history`, from
LookupSource.begin): indexed one token at a time on the reply's first step it cost
124 ms at 16k tokens (docs/bench/drafter-window-2048.json), ~4 plain tokens of a
short answer (old vs new by length: `python -m app.bench.lookup_index`). A draft
that runs into a stop string proposes the reply's own end marker there instead
(`_end_reply`): what followed the user's turn is not how an answer ends.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_MAX_N = 6  # longest suffix matched (longer matches draft more reliably)
# at least this many new positions (a prompt, a turn) are indexed in bulk; fewer (a step's) one by one,
# where numpy's fixed cost per call would exceed the dictionary writes
BULK_MIN = 64

# how the earlier occurrences of the matched n-gram continued
ONCE = 0  # it occurred once
AGREED = 1  # more than once, every time followed by the same token
MIXED = 2  # followed by different tokens (the draft is the last occurrence's continuation)
AGREEMENTS = (ONCE, AGREED, MIXED)


@dataclass(frozen=True)
class LookupMatch:
    n: int  # how many tokens ending at the anchor matched an earlier occurrence
    tokens: tuple[int, ...]  # what followed it (at most the k asked for)
    agreement: int = ONCE  # ONCE, AGREED or MIXED
    ends_reply: bool = False  # the draft ran into a stop string: it ends with the reply's own end marker


class ContextLookup:
    """An n-gram index over one token history, kept in step with the engine's."""

    def __init__(self, max_n: int = DEFAULT_MAX_N, bulk_min: int = BULK_MIN):
        self.max_n = max_n
        self.bulk_min = bulk_min
        self.tokens: list[int] = []
        # [n][n-gram] -> (where it last ended, ONCE / AGREED / MIXED: how its occurrences were followed)
        self._last: list[dict[tuple[int, ...], tuple[int, int]]] = [{} for _ in range(max_n + 1)]
        self._indexed = 0  # n-grams ending at positions < this are in the index
        self.reply_ends: list[list[int]] = []  # the stop strings' tokens; the first is how a reply ends

    def reset(self) -> None:
        self.tokens = []
        self._last = [{} for _ in range(self.max_n + 1)]
        self._indexed = 0

    def set_history(self, history: list[int]) -> None:
        """Start a generation after `history`: the index carries over when the history only grew
        (the next turn of a chat); otherwise (an edit, a regenerate) it is rebuilt, lazily."""
        n = len(self.tokens)
        if len(history) >= n and history[:n] == self.tokens:
            self.tokens.extend(history[n:])
            return
        self.reset()
        self.tokens = list(history)

    def append(self, tokens: list[int]) -> None:
        """Tokens emitted by a step (never a rejected draft)."""
        self.tokens.extend(tokens)

    def index_history(self) -> None:
        """Index the history up to its anchor now (a speculative reply's prompt, at prefill), not
        lazily in the reply's first step."""
        self._index_until(len(self.tokens) - 1)

    def find(self, k: int) -> LookupMatch | None:
        """The continuation of the longest earlier match of the suffix ending at the last token
        (at most k tokens, from its last occurrence), or None."""
        toks = self.tokens
        a = len(toks) - 1  # the anchor
        if a < 1 or k < 1:
            return None
        self._index_until(a)
        for n in range(min(self.max_n, a), 0, -1):
            entry = self._last[n].get(tuple(toks[a - n + 1:a + 1]))
            if entry is not None:
                e, agreement = entry
                cont = toks[e + 1:min(e + 1 + k, a + 1)]
                cont, ends = self._end_reply(cont, k) if cont else (cont, False)
                if cont:
                    return LookupMatch(n, tuple(cont), agreement, ends)
        return None

    def _end_reply(self, draft: list[int], k: int) -> tuple[list[int], bool]:
        """A draft that runs into a stop string proposes the end of the reply there: the reply's own
        end marker (reply_ends[0]) in place of the stop string copied, and nothing after it. In a
        transcript the marker after a turn names the next speaker, so what followed the user's
        question ("\nAssistant:") is not how the model ends its answer ("\nUser:"): over the 66 chat
        and document replies of docs/bench/hybrid-attn-cpu.json, 62 ended with "\nUser:" and none with
        "\nAssistant:"; replayed (scripts/lookup_replay.py, docs/bench/lookup-replay-cpu.json), 433
        lookup drafts ran into a stop string and were rewritten: their first token passed 60% of the
        time (258) and 155 (36%) passed whole, the marker included."""
        if not self.reply_ends:
            return draft, False
        longest = max(len(s) for s in self.reply_ends)
        tail = self.tokens[len(self.tokens) - min(len(self.tokens), longest - 1):]  # a stop may begin here
        seq = tail + draft
        if not {s[0] for s in self.reply_ends if s}.intersection(seq):  # the common case, every step
            return draft, False
        for p in range(len(seq)):  # the earliest stop string that ends inside the draft, or that the
            for stop in self.reply_ends:  # draft's end begins (two tokens of it at least)
                m = min(len(stop), len(seq) - p)
                if m and (m == len(stop) or m >= 2) and p + m > len(tail) and seq[p:p + m] == stop[:m]:
                    h = max(0, len(tail) - p)  # its tokens already emitted
                    end = self.reply_ends[0]
                    cut = draft[:max(0, p - len(tail))]
                    return (cut + end[h:] if end[:h] == stop[:h] else cut + stop[h:])[:k], True
        return draft, False

    def _index_until(self, end: int) -> None:
        """Index the n-grams that end before `end` (the anchor's own are not: it would match itself),
        each with the token that followed it (there is one: it ends before the anchor)."""
        if end - self._indexed >= self.bulk_min:
            self._index_bulk(self._indexed, end)
        else:
            for p in range(self._indexed, end):
                self._index_at(p)
        self._indexed = max(self._indexed, end)

    def _index_at(self, p: int) -> None:
        """The n-grams ending at p, one at a time."""
        toks = self.tokens
        for n in range(1, min(self.max_n, p + 1) + 1):
            key = tuple(toks[p - n + 1:p + 1])
            entry = self._last[n].get(key)
            if entry is None:
                self._last[n][key] = (p, ONCE)
            else:  # the earlier ones all agreed with the last's successor, or not
                e, agreement = entry
                same = agreement != MIXED and toks[e + 1] == toks[p + 1]
                self._last[n][key] = (p, AGREED if same else MIXED)

    def _index_bulk(self, start: int, end: int) -> None:
        """What _index_at does for every p in [start, end), with numpy: per n, an exact id for the
        n-gram ending at each position (the rank of its (n-1)-gram's id and its last token), the
        positions sorted by it (stable: in order within one n-gram), and per distinct n-gram its last
        position and whether all its successors are one token; then merged with what was indexed
        before `start`."""
        lo = max(0, start - self.max_n + 1)  # the first token an n-gram ending at `start` reads
        toks = np.asarray(self.tokens[lo:end + 1], dtype=np.int64)  # index i: position lo + i (+ a successor)
        span = end - lo
        ids = toks[:span]  # n = 1: the token is its own id (ids < 2**31: a pair below fits in int64)
        for n in range(1, self.max_n + 1):
            if span < n:
                break
            if n > 1:  # index j: the n-gram ending at position lo + j + n - 1
                key = (ids[:-1] << 32) | toks[n - 1:span]
            else:
                key = ids
            order = np.argsort(key, kind="stable")
            sk = key[order]
            ids = np.empty(len(sk), dtype=np.int64)  # the next n's input: equal n-grams, equal ids
            ids[order] = np.cumsum(np.r_[True, sk[1:] != sk[:-1]]) - 1
            sel = order[order + lo + n - 1 >= start]  # the n-grams ending before start were indexed
            if not len(sel):
                continue
            gk = key[sel]
            starts = np.flatnonzero(np.r_[True, gk[1:] != gk[:-1]])
            lasts = np.r_[starts[1:], len(sel)] - 1
            succ = toks[n:span + 1][sel]  # what followed each occurrence
            agreed = np.minimum.reduceat(succ, starts) == np.maximum.reduceat(succ, starts)
            state = np.where(lasts == starts, ONCE, np.where(agreed, AGREED, MIXED))
            j = sel[lasts]
            grams = zip(*(toks[j + c].tolist() for c in range(n)))
            fresh = dict(zip(grams, zip((j + lo + n - 1).tolist(), state.tolist())))
            self._merge(self._last[n], fresh)

    def _merge(self, index: dict[tuple[int, ...], tuple[int, int]],
               fresh: dict[tuple[int, ...], tuple[int, int]]) -> None:
        """Add the entries of later positions to the index: an n-gram in both occurred more than once,
        and its successors agreed if each part's did and their last successors are the same."""
        toks = self.tokens
        for key in fresh.keys() & index.keys():
            (e0, a0), (e1, a1) = index[key], fresh[key]
            same = a0 != MIXED and a1 != MIXED and toks[e0 + 1] == toks[e1 + 1]
            fresh[key] = (e1, AGREED if same else MIXED)
        index.update(fresh)
