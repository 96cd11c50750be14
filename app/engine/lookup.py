"""Context lookup: draft the tokens that followed the last time the context read
as it reads now.

The index maps every n-gram (n = 1..max_n) of the conversation's token ids
(system prompt, documents, earlier turns, the reply so far) to the position
where it last ended. To draft after the anchor (the last emitted token), take
the longest n such that the n tokens ending at the anchor occurred before,
and propose what followed that occurrence. The match length n is the
draft's confidence. No model runs; the index grows by max_n dictionary
writes per token, lazily, and a query costs at most max_n lookups.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_N = 6  # longest suffix matched (longer matches draft more reliably)


@dataclass(frozen=True)
class LookupMatch:
    n: int  # how many tokens ending at the anchor matched an earlier occurrence
    tokens: tuple[int, ...]  # what followed it (at most the k asked for)


class ContextLookup:
    """An n-gram index over one token history, kept in step with the engine's."""

    def __init__(self, max_n: int = DEFAULT_MAX_N):
        self.max_n = max_n
        self.tokens: list[int] = []
        self._last: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n + 1)]  # [n][n-gram] -> end
        self._indexed = 0  # n-grams ending at positions < this are in the index

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

    def find(self, k: int) -> LookupMatch | None:
        """The continuation of the longest earlier match of the suffix ending at the last token
        (at most k tokens), or None."""
        toks = self.tokens
        a = len(toks) - 1  # the anchor
        if a < 1 or k < 1:
            return None
        self._index_until(a)
        for n in range(min(self.max_n, a), 0, -1):
            e = self._last[n].get(tuple(toks[a - n + 1:a + 1]))
            if e is not None:
                cont = toks[e + 1:min(e + 1 + k, a + 1)]
                if cont:
                    return LookupMatch(n, tuple(cont))
        return None

    def _index_until(self, end: int) -> None:
        """Index the n-grams that end before `end` (the anchor's own are not: it would match itself)."""
        toks = self.tokens
        for p in range(self._indexed, end):
            for n in range(1, min(self.max_n, p + 1) + 1):
                self._last[n][tuple(toks[p - n + 1:p + 1])] = p
        self._indexed = max(self._indexed, end)
