"""Drafts forced at a per-position acceptance profile: the loop (or the controller alone)
run as if a drafter of known quality drafted, whatever drafter is loaded.

A profile p[j] is P(draft j+1 passes | drafts 1..j passed), as the controller's
acceptance model (app.engine.acceptance) reads it. Forced drafts copy the plain
output and spoil the first draft that the profile says fails: the target then
accepts exactly the leading drafts the profile let through, and the output is
plain decoding's (the loop is lossless whatever it is given).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from app.engine.acceptance import expected_tokens
from app.engine.draft_policy import Choice

# A good DFlash drafter at block 16 (15 drafts): tau = E(15) = 5.95 tokens per step, the
# acceptance length z-lab publish for their Qwen3 drafters at block 16 (~6 on chat, more on
# math and code). Only tau is published; the per-position shape (falling half a
# point a position) is ours.
ZLAB_BLOCK16 = tuple(round(0.86 - 0.005 * j, 3) for j in range(15))


def tau(profile: tuple[float, ...] | np.ndarray, k: int | None = None) -> float:
    """Expected tokens per step drafting k (all of the profile by default)."""
    p = np.asarray(profile, dtype=np.float64)
    return expected_tokens(p, len(p) if k is None else k)


def accepted(profile: tuple[float, ...] | np.ndarray, k: int, rng: np.random.Generator) -> int:
    """How many of k drafts pass, drawn from the profile."""
    n = 0
    while n < min(k, len(profile)) and rng.random() < profile[n]:
        n += 1
    return n


def profile_drafts(prompt_len: int, plain: list[int], profile: tuple[float, ...], n_vocab: int,
                   rng: np.random.Generator) -> Callable[[list[int], Choice], list[int]]:
    """An Engine draft_override: each step's k drafts are the plain output's next tokens with the
    first one the profile fails replaced by another token (so the target rejects it there)."""
    def forced(hist: list[int], choice: Choice) -> list[int]:
        i = len(hist) - prompt_len
        d = list(plain[i:i + choice.k])
        a = accepted(profile, len(d), rng)
        if a < len(d):
            d[a] = (d[a] + 1) % n_vocab
        return d
    return forced
