"""Choosing each token from a row of target logits, the one way plain and speculative decoding do.

First the logits are adjusted, in llama.cpp's order: the logit bias, then the penalties over the
recent tokens (the last repeat_last_n of prompt and reply: repeat divides a seen token's positive
logit and multiplies a negative one, frequency subtracts per occurrence, presence once), then a
grammar sets what it refuses to -inf. Greedy takes the argmax of that. Sampling follows
llama.cpp's default chain: top-k, top-p and min-p on the untempered distribution, then
temperature on the survivors, then one uniform draw per emitted token from a numpy Generator
seeded once per generation, so a seed reproduces a run and plain and speculative decoding
consume randomness identically.

The verify of a speculative step picks the token at row i as if drafts[:i] had been emitted
(`ahead`): the penalties count them and the grammar has advanced through them, so every
emitted token is what plain decoding would pick after the same prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from app.engine.params import GenerationParams

if TYPE_CHECKING:
    from app.engine.llama_objects import LlamaGrammar

SORT_MAX = 4096  # more candidates than this are sorted only as far as top-p needs
HEAD_FIRST = 64  # the first head of candidates sorted for top-p (then four times longer, as needed)
BLOCK = 64  # logits per block when finding the largest: a block's max bounds all of them (strided blocks)


@dataclass
class TokenLogprob:
    """An emitted token's log-probability under the target (softmax of its raw logits at that
    position, as llama.cpp's server reports by default) and the `n` most likely tokens there."""
    token: int
    logprob: float
    top: list[tuple[int, float]]


def token_logprob(logits: np.ndarray, token: int, n: int) -> TokenLogprob:
    x = np.asarray(logits, dtype=np.float64)
    top = x.max()
    lse = top + np.log(np.exp(x - top).sum())
    best: list[tuple[int, float]] = []
    if n > 0:
        ids = np.argpartition(-x, n - 1)[:n]
        ids = ids[np.lexsort((ids, -x[ids]))]
        best = [(int(i), float(x[i] - lse)) for i in ids]
    return TokenLogprob(int(token), float(x[token] - lse), best)


class TokenSampler:
    def __init__(self, params: GenerationParams, history: Sequence[int] = (), grammar: LlamaGrammar | None = None):
        """history: the tokens before the first one this sampler picks (the prompt), for the penalties."""
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.grammar = grammar
        self._recent: list[int] = []
        self._bias = (np.fromiter(params.logit_bias.keys(), np.int64, len(params.logit_bias)),
                      np.fromiter(params.logit_bias.values(), np.float32, len(params.logit_bias)))
        self.accept(list(history), advance_grammar=False)

    @property
    def adjusts(self) -> bool:
        """Whether the logits are changed before the choice (else greedy is a plain argmax)."""
        return bool(self.params.logit_bias) or self.params.penalized or self.grammar is not None

    @property
    def plain_greedy(self) -> bool:
        """Greedy on unadjusted logits: the caller may take the argmax itself (in C)."""
        return self.params.greedy and not self.adjusts

    def accept(self, tokens: list[int], advance_grammar: bool = True) -> None:
        """Tokens emitted: the penalties count them and the grammar advances through them."""
        self._recent.extend(tokens)
        n = self.params.repeat_last_n
        if n >= 0 and len(self._recent) > n:
            del self._recent[:len(self._recent) - n]
        if advance_grammar and self.grammar is not None:
            for t in tokens:
                self.grammar.accept(t)

    def admissible(self, drafts: list[int]) -> list[int]:
        """The drafts up to the first one the grammar refuses after those before it: a draft that
        breaks the grammar could never be emitted, so it is not verified (or counted) at all."""
        if self.grammar is None or not drafts:
            return drafts
        g = self.grammar.fork()
        try:
            for i, t in enumerate(drafts):
                if not g.allows(t):
                    return drafts[:i]
                g.accept(t)
        finally:
            g.close()
        return drafts

    def pick(self, logits: np.ndarray, ahead: Sequence[int] = ()) -> int:
        """The token after the emitted ones and then `ahead` (a verify's accepted drafts)."""
        x = self._penalized(logits, ahead)
        grammar = self._grammar_after(ahead)
        try:
            if self.params.greedy:
                best = int(np.argmax(x))
                if grammar is None or grammar.allows(best):
                    return best  # the argmax allowed is the argmax of the masked row: no mask needed
                grammar.mask(x)
                return int(np.argmax(x))
            if grammar is not None:
                grammar.mask(x)
            return self.sample(x)
        finally:
            if grammar is not None and grammar is not self.grammar:
                grammar.close()

    def adjusted(self, logits: np.ndarray, ahead: Sequence[int] = ()) -> np.ndarray:
        """The row as the choice sees it: bias, penalties and the grammar's mask applied."""
        x = self._penalized(logits, ahead)
        grammar = self._grammar_after(ahead)
        if grammar is not None:
            grammar.mask(x)
            if grammar is not self.grammar:
                grammar.close()
        return x

    def _penalized(self, logits: np.ndarray, ahead: Sequence[int]) -> np.ndarray:
        p = self.params
        if not p.logit_bias and not p.penalized:
            return np.array(logits, dtype=np.float32) if self.grammar is not None else logits
        x = np.array(logits, dtype=np.float32)  # a copy: the row is llama.cpp's buffer
        if p.logit_bias:
            ids, bias = self._bias
            x[ids] += bias
        if p.penalized:
            recent = self._recent + list(ahead)
            if p.repeat_last_n > 0:
                recent = recent[-p.repeat_last_n:]
            if recent:
                ids, counts = np.unique(np.asarray(recent, dtype=np.int64), return_counts=True)
                v = x[ids]
                if p.repeat_penalty != 1.0:
                    v = np.where(v > 0, v / p.repeat_penalty, v * p.repeat_penalty)
                x[ids] = v - counts * p.frequency_penalty - p.presence_penalty
        return x

    def _grammar_after(self, ahead: Sequence[int]) -> LlamaGrammar | None:
        if self.grammar is None or not ahead:
            return self.grammar
        g = self.grammar.fork()
        for t in ahead:  # drafts admissible() let through: each is allowed after those before it
            g.accept(t)
        return g

    def probabilities(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(candidate token ids, their probabilities) after the filters and temperature; most
        likely first (ties: the lower id), except a whole unfiltered vocabulary (kept in id order: a
        draw needs none). A row is 262k logits on Gemma: top-k's candidates are found by blocks
        (`_largest`) and only as long a head as top-p needs is sorted, never the whole row."""
        p = self.params
        x = np.asarray(logits, dtype=np.float32)
        ids = _largest(x, p.top_k, sort=False) if 0 < p.top_k < x.shape[0] else None  # None: every id
        vals = x if ids is None else x[ids]  # the row itself is read in place, not copied
        top = np.float64(vals.max())
        # top-p's mass is a share of every top-k candidate's; min-p's cut is a ratio to the best
        z = _mass(vals, top) if p.top_p < 1.0 else 1.0
        if p.min_p > 0.0:
            keep = np.flatnonzero(vals >= top + np.log(p.min_p))  # p_i >= min_p * p_max, exactly (in float64)
            ids, vals = (keep if ids is None else ids[keep]), vals[keep]
        if ids is None:
            ids = np.arange(x.shape[0])
        if p.top_p < 1.0 or len(vals) <= SORT_MAX:
            ids, vals = _sorted_head(ids, vals, top, z, p.top_p)
        vals = vals.astype(np.float64)
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(np.exp(vals - top)) / z, p.top_p) + 1)
            ids, vals = ids[:keep], vals[:keep]
        t = max(p.temperature, 1e-6)
        probs = np.exp((vals - top) / t)
        probs /= probs.sum()
        return ids, probs

    def sample(self, logits: np.ndarray) -> int:
        """A draw from the filtered, tempered distribution of `logits` (already adjusted)."""
        ids, probs = self.probabilities(logits)
        u = self.rng.random()
        i = int(np.searchsorted(np.cumsum(probs), u, side="right"))
        if i >= len(ids):  # u past the sum by rounding: the last candidate that can be drawn (never a -inf one)
            i = int(np.flatnonzero(probs)[-1])
        return int(ids[i])


def _mass(vals: np.ndarray, top: np.float64) -> np.float64:
    """The unnormalised probability mass of `vals`, sum(exp(vals - top)), in float64: top-p's whole."""
    d = vals.astype(np.float64)
    d -= top
    return np.exp(d, out=d).sum()


def _sorted_head(ids: np.ndarray, vals: np.ndarray, top: np.float64, z: np.float64,
                 top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The candidates most likely first (ties: the lower id), or (top_p < 1) only as many of the
    most likely as reach top-p's share of the mass z: a head of HEAD_FIRST, four times longer until
    its cumulative share (the sum the cut makes, so the cut falls inside it) reaches top_p, else all.
    `ids` ascending, so a lower position in `vals` is a lower id."""
    n = HEAD_FIRST
    while top_p < 1.0 and n < len(vals):
        head = _largest(vals, n)
        if np.cumsum(np.exp(vals[head].astype(np.float64) - top))[-1] / z >= top_p:
            return ids[head], vals[head]
        n *= 4
    order = _largest(vals, len(vals))
    return ids[order], vals[order]


def _largest(vals: np.ndarray, m: int, sort: bool = True) -> np.ndarray:
    """Positions of the m largest of `vals` (ties at the m-th: the lower positions), most likely
    first, or ascending with sort=False. Only blocks of BLOCK values whose max reaches the m-th
    largest block max are searched: m values reach that max, so the m-th largest value does too,
    and every value >= it lies in such a block: a row is read once and only those blocks are copied."""
    n = vals.shape[0]
    nb = n // BLOCK
    if 2 * m * BLOCK <= n:  # the blocks leave at most half the row to search
        # block j is every nb-th value from j (vals[j], vals[nb + j], ...): their maxes are one
        # vectorised maximum across BLOCK rows (~20 us), where contiguous blocks' maxes cost ~350 us
        maxes = vals[:nb * BLOCK].reshape(BLOCK, nb).max(axis=0)
        blocks = np.flatnonzero(maxes >= np.partition(maxes, nb - m)[nb - m])
        cand = (np.arange(BLOCK)[:, None] * nb + blocks).ravel()  # ascending: row by row
        if nb * BLOCK < n:  # the last partial block is always searched
            cand = np.concatenate((cand, np.arange(nb * BLOCK, n)))
    else:
        cand = np.arange(n)
    c = vals[cand]
    if len(cand) > m:
        kth = np.partition(c, len(c) - m)[len(c) - m]  # the m-th largest
        above = np.flatnonzero(c > kth)
        keep = np.concatenate((above, np.flatnonzero(c == kth)[:m - len(above)]))  # cand is ascending
        keep.sort()
        cand, c = cand[keep], c[keep]
    return cand[np.lexsort((cand, -c))] if sort else cand
