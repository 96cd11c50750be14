"""Draft sources: what proposes the tokens a step verifies.

The engine keeps a registry (`Engine.sources`: name -> source) and its one
loop talks to every source through the same four calls:

    begin(prompt, st, prefill)
                            a generation starts: the target cache holds
                            prompt[:-1]; the source brings its own state
                            there now if `prefill` (a speculative
                            generation: part of reading the prompt), else
                            lazily at its first proposal
    propose(history, n_past, k, st, with_confidence)
                            k drafts to follow history[-1] (the anchor, at
                            position n_past); with their probabilities if
                            asked and the source has them (else None)
    accepted(anchor, emitted, n_past, st)
                            after the verify: the anchor and the emitted
                            tokens are the history now (emitted[:-1] are the
                            accepted drafts, emitted[-1] the target's own);
                            the source rolls its state back to that prefix
    trim(n_keep) / reset()  the target cache kept only positions < n_keep
                            (a prompt reusing a cached prefix) or nothing

    read(tokens, pos0)      the target just decoded these tokens at pos0..
                            and keeps them (a prompt chunk, or a verify's
                            anchor and accepted drafts): they are rows
                            0..len-1 of its last decode, for a source that
                            drafts from the target's own states (MTP)

plus `k_max` (the longest draft it can make). The policy chooses a source
by name (app.engine.draft_policy); the controller learns each source's
acceptance and cost from the steps the loop reports. Adding a source is a
class here and a line in `Engine._register_sources`: the loop and the
verify do not change.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from app.engine.draft_policy import LOOKUP_K_MAX
from app.engine.llama_objects import (
    ContextConfig,
    LlamaContext,
    LlamaModel,
    ModelPlacement,
    TokenBatch,
    TokenStateBatch,
)
from app.engine.lookup import ContextLookup, LookupMatch
from app.engine.stats import GenerationStats
from app.errors import GenerationError

if TYPE_CHECKING:
    from app.engine.dflash import Engine

# a classic draft model's longest draft: its k passes run one after another, so long drafts only pay
# with a drafter far cheaper than the target
DRAFT_MODEL_K_MAX = 8
# an MTP head's longest draft: it too drafts one pass per token, each fed the head's own state for the
# last (a head trained for one step ahead: its later drafts pass less and less often)
MTP_K_MAX = 8
# an EAGLE-3 drafter's longest draft: one decoder pass per token, like a draft model's
EAGLE3_K_MAX = 8


class DraftSource(Protocol):
    name: str
    k_max: int

    def begin(self, prompt: list[int], st: GenerationStats, prefill: bool) -> None: ...

    def propose(self, history: list[int], n_past: int, k: int, st: GenerationStats,
                with_confidence: bool = False) -> tuple[list[int], np.ndarray | None]: ...

    def accepted(self, anchor: int, emitted: list[int], n_past: int, st: GenerationStats) -> None: ...

    def trim(self, n_keep: int) -> bool: ...

    def reset(self) -> None: ...

    def read(self, tokens: list[int], pos0: int) -> None: ...


class LookupSource:
    """The context lookup (app.engine.lookup): no model pass. Its match is found before the policy
    chooses (the policy sees it: `find`), and a lookup step verifies that match's tokens."""

    name = "lookup"
    k_max = LOOKUP_K_MAX

    def __init__(self, index: ContextLookup) -> None:
        self.index = index
        self.match: LookupMatch | None = None

    def set_reply_ends(self, stops: list[list[int]]) -> None:
        self.index.reply_ends = stops

    def begin(self, prompt: list[int], st: GenerationStats, prefill: bool) -> None:
        t0 = time.perf_counter()
        self.index.set_history(prompt)
        if prefill:  # a speculative reply: the prompt is indexed now, in bulk, not in its first step
            self.index.index_history()
        st.t_lookup_s += time.perf_counter() - t0

    def find(self, k: int, st: GenerationStats) -> LookupMatch | None:
        t0 = time.perf_counter()
        self.match = self.index.find(k)
        st.t_lookup_s += time.perf_counter() - t0
        return self.match

    def propose(self, history: list[int], n_past: int, k: int, st: GenerationStats,
                with_confidence: bool = False) -> tuple[list[int], np.ndarray | None]:
        return (list(self.match.tokens[:k]) if self.match is not None else []), None

    def accepted(self, anchor: int, emitted: list[int], n_past: int, st: GenerationStats) -> None:
        t0 = time.perf_counter()
        self.index.append(emitted)
        st.t_lookup_s += time.perf_counter() - t0

    def trim(self, n_keep: int) -> bool:
        return True  # the index follows the history given to begin()

    def reset(self) -> None:
        pass  # the same: set_history rebuilds it when the history was edited

    def read(self, tokens: list[int], pos0: int) -> None:
        pass  # the index is of tokens, given to begin() and accepted()


class DFlashSource:
    """The DFlash drafter: its model, context and the target features it is fed live in the Engine,
    because the target's own prefill and verify passes produce those features (the taps); this is
    its face to the loop."""

    name = "dflash"

    def __init__(self, engine: Engine):
        self.engine = engine
        self.k_max = engine.block_size - 1

    def begin(self, prompt: list[int], st: GenerationStats, prefill: bool) -> None:
        # the prompt's last features (fed a ubatch at a time while it was read) belong to reading the
        # prompt, not to the first DFlash step (~20 ms for 200 tokens)
        if prefill:
            self.engine._flush()

    def propose(self, history: list[int], n_past: int, k: int, st: GenerationStats,
                with_confidence: bool = False) -> tuple[list[int], np.ndarray | None]:
        return self.engine._draft(history[-1], n_past, k, st, with_confidence)

    def accepted(self, anchor: int, emitted: list[int], n_past: int, st: GenerationStats) -> None:
        pass  # the features of the verified tokens are queued by Engine._sync (read with the verify)

    def trim(self, n_keep: int) -> bool:
        e = self.engine
        if not e.dctx.seq_rm(n_keep):
            return False
        e._pending = [(p, rows[:max(0, n_keep - p)]) for p, rows in e._pending if p < n_keep]
        e._n_pending = sum(len(r) for _, r in e._pending)
        return True

    def reset(self) -> None:
        e = self.engine
        e.dctx.clear()
        e._pending = []
        e._n_pending = 0

    def read(self, tokens: list[int], pos0: int) -> None:
        pass  # the engine queues the target's tapped features itself (its prefill windows them)


class DraftModelSource:
    """A classic draft model: any GGUF with the target's vocabulary, decoding greedily k tokens one
    after another in its own context and KV cache. Its cache follows the verified history: the
    tokens it lacks (steps another source drafted, the prompt) are decoded in one batch before its
    next proposal, and after each verify it is cut back to the accepted prefix."""

    name = "draft-model"

    def __init__(self, path: str | Path, n_ctx: int, n_threads: int = 0, n_batch: int = 512,
                 placement: ModelPlacement | None = None, progress=None):  # noqa: ANN001 - a load callback
        self.model = LlamaModel(path, placement, progress)
        self.ctx = LlamaContext(self.model, ContextConfig(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                                                          n_threads=n_threads))
        self.k_max = DRAFT_MODEL_K_MAX
        self._batch = TokenBatch(self.ctx.n_batch)
        self._cached: list[int] = []  # the token ids in its cache, positions 0..len-1

    def begin(self, prompt: list[int], st: GenerationStats, prefill: bool) -> None:
        # its cache may hold an earlier turn: cut where the prompt differs (a cut costs nothing)
        self._catch_up(prompt[:-1], decode=prefill)

    def propose(self, history: list[int], n_past: int, k: int, st: GenerationStats,
                with_confidence: bool = False) -> tuple[list[int], np.ndarray | None]:
        t0 = time.perf_counter()
        # its cache is a prefix of the history (accepted() keeps it so): decode what it lacks, the
        # last step's correction and the tokens of steps other sources drafted, in one batch
        self._catch_up(history[:-1], check=False)
        drafts: list[int] = []
        tok, pos = history[-1], n_past
        for _ in range(k):
            self._batch.set([tok], pos, True)
            self.ctx.decode(self._batch)
            self._cached.append(tok)
            tok = int(self.ctx.argmax_rows([0])[0][0])
            drafts.append(tok)
            pos += 1
        dt = time.perf_counter() - t0
        st.t_draft_s += dt
        st.t_llama_s += dt
        return drafts, None  # no confidence: early stops are DFlash's (the controller picks k instead)

    def accepted(self, anchor: int, emitted: list[int], n_past: int, st: GenerationStats) -> None:
        # its cache holds anchor, d0, d1, ... from n_past: keep what the target verified
        # (anchor + accepted drafts; the correction is decoded at the next proposal)
        verified = [anchor] + emitted[:-1]
        keep = n_past
        for a, b in zip(self._cached[n_past:], verified):
            if a != b:
                break
            keep += 1
        self.trim(keep)

    def trim(self, n_keep: int) -> bool:
        if n_keep < len(self._cached):
            # a sliding-window cache may have dropped positions the tokens after n_keep need
            swa_gap = self.model.n_swa > 0 and n_keep > 0 and self.ctx.pos_min() > max(0, n_keep - self.model.n_swa)
            if swa_gap or not self.ctx.seq_rm(n_keep):
                self.reset()  # decoded again at the next proposal
                return True
            del self._cached[n_keep:]
        return True

    def reset(self) -> None:
        self.ctx.clear()
        self._cached = []

    def read(self, tokens: list[int], pos0: int) -> None:
        pass  # it reads tokens, not the target's states: the history at its next proposal

    def time_pass(self, repeats: int = 7) -> float:
        """Median seconds of one single-token pass after its cache (removed again): a draft of k
        costs about k of these (the controller's prior for this source's cost)."""
        pos = len(self._cached)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            self._batch.set([0], pos, True)
            self.ctx.decode(self._batch)
            self.ctx.argmax_rows([0])
            times.append(time.perf_counter() - t0)
            self.ctx.seq_rm(pos)
        return float(np.median(times))

    def _catch_up(self, want: list[int], check: bool = True, decode: bool = True) -> None:
        """Bring its cache to `want`: cut where it differs (`check`: else it is known to be a
        prefix), then decode what is missing (`decode`)."""
        if check:
            keep = 0
            for a, b in zip(self._cached, want):
                if a != b:
                    break
                keep += 1
            self.trim(keep)
        if not decode:
            return
        keep = len(self._cached)
        step = self.ctx.n_batch
        for i in range(keep, len(want), step):
            chunk = want[i:i + step]
            self._batch.set(chunk, i, False)
            self.ctx.decode(self._batch)
            self._cached.extend(chunk)

    def close(self) -> None:
        for o in (self._batch, self.ctx, self.model):
            o.close()


def draft_from_states(ctx: LlamaContext, batch: TokenStateBatch, token: int, state: np.ndarray, pos0: int,
                      k: int) -> list[int]:
    """k drafts, a pass each: `token` with `state` (one row) at pos0, then each draft at the next
    position with the last pass's own nextn row (an MTP head's, EAGLE-3's pre-norm state)."""
    drafts: list[int] = []
    row = state[None]
    for i in range(k):
        batch.set([token], pos0 + i, row, [True])
        ctx.process(batch)
        token = int(ctx.argmax_rows([0])[0][0])
        drafts.append(token)
        row = ctx.nextn_row(0)[None].copy()
    return drafts


def time_state_pass(ctx: LlamaContext, batch: TokenStateBatch, pos: int, repeats: int) -> float:
    """Median seconds of one single-token pass (a zero state) at `pos`, removed again."""
    zero = np.zeros((1, batch.width), dtype=np.float32)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        batch.set([0], pos, zero, [True])
        ctx.process(batch)
        ctx.argmax_rows([0])
        times.append(time.perf_counter() - t0)
        ctx.seq_rm(pos)
    return float(np.median(times))


class StateFedSource:
    """What the MTP head and EAGLE-3 share: they read the target's states of the tokens it keeps
    (`read`), queue them up to their next proposal (`_flush`: subclass), and draft a pass per token
    (`_draft`: subclass), timed as the step's draft time."""

    what = "a state-fed source"  # its name in errors
    _end = 0  # positions read

    def begin(self, prompt: list[int], st: GenerationStats, prefill: bool) -> None:
        if prefill:  # the prompt's states belong to reading the prompt, not to the first draft
            self._flush()

    def propose(self, history: list[int], n_past: int, k: int, st: GenerationStats,
                with_confidence: bool = False) -> tuple[list[int], np.ndarray | None]:
        if k <= 0:
            return [], None
        t0 = time.perf_counter()
        if n_past != self._end:
            raise GenerationError(f"{self.what}: asked to draft at position {n_past}, its states end at {self._end}")
        self._flush()
        drafts = self._draft(history[-1], n_past, k)
        dt = time.perf_counter() - t0
        st.t_draft_s += dt
        st.t_llama_s += dt
        return drafts, None  # no confidence: the controller picks k

    def accepted(self, anchor: int, emitted: list[int], n_past: int, st: GenerationStats) -> None:
        pass  # the verified tokens' states came with read()

    def _flush(self) -> None:
        raise NotImplementedError

    def _draft(self, anchor: int, n_past: int, k: int) -> list[int]:
        raise NotImplementedError


class MtpSource(StateFedSource):
    """The target's own MTP (nextn) head: no second file (Qwen3.5/3.6 GGUFs carry one). A second
    context on the target's model runs the head: at position p it reads token x_p with the target's
    last hidden state at p-1 (the nextn row each target decode outputs per token) and predicts
    x_{p+1}; a draft of k feeds each drafted token back with the head's own state, one pass per
    token: llama.cpp's draft-mtp (tests/test_drafts_equal_llama.py holds these drafts to its own).
    Its cache follows the verified history: the (token, state) pairs `read` gives wait, and are
    decoded in one batch before its next proposal (or once a batch's worth waits), so that steps
    another source drafts cost it no pass. (Not in one batch with the anchor's row: the anchor's
    state would then come from a pass of another size, whose kernels round differently from
    llama.cpp's, and later drafts drift from draft-mtp's.)"""

    name = "mtp"
    what = "MTP head"

    def __init__(self, target: LlamaContext, n_threads: int = 0, n_batch: int = 512):
        model = target.model
        self.target = target
        self.ctx = LlamaContext(model, ContextConfig(n_ctx=target.n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                                                     n_threads=n_threads, mtp=True))
        self.ctx.set_nextn_output(masked=True)  # its own state, for the draft rows only
        target.set_nextn_output(masked=False)  # the target's, for every token it decodes
        self.k_max = MTP_K_MAX
        self.width = model.n_embd_out
        self._batch = TokenStateBatch(self.ctx, self.ctx.n_batch, self.width)
        self._state = np.zeros(self.width, dtype=np.float32)  # the target's at _end - 1 (a new text: zeros)
        self._n = 0  # positions in its cache: 0.._n-1
        self._end = 0  # positions read: the queue holds _n.._end-1
        self._q_tokens: list[int] = []
        self._q_states: list[np.ndarray] = []  # blocks of rows, one per read

    def read(self, tokens: list[int], pos0: int) -> None:
        if pos0 != self._end:  # (the engine reads every kept token in order: a gap is a bug)
            raise GenerationError(f"MTP head: read tokens at position {pos0}, expected {self._end}")
        rows = self.target.nextn_rows(len(tokens))
        # token i pairs with the state before it: the last read's for the first, then this decode's rows
        self._q_states.append(np.vstack([self._state[None], rows[:-1]]))
        self._q_tokens.extend(tokens)
        self._state = rows[-1].copy()
        self._end = pos0 + len(tokens)
        if len(self._q_tokens) >= self._batch.capacity:
            self._flush()

    def _draft(self, anchor: int, n_past: int, k: int) -> list[int]:
        # the anchor with the target's state before it, then each draft with the head's own state
        drafts = draft_from_states(self.ctx, self._batch, anchor, self._state, n_past, k)
        self.ctx.seq_rm(n_past)  # the drafts' rows go (the anchor's too: the verify's read brings it back)
        self._n = n_past
        return drafts

    def trim(self, n_keep: int) -> bool:
        if n_keep >= self._end:
            return True
        if n_keep >= self._n:  # inside the queue: the pair of position n_keep holds the state before it
            states = np.vstack(self._q_states)
            m = n_keep - self._n
            self._state = states[m].copy()
            self._q_tokens, self._q_states = self._q_tokens[:m], [states[:m]]
        else:
            if not self.ctx.seq_rm(n_keep):
                self.reset()
                return True
            self._n = n_keep
            self._q_tokens, self._q_states = [], []
            # the state before position n_keep is not kept: zeros (one pair off, its drafts the worse)
            self._state = np.zeros(self.width, dtype=np.float32)
        self._end = n_keep
        return True

    def reset(self) -> None:
        self.ctx.clear()
        self._n = self._end = 0
        self._q_tokens, self._q_states = [], []
        self._state = np.zeros(self.width, dtype=np.float32)

    def time_pass(self, repeats: int = 7) -> float:
        """Median seconds of one single-token pass of the head after its cache (removed again): a
        draft of k costs about k of these (the controller's prior for this source's cost)."""
        return time_state_pass(self.ctx, self._batch, self._n, repeats)

    def _flush(self) -> None:
        """Decode the waiting pairs into its cache (no outputs)."""
        if not self._q_tokens:
            return
        states = np.vstack(self._q_states)
        step = self._batch.capacity
        for i in range(0, len(self._q_tokens), step):
            chunk = self._q_tokens[i:i + step]
            self._batch.set(chunk, self._n, states[i:i + step], [False] * len(chunk))
            self.ctx.process(self._batch)
            self._n += len(chunk)
        self._q_tokens, self._q_states = [], []

    def close(self) -> None:
        for o in (self._batch, self.ctx):
            o.close()


class Eagle3Source(StateFedSource):
    """An EAGLE-3 drafter: one decoder layer that drafts a pass per token. Its encoder (fc over three
    of the target's layer inputs, as DFlash's taps) turns each verified position P into a state g_P;
    its cache holds at P the pair (token P+1, g_P), so the last verified position waits for the next
    token: the anchor completes it as the first pass of a draft, whose own pre-norm output is the
    state of the next (llama.cpp's draft-eagle3, whose drafts tests/test_drafts_equal_llama.py holds
    these to). The target's features of the tokens `read` gives wait, and are encoded and decoded in
    one batch each before its next proposal (or once a batch's worth waits)."""

    name = "eagle3"
    what = "EAGLE-3"

    def __init__(self, path: str | Path, target: LlamaContext, n_threads: int = 0, n_batch: int = 512,
                 placement: ModelPlacement | None = None, progress=None):  # noqa: ANN001 - a load callback
        self.model = LlamaModel(path, placement, progress)
        self.target = target
        n_layer = target.model.n_layer
        self.layers = self.model.target_layers()
        if len(self.layers) != 3 or not all(0 < lid <= n_layer for lid in self.layers):
            raise GenerationError(f"{self.model.path}: EAGLE-3 reads 3 target layers within 1..{n_layer}, "
                                  f"not {self.layers}")
        # the inputs of layers below n_layer are taps; n_layer's is the target's last hidden state (nextn)
        target.enable_taps([lid for lid in self.layers if lid < n_layer])
        if n_layer in self.layers:
            target.set_nextn_output(masked=False)
        self.ctx = LlamaContext(self.model, ContextConfig(n_ctx=target.n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                                                          n_threads=n_threads), other=target)
        self.ctx.set_nextn_output(masked=True)  # the encoder's g and the decoder's pre-norm state
        self.k_max = EAGLE3_K_MAX
        self.width = self.model.n_embd
        self._batch = TokenStateBatch(self.ctx, self.ctx.n_batch, self.width)
        self._enc = TokenStateBatch(self.ctx, self.ctx.n_batch, 3 * target.model.n_embd)
        self._q_tokens: list[int] = []
        self._q_feats: list[np.ndarray] = []
        self._q_pos = 0  # the first queued token's position
        self._end = 0  # positions read
        self._g = np.zeros(self.width, dtype=np.float32)  # g of the last encoded position, whose pair waits
        self._g_pos = -1  # its position (-1: none)

    def read(self, tokens: list[int], pos0: int) -> None:
        if pos0 != self._end:
            raise GenerationError(f"EAGLE-3: read tokens at position {pos0}, expected {self._end}")
        n = len(tokens)
        taps = self.target.taps(n)
        e = self.target.model.n_embd
        blocks, j = [], 0
        for lid in self.layers:  # in the drafter's order: taps, or the last hidden state
            if lid < self.target.model.n_layer:
                blocks.append(taps[:, j * e:(j + 1) * e])
                j += 1
            else:
                blocks.append(self.target.nextn_rows(n))
        if not self._q_tokens:
            self._q_pos = pos0
        self._q_tokens.extend(tokens)
        self._q_feats.append(np.hstack(blocks))
        self._end = pos0 + n
        if len(self._q_tokens) >= self._batch.capacity:
            self._flush()

    def _draft(self, anchor: int, n_past: int, k: int) -> list[int]:
        if self._g_pos != n_past - 1:  # (a one-token prompt has no state yet: no draft, as llama.cpp)
            return []
        # the anchor completes the waiting pair; each draft then pairs with the pass's own state
        self.ctx.seq_rm(self._g_pos)
        drafts = draft_from_states(self.ctx, self._batch, anchor, self._g, self._g_pos, k)
        self.ctx.seq_rm(n_past)  # the drafts' pairs go; the anchor's stays, as llama.cpp's does
        return drafts

    def trim(self, n_keep: int) -> bool:
        if n_keep >= self._end:
            return True
        if n_keep > self._q_pos and self._q_tokens:  # inside the queue: what was encoded stays as it is
            m = n_keep - self._q_pos
            self._q_tokens = self._q_tokens[:m]
            self._q_feats = [np.vstack(self._q_feats)[:m]]
        else:
            # the pair at n_keep - 1 held the old next token: it goes; its g is the waiting one when
            # n_keep - 1 was the last position encoded, else it is not kept (zeros: one pair off, its
            # drafts the worse)
            self.ctx.seq_rm(max(0, n_keep - 1))
            self._q_tokens, self._q_feats = [], []
            if self._g_pos != n_keep - 1:
                self._g = np.zeros(self.width, dtype=np.float32)
                self._g_pos = n_keep - 1
        self._end = n_keep
        return True

    def reset(self) -> None:
        self.ctx.clear()
        self._q_tokens, self._q_feats = [], []
        self._q_pos = self._end = 0
        self._g = np.zeros(self.width, dtype=np.float32)
        self._g_pos = -1

    def time_pass(self, repeats: int = 7) -> float:
        """Median seconds of one decoder pass of one token after its cache (removed again)."""
        return time_state_pass(self.ctx, self._batch, max(0, self.ctx.pos_max() + 1), repeats)

    def _flush(self) -> None:
        """Encode the waiting features and write their pairs: (token P+1, g_P) at P, the first bridging
        from the last encoded position; the last position's g waits for its next token."""
        if not self._q_tokens:
            return
        feats = np.vstack(self._q_feats)
        n = len(self._q_tokens)
        g = np.empty((n, self.width), dtype=np.float32)
        step = self._enc.capacity
        for i in range(0, n, step):
            chunk = feats[i:i + step]
            base = self.ctx.pos_max() + 1  # (the encoder reads no positions: placeholders, as llama.cpp's)
            self._enc.set(None, base, chunk, True)
            self.ctx.process(self._enc, encode=True)
            g[i:i + len(chunk)] = self.ctx.nextn_rows(len(chunk))
        tokens, states, positions = [], [], []
        if self._g_pos >= 0 and self._g_pos + 1 == self._q_pos and self._g_pos > self.ctx.pos_max():
            tokens.append(self._q_tokens[0])
            states.append(self._g[None])
            positions.append(self._g_pos)
        tokens += self._q_tokens[1:]
        states.append(g[:-1])
        positions += list(range(self._q_pos, self._q_pos + n - 1))
        states = np.vstack(states)
        cap = self._batch.capacity
        for i in range(0, len(tokens), cap):
            self._batch.set(tokens[i:i + cap], 0, states[i:i + cap], False, positions[i:i + cap])
            self.ctx.process(self._batch)
        self._g, self._g_pos = g[-1].copy(), self._q_pos + n - 1
        self._q_tokens, self._q_feats = [], []

    def close(self) -> None:
        for o in (self._batch, self._enc, self.ctx, self.model):
            o.close()
