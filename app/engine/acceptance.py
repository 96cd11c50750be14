"""How far a source's drafts get accepted: a running estimate per draft position.

p[j] = P(draft j+1 accepted | drafts 1..j accepted), from decayed counts per
position (only positions a step actually reached are updated), smoothed
toward the estimate of the position before it (a few pseudo-counts): a
position never reached yet is assumed to behave like its predecessor, so runs
of full acceptance extend the draft and a source that fails at position 1 is
not tried deeper. Expected tokens of a step drafting k: E(k) = 1 + sum_j prod p.
"""

from __future__ import annotations

import math

import numpy as np


class AcceptanceModel:
    def __init__(self, k_max: int, prior: float = 0.7, prior_weight: float = 2.0, decay: float = 0.9):
        self.k_max = max(0, k_max)
        self.prior = prior
        self.prior_weight = prior_weight
        self.decay = decay
        self.tried = np.zeros(self.k_max, dtype=np.float64)
        self.acc = np.zeros(self.k_max, dtype=np.float64)
        # expected_both's last answer, kept while the counts are the same: the controller reads every
        # source's model every step, and most steps change one of them at most
        self._memo_key: tuple | None = None
        self._memo: tuple[np.ndarray, np.ndarray] = (np.ones(1), np.ones(1))

    @property
    def p(self) -> np.ndarray:
        """The current estimate of p[j], j = 0..k_max-1."""
        return np.array(self._smoothed(), dtype=np.float64).clip(0.0, 0.999)

    def _smoothed(self) -> list[float]:
        """p[j] before clipping: each position's counts smoothed toward the position before it. A
        recurrence over <= 16 positions, in Python floats: numpy's per-element indexing made it ~1 us
        a position, and the controller reads it every step (issue 30's host cost)."""
        w, q, out = self.prior_weight, self.prior, []
        for a, t in zip(self.acc.tolist(), self.tried.tolist()):
            q = (a + w * q) / (t + w)
            out.append(q)
        return out

    def expected(self, first: float = 1.0) -> np.ndarray:
        """E(k) for k = 0..k_max; `first` scales the first draft's acceptance (a source's record in
        this text, when it falls short of what this model expects)."""
        p = self.p
        p[:1] *= first
        return _expected(p)

    def expected_cautious(self, z: float, first: float = 1.0) -> np.ndarray:
        """E(k) for k = 0..k_max with each p[j] taken z standard errors low (a Beta posterior's over
        the decayed steps behind it and the prior's pseudo-counts): what a draft is worth while few
        steps back the estimate. A position never reached (a new model, a new reply) counts the
        prior's weight only, so it is valued far below its mean; many steps bring it to the mean."""
        return self.expected_both(z, first)[1]

    def expected_both(self, z: float, first: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
        """(expected(first), expected_cautious(z, first)) from one reading of p (the controller
        wants both for every source at every step). In Python floats over <= 16 positions (a dozen
        numpy calls cost more there), read-only arrays kept while the counts are the same."""
        key = (self.acc.tobytes(), self.tried.tobytes(), z, first)
        if key == self._memo_key:
            return self._memo
        w = self.prior_weight
        e, low = [1.0], [1.0]
        run_e = run_low = 1.0
        for j, (q, t) in enumerate(zip(self._smoothed(), self.tried.tolist())):
            p = min(max(q, 0.0), 0.999)
            lo = min(max(p - z * math.sqrt(p * (1.0 - p) / (t + w + 1.0)), 0.0), 0.999)
            if j == 0:
                p, lo = p * first, lo * first
            run_e *= p
            run_low *= lo
            e.append(e[-1] + run_e)
            low.append(low[-1] + run_low)
        both = np.array(e), np.array(low)
        for arr in both:
            arr.flags.writeable = False
        self._memo_key, self._memo = key, both
        return both

    def forget(self, keep: float) -> None:
        """Weigh what was seen so far by `keep` (a new reply: its text may not be like the last one's)."""
        self.tried *= keep
        self.acc *= keep

    def observe(self, k: int, accepted: int) -> None:
        """A step drafted k and `accepted` of them passed."""
        k = min(k, self.k_max)
        if k <= 0:
            return
        reached = min(accepted + 1, k)
        self.tried[:reached] = self.decay * self.tried[:reached] + 1.0
        self.acc[:reached] = self.decay * self.acc[:reached]
        self.acc[:min(accepted, k)] += 1.0


def _expected(p: np.ndarray) -> np.ndarray:
    """E(k) for k = 0..len(p): 1 + the sum over j < k of prod_{i<=j} p_i."""
    e = np.ones(len(p) + 1)
    e[1:] += p.cumprod().cumsum()
    return e


def expected_tokens(p: np.ndarray, k: int) -> float:
    """1 + sum_j prod_{i<=j} p_i: tokens per step when drafting k with per-position
    conditional acceptance p."""
    if k <= 0:
        return 1.0
    return 1.0 + float(np.cumprod(p[:k]).sum())
