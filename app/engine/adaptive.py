"""Adaptive draft length: each step, the k in 0..k_max that maximises expected
tokens per second, from the measured cost model and a running estimate of
per-position acceptance. k = 0 is plain decoding, so speculation is never
chosen when it does not pay; while it does not pay, a short probe now and
then refreshes the acceptance estimate (drafting resumes when text becomes
predictable again). The choice is a pure function of the measurements: the
same costs and the same observed steps give the same sequence of k.

Acceptance model: p[j] = P(draft j+1 accepted | drafts 1..j accepted),
estimated from decayed counts per position (only positions a step actually
reached are updated), smoothed toward the estimate of the position before
it (a few pseudo-counts): a position never reached yet is assumed to behave
like its predecessor, so runs of full acceptance extend the draft and a
drafter that fails at position 1 is not tried deeper. Expected tokens for k
drafts: E(k) = 1 + sum_j prod p.
Expected time: cost.step_time(k, E(k)). Rate = E(k) / time.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import numpy as np

from app.engine.calibration import CostModel, calibrate, expected_tokens
from app.engine.draft_policy import StepTiming

if TYPE_CHECKING:
    from app.engine.dflash import Engine

CONF_BINS = np.array([0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 0.99, 1.01])


class AdaptiveDraftLength:
    def __init__(self, cost: CostModel, k_max: int, prior: float = 0.7, prior_weight: float = 2.0,
                 decay: float = 0.9, probe_every: int = 8, probe_max_gap: int = 64, probe_k: int = 2,
                 refresh_costs: bool = True, use_confidence: bool = False):
        self.cost = cost
        self.k_max = max(0, min(k_max, len(cost.verify_s) - 2, len(cost.draft_s) - 1))
        self.prior = prior
        self.prior_weight = prior_weight
        self.tried = np.zeros(self.k_max, dtype=np.float64)
        self.acc = np.zeros(self.k_max, dtype=np.float64)
        self.decay = decay
        self.probe_every = probe_every
        self.probe_max_gap = probe_max_gap
        self.probe_k = min(probe_k, self.k_max)
        self.refresh_costs = refresh_costs
        self._gap = probe_every
        self._plain_streak = 0
        self._probing = False
        self.history: list[int] = []
        self.predicted_step_s: list[float] = []  # the step time the cost model expected for each choice
        # draft confidence: acceptance given the drafter's own probability, per bin
        self.uses_confidence = use_confidence
        self.conf_tried = np.full(len(CONF_BINS) - 1, 1.0)
        self.conf_acc = 0.5 * (CONF_BINS[:-1] + CONF_BINS[1:]).clip(0, 1)  # prior: calibrated drafter
        self._last_bins: np.ndarray | None = None

    @property
    def acceptance(self) -> np.ndarray:
        """Current estimate of p[j], j = 0..k_max-1."""
        p = np.empty(self.k_max)
        q = self.prior
        for j in range(self.k_max):
            q = (self.acc[j] + self.prior_weight * q) / (self.tried[j] + self.prior_weight)
            p[j] = q
        return np.clip(p, 0.0, 0.999)

    def rates(self) -> list[float]:
        """Expected tokens per second for each k = 0..k_max: E(k) / cost.step_time(k, E(k)),
        for all k in one numpy pass (it runs every step, plain ones included)."""
        p = self.acceptance
        e = np.concatenate(([1.0], 1.0 + np.cumsum(np.cumprod(p))))
        ks = np.arange(self.k_max + 1)
        c = self.cost
        # step_time reads costs as non-decreasing in size: running maxima
        verify = np.maximum.accumulate(np.asarray(c.verify_s[1:], dtype=np.float64))
        draft = np.maximum.accumulate(np.asarray(c.draft_s[1:], dtype=np.float64))
        t = verify[np.minimum(ks + 1, len(c.verify_s) - 1) - 1] + c.inject_s * e
        t[1:] += draft[np.minimum(ks[1:], len(c.draft_s) - 1) - 1]
        return (e / t).tolist()

    def best_k(self) -> int:
        r = self.rates()
        return int(np.argmax(r))  # ties go to the smaller k

    def choose(self) -> int:
        k = self._probe_or(self.best_k())
        self.history.append(k)
        self.predicted_step_s.append(self.cost.step_time(k, expected_tokens(self.acceptance, k)))
        return k

    def _probe_or(self, k: int) -> int:
        """k, or a short probe once plain decoding has been chosen `_gap` times in a row."""
        self._probing = False
        if k == 0 and self.k_max > 0:
            self._plain_streak += 1
            if self._plain_streak >= self._gap:
                self._plain_streak = 0
                self._probing = True
                k = max(1, self.probe_k)
        else:
            self._plain_streak = 0
        return k

    def truncate(self, conf: np.ndarray) -> int:
        """Early stop inside a drafted block: keep the k' <= k drafts that
        maximise this step's expected tokens/s, with per-position acceptance
        read from the drafter's confidence (calibrated against what the
        target accepted so far). The drafter pass is paid either way."""
        bins = np.clip(np.searchsorted(CONF_BINS, conf, side="right") - 1, 0, len(CONF_BINS) - 2)
        self._last_bins = bins
        p = np.clip(self.conf_acc[bins] / self.conf_tried[bins], 0.0, 0.999)
        k = len(conf)
        draft_s = max(self.cost.draft_s[1:k + 1]) if k else 0.0
        best, best_rate = 0, -1.0
        for kk in range(k + 1):
            e = expected_tokens(p, kk)
            n = min(kk + 1, len(self.cost.verify_s) - 1)
            rate = e / (draft_s + max(self.cost.verify_s[1:n + 1]) + self.cost.inject_s * e)
            if rate > best_rate:
                best, best_rate = kk, rate
        return best

    def observe(self, k: int, accepted: int, timing: StepTiming) -> None:
        if self._last_bins is not None and k > 0:
            reached = min(accepted + 1, k)
            b = self._last_bins[:reached]
            np.add.at(self.conf_tried, b, 1.0)
            np.add.at(self.conf_acc, b[:accepted], 1.0)
        self._last_bins = None
        if k > 0:
            reached = min(accepted + 1, k)
            self.tried[:reached] = self.decay * self.tried[:reached] + 1.0
            self.acc[:reached] = self.decay * self.acc[:reached]
            self.acc[:accepted] += 1.0
            if self._probing:
                # a probe whose drafts all passed, or after which drafting pays again, brings the next
                # probe closer; a partial one after which plain decoding is still best pushes it away
                # (probing every few steps in text the drafter half-knows costs a few % of plain speed)
                promising = accepted == k or self.best_k() > 0
                self._gap = self.probe_every if promising else min(self._gap * 2, self.probe_max_gap)
        if self.refresh_costs:
            self.cost.update(k, timing.draft_s, timing.verify_s)


def new_adaptive_policy(engine: Engine, use_confidence: bool = False, **kw) -> AdaptiveDraftLength:  # noqa: ANN003
    """A controller for `engine`'s pair with its calibrated costs (cached on disk, or measured
    now). The caller owns it: a chat session keeps one, so what it learns about acceptance (and
    the refreshed costs) carries over from one reply to the next."""
    return AdaptiveDraftLength(copy.deepcopy(calibrate(engine)), engine.block_size - 1,
                               use_confidence=use_confidence, **kw)
