"""What to draft at each step: from which source, and how many tokens.

Before each step the engine tells the policy what it could draft from
(`StepInfo`: the context lookup's match, whether a DFlash drafter is loaded,
how many target features wait to be injected into it) and asks `choose()`;
after the step it reports the outcome with `observe()`. Sources:

    plain    no draft: one token from the target
    lookup   the tokens that followed the last occurrence of the current
             context suffix (app.engine.lookup): no model pass
    dflash   the DFlash drafter's block (one drafter pass)
    draft-model  a classic draft model sharing the target's vocabulary: k
             greedy tokens, one pass each (app.engine.sources)

FixedDraftLength is upstream's behaviour (always the same source and k);
the controller (app.engine.controller) picks the source and k from measured
costs and acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from app.engine.lookup import LookupMatch

PLAIN = "plain"
LOOKUP = "lookup"
DFLASH = "dflash"
DRAFT_MODEL = "draft-model"
MTP = "mtp"  # the target's own MTP (nextn) head
EAGLE3 = "eagle3"  # an EAGLE-3 drafter
SOURCES = (PLAIN, LOOKUP, DFLASH, DRAFT_MODEL, MTP, EAGLE3)
LOOKUP_K_MAX = 15  # the longest lookup draft: a verify pass of 16 tokens, the calibrated range


@dataclass(frozen=True)
class Choice:
    source: str  # one of SOURCES
    k: int  # tokens to draft (0 with PLAIN)


PLAIN_STEP = Choice(PLAIN, 0)


@dataclass(frozen=True)
class StepInfo:
    """What a step could draft from."""
    lookup: LookupMatch | None  # the context lookup's match at the anchor, if any
    has_drafter: bool
    pending_rows: int = 0  # target features a DFlash step would inject first
    first: bool = False  # the reply's first step (its anchor is the prompt's last token)
    n_past: int = 0  # cache cells before this step's verify batch (its attention reads them all)
    sources: tuple[str, ...] = ()  # the engine's loaded draft sources (its registry's names)


@dataclass(frozen=True)
class StepTiming:
    draft_s: float = 0.0  # drafter pass, readout and trim (0 unless DFlash drafted)
    verify_s: float = 0.0  # target pass over k+1 tokens, with readout or sampling
    inject_s: float = 0.0  # feeding waiting target features to the drafter (a DFlash step's first act)
    step_s: float = 0.0  # the whole step


class DraftPolicy(Protocol):
    # True: the engine reads the drafter's confidence in each draft and asks truncate()
    uses_confidence: bool

    def choose(self, step: StepInfo) -> Choice:
        """What to draft at the next step."""

    def truncate(self, confidence: np.ndarray) -> int:
        """How many of the DFlash drafts to verify, given the drafter's probability of each."""

    def observe(self, choice: Choice, accepted: int, timing: StepTiming) -> None:
        """What happened at the step that drafted `choice` (its k as verified)."""


class FixedDraftLength:
    """Always k tokens from one source (DFlash by default; the lookup drafts only
    when it has a match, else the step is plain)."""

    uses_confidence = False

    def __init__(self, k: int, source: str = DFLASH):
        if source not in SOURCES:
            raise ValueError(f"unknown draft source {source!r}; expected one of {', '.join(SOURCES)}")
        self.k = max(0, int(k))
        self.source = source if self.k > 0 else PLAIN

    def choose(self, step: StepInfo) -> Choice:
        if self.source == LOOKUP and step.lookup is None:
            return PLAIN_STEP
        if self.source == DFLASH and not step.has_drafter:
            return PLAIN_STEP
        if self.source in (DRAFT_MODEL, MTP, EAGLE3) and self.source not in step.sources:
            return PLAIN_STEP
        return Choice(self.source, self.k)

    def truncate(self, confidence: np.ndarray) -> int:
        return len(confidence)

    def observe(self, choice: Choice, accepted: int, timing: StepTiming) -> None:
        pass
