"""The draft controller: each step, the source and draft length with the most
expected tokens per second.

Candidates: plain (no draft), lookup(k) for k up to the context match's
length, DFlash(k) for k up to the drafter's block. For each, expected tokens
E(k) come from the acceptance model of that source (the lookup's per match
length n and agreement, since a long match predicts better than a short one
and an n-gram always followed by the same token better than one followed by
different tokens; DFlash's by context length, since a drafter trained on short
text drafts worse over a long document) and expected
seconds from the calibrated cost model (app.engine.calibration): the target
pass over k+1 tokens at the step's context, the drafter pass and its injection call for DFlash
only, a graph rebuild when the verify size changes. Rate = E / seconds.
Plain decoding is a candidate, so speculation is never chosen when it does
not pay: a draft is chosen only where it beats plain decoding with its
acceptance taken `caution` standard errors low (few steps behind the
estimate, a new reply, a source whose drafts keep failing: the gain must hold
with the uncertainty, and at a long context, where a rejected draft's
attention over the cache costs more, it must hold by more). While it does
not pay, a short probe now and then refreshes the estimates (drafting
resumes when text becomes predictable again). The choice
is a pure function of the measurements: the same costs and the same observed
steps give the same sequence of choices.

One class serves every automatic mode: `sources=(DFLASH,)` is the adaptive
draft length, `(LOOKUP,)` speculation for a target without a drafter,
`(LOOKUP, DFLASH)` the hybrid.
"""

from __future__ import annotations

import bisect
import copy
from typing import TYPE_CHECKING

import numpy as np

from app.engine.acceptance import AcceptanceModel, expected_tokens
from app.engine.calibration import CostModel, LoopTimes, calibrate
from app.engine.draft_policy import (
    DFLASH,
    DRAFT_MODEL,
    EAGLE3,
    LOOKUP,
    LOOKUP_K_MAX,
    MTP,
    PLAIN_STEP,
    Choice,
    DraftPolicy,
    FixedDraftLength,
    StepInfo,
    StepTiming,
)
from app.engine.lookup import AGREED, AGREEMENTS, DEFAULT_MAX_N, MIXED
from app.engine.sources import DRAFT_MODEL_K_MAX, EAGLE3_K_MAX, MTP_K_MAX
from app.errors import DraftFormatMismatch
from gguf_tools.formats import DFLASH2 as DFLASH2_FORMAT
from gguf_tools.formats import DSPARK as DSPARK_FORMAT
from gguf_tools.formats import LABELS, draft_format
from gguf_tools.reader import read_gguf

if TYPE_CHECKING:
    from app.engine.dflash import Engine

CONF_BINS = np.array([0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 0.99, 1.01])
# prior acceptance of a lookup draft by match length n (1..max_n) of an n-gram seen once: a one-token
# match is a guess, a six-token one usually a copy; one always followed by the same token does better,
# one followed by different tokens passes 18-43% of the time (app.engine.lookup; by n in
# docs/bench/lookup-replay-cpu.json, scripts/lookup_replay.py); a handful of steps replace these with
# what the text shows
LOOKUP_PRIOR = (0.0, 0.25, 0.4, 0.5, 0.6, 0.65, 0.7)
LOOKUP_AGREED_PRIOR = (0.0, 0.6, 0.75, 0.85, 0.9, 0.9, 0.9)
LOOKUP_MIXED_PRIOR = 0.3
# at a reply's first step the anchor ends the prompt, usually a turn marker ("Assistant:",
# "<start_of_turn>model"), whose earlier occurrence is followed by an earlier answer (or a
# format's example): a guess, whatever the match length (the same replay: its first token passed
# 33% of the time in chat, 42% in documents; in HumanEval 164 of 164, the body's indentation after
# the docstring, but 2 drafts passed whole)
LOOKUP_FIRST_PRIOR = 0.25
# a draft that ends the reply at its stop string (app.engine.lookup): its first token passed 60% of
# the time (258 of 433) over the chat and document replies of docs/bench/hybrid-attn-cpu.json
# replayed (scripts/lookup_replay.py, docs/bench/lookup-replay-cpu.json), whatever the match
REPLY_END_PRIOR = 0.6
DFLASH_PRIOR = 0.7
# DFlash's acceptance is learned apart by the context's length (cells before the step: < 1,024, < 4,096,
# longer): a drafter trained on short sequences, reading a window of the last 2,048 positions, drafts
# far worse in an answer over a long document than in a chat, so what a chat taught it must not decide
# a document's steps. First drafts passing at k=3 in stop 40's done-when run (fixed mode, the shipped
# drafter, docs/bench/done-when-s40-cpu.json): 0.48-0.63 in chat and code (< 1k cells), 0.21 in docqa
# (1.4-2.3k), 0.17 at 2k, 0.10 at 8k. The long contexts' models keep what they learned from one reply to
# the next (a new question over a document is as hard for the drafter as the last): in stop 43's
# documents their estimate, halved back toward the prior at every reply, kept DFlash drafting at
# 0.11-0.36 accepted a step where a step cost 1.4x a plain one (docs/bench/docs-ab-s43-*.json)
DFLASH_CONTEXT_EDGES = (1024, 4096)
# a classic draft model's acceptance before any step: a same-family small model agrees with its target
# on most greedy tokens (what it learns replaces this within a few steps)
DRAFT_MODEL_PRIOR = 0.6
# the target's own MTP head: trained for the next token, its first draft passes about as often as a
# same-family draft model's (what it learns replaces this within a few steps)
MTP_PRIOR = 0.6
# an EAGLE-3 drafter, trained on its target's own outputs as a DFlash drafter is
EAGLE3_PRIOR = 0.6
# the sources that draft one pass per token, one after another (a draft of k costs k passes): their
# acceptance prior and longest draft
SEQUENTIAL = {DRAFT_MODEL: (DRAFT_MODEL_PRIOR, DRAFT_MODEL_K_MAX), MTP: (MTP_PRIOR, MTP_K_MAX),
              EAGLE3: (EAGLE3_PRIOR, EAGLE3_K_MAX)}
# a draft must beat plain decoding with its acceptance this many standard errors low: a fresh DFlash
# estimate (the prior alone) counts as 0.57, not 0.7, so an unproven drafter does not draft past ~10k
# cells, where a rejected draft costs more than a plain step gains. Chosen on the bundled pair (this
# VM's costs, questions over 2.5-3.2k tokens of three licences, 16 and 64 tokens: the cost model's
# clock): 0.5 beat no caution on all six (0.83-1.53x -> 0.94-1.57x); 1.0 and 1.5 lost most answers
# that copy the document by waiting (GPL, 16 tokens: 1.28x none, 1.42x 0.5, 1.17x 1.0, 1.12x 1.5)
CAUTION = 0.5
# at a reply's first step what was learned counts this much: the new text may not be like the last
REPLY_KEEP = 0.5
# the lookup's record in this text: how many of its first drafts passed against how many its models
# (one per match length and agreement) expected, decayed per lookup step, with this many pseudo-steps
# of agreement. Each model learns only from its own matches, so where matches keep failing every one
# of them was tried until its own steps said so: a 35-token answer over 8k tokens of a document
# drafted 20 lookup steps of which 2 passed, each ~5 ms dearer than a plain step
# (docs/bench/done-when-s38-cpu.json). A record short of the models scales their first draft's
# acceptance down by the ratio (never up: models that expect too little learn that themselves)
LOOKUP_TRUST_WEIGHT = 2.0
LOOKUP_TRUST_DECAY = 0.9
# what a probe may cost beyond a plain step, as a share of it, at the probe_every spacing (a DFlash probe
# of 2 at a chat's context here: ~0.45); a dearer one is spaced out in proportion
PROBE_REF = 0.5


class DraftController:
    def __init__(self, cost: CostModel, sources: tuple[str, ...] = (LOOKUP, DFLASH), dflash_k_max: int = 15,
                 lookup_k_max: int = LOOKUP_K_MAX, prior_weight: float = 2.0, decay: float = 0.9,
                 probe_every: int = 8, probe_max_gap: int = 64, probe_k: int = 2,
                 refresh_costs: bool = True, use_confidence: bool = False, pass_s: dict[str, float] | None = None,
                 caution: float = CAUTION, reply_keep: float = REPLY_KEEP):
        self.cost = cost
        self.caution = caution
        self.reply_keep = reply_keep
        self.sources = tuple(sources)
        n_max = len(cost.verify_s) - 2  # the longest draft the costs cover
        self.dflash_k_max = max(0, min(dflash_k_max, n_max, len(cost.draft_s) - 1)) if DFLASH in sources else 0
        self.lookup_k_max = max(0, min(lookup_k_max, n_max)) if LOOKUP in sources else 0
        # DFlash's acceptance, one (matched, unmatched) pair per context length (DFLASH_CONTEXT_EDGES); in
        # the hybrid, apart where the lookup has a match and where it has none: text that repeats is
        # easier for the drafter too, and where nothing repeats a DFlash step must earn its drafter pass
        # on its own
        self.dflash_by_context: list[tuple[AcceptanceModel, AcceptanceModel]] = []
        for _ in range(len(DFLASH_CONTEXT_EDGES) + 1):
            matched = AcceptanceModel(self.dflash_k_max, DFLASH_PRIOR, prior_weight, decay)
            unmatched = (AcceptanceModel(self.dflash_k_max, DFLASH_PRIOR, prior_weight, decay)
                         if LOOKUP in self.sources else matched)
            self.dflash_by_context.append((matched, unmatched))
        self.dflash, self.dflash_unmatched = self.dflash_by_context[0]  # a short context's
        self._last_dflash = self.dflash  # the model of the step being verified
        # [agreement][match length]
        self.lookup = [[AcceptanceModel(self.lookup_k_max, lookup_prior(a, n), prior_weight, decay)
                        for n in range(DEFAULT_MAX_N + 1)] for a in AGREEMENTS]
        # a reply's first step learned apart: a lookup there proposes how an earlier turn began
        self.lookup_first = AcceptanceModel(self.lookup_k_max, LOOKUP_FIRST_PRIOR, prior_weight, decay)
        # and drafts that end the reply: how often a reply ends where an earlier turn did
        self.lookup_end = AcceptanceModel(self.lookup_k_max, REPLY_END_PRIOR, prior_weight, decay)
        self._last_lookup = self.lookup[0][0]  # the lookup model of the step being verified
        self._lookup_passed = 0.0  # the lookup's record (decayed): first drafts that passed,
        self._lookup_expected = 0.0  # and what its models expected of them
        # a classic draft model and the target's MTP head: each one's acceptance, and what one of its
        # passes costs (a draft of k is k passes, one after another: measured at load by
        # new_controller, then learned from the steps)
        self.sequential = {name: AcceptanceModel(max(0, min(k_max, n_max)), prior, prior_weight, decay)
                           for name, (prior, k_max) in SEQUENTIAL.items() if name in sources}
        self.pass_s = {name: (pass_s or {}).get(name, 0.0) for name in self.sequential}
        self.probe_every = probe_every
        self.probe_max_gap = probe_max_gap
        self.probe_k = probe_k
        self.refresh_costs = refresh_costs
        self.seen = LoopTimes()  # the steady steps' times, for calibration.learn (the cached model)
        self._gap = probe_every
        self._plain_streak = 0
        self._probing = False
        self._last_n = 1  # verify size of the step before (a different size rebuilds the graph)
        self._last_ctx = 0  # cache cells before the step being verified (the cost's context terms)
        # with `record` (the bench): each choice, and the step time the cost model expected for it
        self.record = False
        self.history: list[Choice] = []
        self.predicted_step_s: list[float] = []
        # draft confidence: acceptance given the drafter's own probability, per bin
        self.uses_confidence = use_confidence
        self.conf_tried = np.full(len(CONF_BINS) - 1, 1.0)
        self.conf_acc = 0.5 * (CONF_BINS[:-1] + CONF_BINS[1:]).clip(0, 1)  # prior: calibrated drafter
        self._last_bins: np.ndarray | None = None

    @property
    def k_max(self) -> int:
        return max(self.dflash_k_max, self.lookup_k_max)

    def candidates(self, step: StepInfo) -> list[tuple[float, float, Choice]]:
        """(rate, expected seconds, choice) of every candidate, plain first, at the mean acceptance."""
        t_plain, rates = self._rates(step)
        out = [(1.0 / t_plain, t_plain, PLAIN_STEP)]
        for source, rate, _, t in rates:
            out += [(float(rate[i]), float(t[i]), Choice(source, i + 1)) for i in range(len(rate))]
        return out

    def _rates(self, step: StepInfo) -> tuple[float, list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]]:
        """(a plain step's expected seconds, [(source, rate, cautious rate, expected seconds) of
        drafting k = 1..K (index k - 1)] for each source that can draft at this step, in candidate
        order). All k of a source in one numpy pass, and no Choice made but the chosen one: this
        runs every step, plain ones included, and on a GPU its time is a share of the step (issue 30).
        A plain step is drafting 0: the first element of any source's step times."""
        c = self.cost
        ctx = step.n_past
        out, t_plain = [], None
        if self.lookup_k_max and step.lookup is not None and step.lookup.tokens:
            kk = min(self.lookup_k_max, len(step.lookup.tokens))
            e, low = self._lookup_model(step).expected_both(self.caution, self.lookup_trust)
            t = c.step_times(False, e[:kk + 1], self._last_n, False, ctx)
            t_plain = t[0]
            out.append((LOOKUP, e[1:kk + 1] / t[1:], low[1:kk + 1] / t[1:], t[1:]))
        if self.dflash_k_max and step.has_drafter:
            e, low = self._dflash_model(step).expected_both(self.caution)
            t = c.step_times(True, e, self._last_n, step.pending_rows > 0, ctx)
            t_plain = t[0]
            out.append((DFLASH, e[1:] / t[1:], low[1:] / t[1:], t[1:]))
        for name, model, t in self._sequential_costs(step):
            e, low = model.expected_both(self.caution)
            t_plain = t[0]
            if len(e) > 1:
                out.append((name, e[1:] / t[1:], low[1:] / t[1:], t[1:]))
        if t_plain is None:
            t_plain = c.step_times(False, np.ones(1), self._last_n, False, ctx)[0]
        return float(t_plain), out

    def choose(self, step: StepInfo) -> Choice:
        if step.first and self.reply_keep < 1.0:
            for m in self._text_models():
                m.forget(self.reply_keep)
            self._lookup_passed *= self.reply_keep
            self._lookup_expected *= self.reply_keep
        t_plain, rates = self._rates(step)
        # the best draft (by mean rate) among those whose cautious rate beats plain decoding; else
        # plain. Ties go to the earlier candidate (sources in order, then the shorter draft).
        t, choice, best = t_plain, PLAIN_STEP, 0.0
        for source, rate, low, ts in rates:
            sure = low > 1.0 / t_plain
            if sure.any():
                i = int(np.argmax(np.where(sure, rate, -np.inf)))
                if choice is PLAIN_STEP or rate[i] > best:
                    t, choice, best = float(ts[i]), Choice(source, i + 1), float(rate[i])
        self._probing = False
        if choice.k == 0 and rates:
            self._plain_streak += 1
            # a probe: probe_k drafts (or the lookup's whole match, if shorter) from the more
            # promising source; one that costs more than PROBE_REF of a plain step (a long context)
            # waits as many more plain steps, so that failed probes cost a short reply no more
            probes = [(float(rate[k - 1]), float(ts[k - 1]), Choice(source, k)) for source, rate, _, ts in rates
                      for k in [min(max(1, self.probe_k), len(rate))]]
            _, t_probe, probe = max(probes, key=lambda x: x[0])
            extra = (t_probe - t_plain) / t_plain
            if self._plain_streak >= self._gap * max(1.0, extra / PROBE_REF):
                self._plain_streak = 0
                self._probing = True
                t, choice = t_probe, probe
        else:
            self._plain_streak = 0
        self._last_lookup = self._lookup_model(step)
        self._last_dflash = self._dflash_model(step)
        self._last_ctx = step.n_past
        if self.record:
            self.history.append(choice)
            self.predicted_step_s.append(t)
        return choice

    def truncate(self, conf: np.ndarray) -> int:
        """Early stop inside a DFlash block: keep the k' <= k drafts that maximise this step's
        expected tokens/s, with per-position acceptance read from the drafter's confidence
        (calibrated against what the target accepted so far). The drafter pass is paid either way."""
        bins = np.clip(np.searchsorted(CONF_BINS, conf, side="right") - 1, 0, len(CONF_BINS) - 2)
        self._last_bins = bins
        p = np.clip(self.conf_acc[bins] / self.conf_tried[bins], 0.0, 0.999)
        e = np.array([expected_tokens(p, kk) for kk in range(len(conf) + 1)])
        t = self.cost.step_times(False, e, self._last_n, False, self._last_ctx) + self.cost.draft_time(len(conf))
        return int(np.argmax(e / t))

    def observe(self, choice: Choice, accepted: int, timing: StepTiming) -> None:
        k = choice.k
        if choice.source == DFLASH:
            if self._last_bins is not None:
                b = self._last_bins[:min(accepted + 1, k)]
                np.add.at(self.conf_tried, b, 1.0)
                np.add.at(self.conf_acc, b[:accepted], 1.0)
            self._last_dflash.observe(k, accepted)
        elif choice.source == LOOKUP:
            if k > 0:
                d = LOOKUP_TRUST_DECAY
                self._lookup_passed = d * self._lookup_passed + (accepted > 0)
                self._lookup_expected = d * self._lookup_expected + float(self._last_lookup.p[0])
            self._last_lookup.observe(k, accepted)
        elif choice.source in self.sequential:
            self.sequential[choice.source].observe(k, accepted)
            if k > 0 and timing.draft_s > 0:  # its passes' cost, clipped as the cost model's updates are
                cur = self.pass_s[choice.source] or timing.draft_s / k
                self.pass_s[choice.source] = cur + 0.1 * (min(max(timing.draft_s / k, 0.5 * cur), 2.0 * cur) - cur)
        self._last_bins = None
        if self._probing:
            # a probe whose drafts all passed, or after which drafting pays again, brings the next
            # probe closer; a partial one after which plain decoding is still best pushes it away
            # (probing every few steps in text no source knows costs a few % of plain speed); one whose
            # drafts all passed is followed by another at once, while they pass: drafts the cautious
            # estimate does not trust yet are proven by probes, and text turned predictable is found
            if accepted == k:
                self._gap = 1
            elif self._drafting_pays(choice.source):
                self._gap = self.probe_every
            else:
                self._gap = min(max(self._gap, self.probe_every) * 2, self.probe_max_gap)
        switched = k + 1 != self._last_n
        self._last_n = k + 1
        if not switched:  # a rebuild step's time is not the size's cost
            t = timing.step_s - timing.draft_s - timing.inject_s  # the step without the drafter's work
            k_draft = k if choice.source == DFLASH else 0
            # learned as the costs were measured (their context, their machine speed: the live paces'),
            # from steps the near context terms read back (a long document's would carry the far pieces'
            # error into every size's cost at a short context)
            if self._last_ctx <= self.cost.near_ctx_end:
                self.seen.add(k + 1, self.cost.at_unit_pace(k + 1, t, self._last_ctx), k_draft, timing.draft_s)
            if self.refresh_costs:
                self.cost.update(k + 1, t, k_draft, timing.draft_s, n_past=self._last_ctx)

    @property
    def lookup_trust(self) -> float:
        """The lookup's first drafts that passed in this text over what its models expected (at
        most 1): what scales their first draft's acceptance."""
        w = LOOKUP_TRUST_WEIGHT
        return min(1.0, (self._lookup_passed + w) / (self._lookup_expected + w))

    def _lookup_model(self, step: StepInfo) -> AcceptanceModel:
        if step.first:
            return self.lookup_first
        if step.lookup is None:
            return self.lookup[0][0]
        if step.lookup.ends_reply:
            return self.lookup_end
        return self.lookup[step.lookup.agreement][min(step.lookup.n, DEFAULT_MAX_N)]

    def _text_models(self) -> list[AcceptanceModel]:
        """The acceptance models of the text (not of a reply's first step or its end), each once: what a
        new reply forgets in part (DFlash's long contexts' models keep theirs: DFLASH_CONTEXT_EDGES)."""
        models = list(dict.fromkeys(self.dflash_by_context[0]))
        return models + [m for row in self.lookup for m in row]

    def _sequential_costs(self, step: StepInfo) -> list[tuple[str, AcceptanceModel, np.ndarray]]:
        """[(source, acceptance model, expected seconds of drafting k = 0..k_max)] of each source that
        drafts a pass per token (a classic draft model, an MTP head) the engine has: the target's
        verify of k+1 and k of its passes."""
        out = []
        for name, model in self.sequential.items():
            if model.k_max and name in step.sources:
                e = model.expected()
                t = self.cost.step_times(False, e, self._last_n, False, step.n_past)
                out.append((name, model, t + self.pass_s[name] * np.arange(len(e))))
        return out

    def _dflash_model(self, step: StepInfo) -> AcceptanceModel:
        matched, unmatched = self.dflash_by_context[bisect.bisect_right(DFLASH_CONTEXT_EDGES, step.n_past)]
        return matched if step.lookup is not None else unmatched

    def _drafting_pays(self, source: str) -> bool:
        """Whether some draft of `source` now beats plain decoding, cautiously (no switch cost counted)."""
        c = self.cost
        model = self._last_dflash if source == DFLASH else self._last_lookup
        model = self.sequential.get(source, model)
        trust = self.lookup_trust if source == LOOKUP else 1.0
        e = model.expected(trust)
        t = c.step_times(source == DFLASH, e, None, source == DFLASH, self._last_ctx)
        t = t + self.pass_s.get(source, 0.0) * np.arange(len(e))  # a sequential source's k passes
        r = model.expected_cautious(self.caution, trust) / t
        r[0] = 1.0 / t[0]
        return bool(r[1:].max(initial=0.0) > r[0])


def lookup_prior(agreement: int, n: int) -> float:
    """The prior acceptance of a lookup draft after a match of n tokens of this agreement."""
    if agreement == MIXED:
        return LOOKUP_MIXED_PRIOR
    table = LOOKUP_AGREED_PRIOR if agreement == AGREED else LOOKUP_PRIOR
    return table[min(n, len(table) - 1)]


def new_controller(engine: Engine, sources: tuple[str, ...] = (LOOKUP, DFLASH, DRAFT_MODEL, MTP, EAGLE3),
                   use_confidence: bool = False, **kw) -> DraftController:  # noqa: ANN003
    """A controller for `engine`'s pair with its calibrated costs (cached on disk, or measured
    now); sources the engine cannot draft from (DFlash without a drafter) are left out. The
    caller owns it: a chat session keeps one, so what it learns about acceptance (and the
    refreshed costs) carries over from one reply to the next."""
    usable = tuple(s for s in sources if (s != DFLASH or engine.has_drafter)
                   and (s not in SEQUENTIAL or s in engine.sources))
    kw.setdefault("pass_s", {s: engine.sources[s].time_pass() for s in usable if s in SEQUENTIAL})
    return DraftController(copy.deepcopy(calibrate(engine)), usable, dflash_k_max=engine.block_size - 1,
                           use_confidence=use_confidence, **kw)


# modes named after a DFlash-family drafter format: `fixed` (the DFlash source's drafts, the drafter's
# block or draft_max every step) on a drafter of that format only
FORMAT_MODES = {"dflash2": DFLASH2_FORMAT, "dspark": DSPARK_FORMAT}
# the draft modes a caller can ask for by name (the CLI, the bench)
DRAFT_MODES = ("plain", "fixed", "lookup", "adaptive", "adaptive-conf", "hybrid", "draft-model", "mtp", "eagle3",
               *FORMAT_MODES)
DEFAULT_LOOKUP_K = 3  # a fixed lookup draft's length when none is given


def check_format_mode(engine: Engine, mode: str) -> None:
    """A mode of FORMAT_MODES on a load without a drafter of its format raises DraftFormatMismatch,
    naming the loaded drafter's file and format; any other mode passes."""
    if mode not in FORMAT_MODES:
        return
    want = FORMAT_MODES[mode]
    label = LABELS[want]
    path = engine.drafter_path  # a DFlash-family drafter's, or an EAGLE-3 drafter's
    if path is None:
        raise DraftFormatMismatch(f"the mode {mode} drafts from a {label} drafter; none is loaded (--drafter)")
    if not engine.has_drafter or engine.drafter_format != want:
        have = draft_format(read_gguf(path)).label
        raise DraftFormatMismatch(f"the mode {mode} needs a {label} drafter; {path.name} is a {have} file")


def policy_for_mode(engine: Engine, mode: str, draft_max: int | None = None) -> DraftPolicy:
    """The policy of a named mode: plain decoding; fixed (the DFlash drafter's block, or
    draft_max, every step: upstream's loop); lookup (the context lookup's draft of draft_max
    tokens whenever it matches); adaptive (the controller over DFlash alone; -conf: with early
    stops at the drafter's confidence); hybrid (the controller over every loaded source: lookup,
    DFlash, a classic draft model, the target's MTP head, an EAGLE-3 drafter); draft-model, mtp and
    eagle3 (the controller over that source alone, or with draft_max its draft of that many tokens
    every step: llama.cpp's draft-simple, draft-mtp and draft-eagle3); dflash2 and dspark (fixed,
    refused unless the loaded drafter is of that format: check_format_mode)."""
    if mode in FORMAT_MODES:
        check_format_mode(engine, mode)
        mode = "fixed"
    if mode == "plain":
        return FixedDraftLength(0)
    if mode == "fixed":
        k = engine.block_size - 1 if draft_max is None else draft_max
        return FixedDraftLength(min(k, engine.block_size - 1) if engine.has_drafter else 0)
    if mode == "lookup":
        return FixedDraftLength(min(DEFAULT_LOOKUP_K if draft_max is None else draft_max, LOOKUP_K_MAX), LOOKUP)
    if mode in ("adaptive", "adaptive-conf"):
        return new_controller(engine, (DFLASH,), use_confidence=mode == "adaptive-conf")
    if mode == "hybrid":
        return new_controller(engine, (LOOKUP, DFLASH, DRAFT_MODEL, MTP, EAGLE3))
    if mode in SEQUENTIAL:
        if draft_max is not None:
            return FixedDraftLength(draft_max, mode)
        return new_controller(engine, (mode,))
    raise ValueError(f"unknown draft mode {mode!r}; expected one of {', '.join(DRAFT_MODES)}")
