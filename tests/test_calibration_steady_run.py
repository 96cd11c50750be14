"""calibration.measure reads each size at its steady step: the second of a run on the CPU (llama.cpp's
graph reused), the third on a CUDA device (a CUDA graph is captured on the second same-shaped step and
replayed from the third). Driven by a loop whose steps cost what ggml-cuda's warm-up makes them cost."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.engine import calibration
from app.engine.draft_policy import StepTiming

PLAIN_MS = 1.5  # a replayed plain step (an H200's, the bundled target)
WARMUP = (3.0, 2.5)  # a step's cost over a replayed one: first of its size (no graph), second (captured)


@dataclass
class LoopStandIn:
    target_on_cuda: bool
    has_drafter: bool = False
    speculation_blocked: str | None = None
    block_size: int = 16
    n_ctx: int = 1024  # below LONG_PROMPT_LEN: no context terms

    def reset(self) -> None:
        pass


def cuda_like_steps(engine, choices, steps, prompt_len=0):  # noqa: ANN001, ANN201 - run_choices' stand-in
    out, since = [], 0
    for i in range(steps):
        c = choices[i % len(choices)]
        since = since + 1 if i and choices[(i - 1) % len(choices)].k == c.k else 0
        replay = (PLAIN_MS + 0.1 * c.k) / 1e3
        t = replay * (WARMUP[since] if since < len(WARMUP) else 1.0)
        out.append((c.k, StepTiming(step_s=t, verify_s=t), 100))
    return out


@pytest.mark.parametrize("on_cuda, steady_factor", [(True, 1.0), (False, WARMUP[1])])
def test_the_steady_step_is_the_replayed_one_on_cuda(monkeypatch, on_cuda, steady_factor) -> None:  # noqa: ANN001
    monkeypatch.setattr(calibration, "run_choices", cuda_like_steps)
    cm = calibration.measure(LoopStandIn(on_cuda), rounds=1, pairs=2)
    # runs of two on a CUDA device would price the capture as the steady plain step (2.5x)
    assert cm.verify_s[1] == pytest.approx(PLAIN_MS / 1e3 * steady_factor)
    assert cm.verify_s[4] / cm.verify_s[1] == pytest.approx((PLAIN_MS + 0.3) / PLAIN_MS)
    if on_cuda:  # a step of another size runs without a graph: what the controller charges a switch
        assert (WARMUP[0] - 1.0) * PLAIN_MS / 1e3 <= cm.switch_s <= (WARMUP[0] - 1.0) * (PLAIN_MS + 1.5) / 1e3
