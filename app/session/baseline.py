"""The plain-decoding baseline a reply's speedup is measured against.

Taken once per loaded model: from the cached calibration when there is one
(it measures plain decoding as part of its cost model), else from a short
plain run through the same engine, so the speedup shown is measured here,
on this machine, never assumed.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.engine.calibration import cached_calibration
from app.engine.dflash import Engine
from app.engine.params import GenerationParams

# a neutral request; its text only sets the context length (lowercase: tiny test vocabularies have no capitals)
BASELINE_REQUEST = "tell me a short story about a lighthouse keeper and the sea"
SOURCE_CALIBRATION = "calibration"
SOURCE_PLAIN_RUN = "plain run"
SOURCE_PLAIN_REPLY = "plain reply"  # the same prompt through the same session, just before (app.ui.headless)


@dataclass
class Baseline:
    tokens_per_s: float
    source: str  # how it was measured
    n_tokens: int = 0

    def to_dict(self) -> dict:
        return {"tokens_per_s": round(self.tokens_per_s, 3), "source": self.source, "n_tokens": self.n_tokens}


def measure_baseline(engine: Engine, prompt_text: str, n_tokens: int = 24) -> Baseline:
    """Plain tokens/s of `engine`'s target: the calibration's when this pair has one cached (the
    adaptive draft length calibrates on first use), else a short plain run of `prompt_text` (a chat
    prompt in the model's format). A full calibration is not started here: it takes far longer than
    the plain run on a CPU, and a user who never picks "auto" never needs it."""
    cached = cached_calibration(engine)
    if cached is not None and cached.plain_tokens_per_s > 0:
        return Baseline(float(cached.plain_tokens_per_s), SOURCE_CALIBRATION)
    return measure_plain_run(engine, prompt_text, n_tokens)


def measure_plain_run(engine: Engine, prompt_text: str, n_tokens: int = 24) -> Baseline:
    """Decode `n_tokens` greedily without drafting (after a short warm-up) and time it."""
    prompt = engine.tokenize(prompt_text)
    # the warm-up pays one-time costs (first graph build, page faults) the measurement should not see
    engine.complete(prompt, GenerationParams(max_tokens=2, speculative=False))
    st = engine.complete(prompt, GenerationParams(max_tokens=n_tokens, speculative=False)).stats
    engine.reset()
    return Baseline(st.tokens_per_s, SOURCE_PLAIN_RUN, st.n_generated)
