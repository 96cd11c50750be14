"""The teacher-forced losslessness check (docs/design.md, section 3, "What lossless can mean").

llama.cpp's batched and single-token kernels round differently, so a correct
speculative run on a quantized model is not token-identical to plain
decoding. What must hold instead: re-running the target one token at a time
over prompt + output, every emitted greedy token is the single-token argmax
or within a near-tie margin of it. A hard mismatch is a real error.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.engine.dflash import Engine
from app.engine.params import GenerationParams

# Batched-vs-single rounding on Gemma 3 270M Q4_K_M moves logits by far less
# than this; a wrong token is typically several logits below the argmax.
NEAR_TIE_MARGIN = 1.0


@dataclass
class LosslessReport:
    n_checked: int
    near_ties: int
    hard_mismatches: list[dict] = field(default_factory=list)
    max_deficit: float = 0.0

    @property
    def lossless(self) -> bool:
        return not self.hard_mismatches

    def to_dict(self) -> dict:
        return {"lossless": self.lossless, "n_checked": self.n_checked, "near_ties": self.near_ties,
                "hard_mismatches": self.hard_mismatches, "max_deficit": round(self.max_deficit, 4)}


def check_lossless(engine: Engine, prompt: list[int], output: list[int],
                   margin: float = NEAR_TIE_MARGIN, params: GenerationParams | None = None) -> LosslessReport:
    """Check a greedy output token by token against single-token decoding (with `params`: of the
    logits its bias and penalties adjust, as the sampler does). Leaves the engine's caches empty."""
    if not output:
        return LosslessReport(0, 0)
    argmax, deficit = engine.reference_scores(prompt, output, params)
    rep = LosslessReport(len(output), 0)
    for i, (tok, best, d) in enumerate(zip(output, argmax.tolist(), deficit.tolist())):
        if tok == best:
            continue
        rep.max_deficit = max(rep.max_deficit, d)
        if d <= margin:
            rep.near_ties += 1
        else:
            rep.hard_mismatches.append({"position": i, "token": tok, "argmax": best, "deficit": round(d, 4)})
    return rep
