"""The DFlash loop on the real Gemma 3 270M Q4_K_M target.

Batched and single-token kernels round differently on quantized models, so
identity with plain decoding is not the bar here; the teacher-forced check
is (docs/design.md, section 3): every greedy token is the single-token argmax or within the
near-tie margin of it, and the check itself rejects a corrupted output."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.engine.dflash import Engine
from app.engine.draft_policy import Choice
from app.engine.lossless import NEAR_TIE_MARGIN, check_lossless
from app.engine.params import GenerationParams
from app.errors import PairMismatch

pytestmark = pytest.mark.gemma

PROMPT = 'def is_sorted(values):\n    """Return True if the list is sorted in ascending order."""\n'


def generate(engine: Engine, prompt: list[int], params: GenerationParams, **kw) -> tuple[list[int], object]:
    out: list[int] = []
    ev = None
    for ev in engine.generate(prompt, params, **kw):
        out += ev.tokens
        n_past = len(prompt) - 1 + len(out)
        assert engine.cache_positions() == (n_past - 1, n_past - 1)
    return out, ev


def test_random_drafter_and_oracle_drafts_are_lossless(gemma_engine: Engine) -> None:
    e = gemma_engine
    prompt = e.tokenize(PROMPT)
    plain, _ = generate(e, prompt, GenerationParams(max_tokens=32, speculative=False))
    spec, ev = generate(e, prompt, GenerationParams(max_tokens=32, draft_max=4))
    assert ev.stats.drafted > 0
    rep = check_lossless(e, prompt, spec)
    assert rep.lossless, rep.hard_mismatches

    def oracle(hist: list[int], choice: Choice) -> list[int]:
        i = len(hist) - len(prompt)
        return plain[i:i + choice.k]

    forced, ev = generate(e, prompt, GenerationParams(max_tokens=32, draft_max=7), draft_override=oracle)
    # plain text is an imperfect oracle: batched verification may break a near-tie differently,
    # after which the texts part ways; multi-token acceptance still happens up to there
    assert ev.stats.accepted >= 8 and max(ev.stats.accepted_history) >= 3
    rep = check_lossless(e, prompt, forced)
    assert rep.lossless, rep.hard_mismatches
    assert rep.max_deficit <= NEAR_TIE_MARGIN


@pytest.mark.parametrize("fmt", ["dflash2", "dspark"])
def test_dflash2_and_dspark_drafters_are_lossless_on_the_real_target(gemma_target: Path, fmt: str,
                                                                     tmp_path: Path) -> None:
    """Random DFlash2 (z-lab's top 16) and DSpark drafters for Gemma's 262k vocabulary: the selector's
    lattice and the Markov head at full width, then the teacher-forced check."""
    from app.engine.dflash import EngineConfig
    from gguf_tools.synth import DFlash2Shape, DSparkShape, write_drafter

    extra = {"dflash2": DFlash2Shape(selector_top_k=16)} if fmt == "dflash2" else {"dspark": DSparkShape()}
    drafter = write_drafter(tmp_path / f"gemma-{fmt}.gguf", gemma_target, n_layer=1, dtype=np.float16, **extra)
    e = Engine(gemma_target, drafter, EngineConfig(n_ctx=512))
    try:
        assert e.drafter_format == fmt
        prompt = e.tokenize(PROMPT)
        spec, ev = generate(e, prompt, GenerationParams(max_tokens=24, draft_max=4))
        assert ev.stats.drafted > 0
        rep = check_lossless(e, prompt, spec)
        assert rep.lossless, rep.hard_mismatches
    finally:
        e.close()


def test_lossless_check_rejects_a_corrupted_output(gemma_engine: Engine) -> None:
    e = gemma_engine
    prompt = e.tokenize(PROMPT)
    out, _ = generate(e, prompt, GenerationParams(max_tokens=24, speculative=False))
    assert check_lossless(e, prompt, out).lossless
    bad = list(out)
    bad[6] = e.tokenize(" banana", add_special=False)[0]
    rep = check_lossless(e, prompt, bad)
    assert not rep.lossless
    assert rep.hard_mismatches[0]["position"] == 6


def test_sampled_output_follows_the_target_distribution(gemma_engine: Engine) -> None:
    """Second generated token over many seeds, plain vs DFlash: a chi-square
    test of homogeneity must not tell the two samplers apart."""
    from scipy.stats import chi2_contingency

    e = gemma_engine
    prompt = e.tokenize("My favourite fruit is")
    counts: dict[str, dict[int, int]] = {"plain": {}, "dflash": {}}
    n = 60
    for seed in range(n):
        for mode, spec in (("plain", False), ("dflash", True)):
            params = GenerationParams(max_tokens=2, temperature=1.0, top_k=8, seed=1000 + seed, speculative=spec,
                                      draft_max=1)
            out, _ = generate(e, prompt, params)
            counts[mode][out[1]] = counts[mode].get(out[1], 0) + 1
    keys = sorted(set(counts["plain"]) | set(counts["dflash"]))
    table = np.array([[counts[m].get(k, 0) for k in keys] for m in ("plain", "dflash")])
    table = table[:, table.sum(0) >= 5] if (table.sum(0) >= 5).sum() >= 2 else table
    assert table.shape[1] >= 2, "the prompt should give a spread-out distribution"
    _, p, _, _ = chi2_contingency(table)
    assert p > 0.01, (p, table)


def test_engine_refuses_a_mismatched_drafter(gemma_target: Path, tiny_pair: tuple[Path, Path]) -> None:
    with pytest.raises(PairMismatch) as ei:
        Engine(gemma_target, tiny_pair[1])
    msg = str(ei.value)
    assert str(gemma_target) in msg and str(tiny_pair[1]) in msg
    assert "hidden size" in msg and "vocabulary" in msg


def test_the_warm_up_leaves_nothing_behind(gemma_engine: Engine) -> None:
    """Engine.warm_up (run at load: each pass at its largest size once, so that the first reply does not
    pay llama.cpp's first touch of its buffers) leaves both caches empty and changes no reply."""
    e = gemma_engine
    prompt = e.tokenize(PROMPT)
    params = GenerationParams(max_tokens=24, draft_max=4)
    e.reset()  # both replies from empty caches: the same batches, the same rounding
    first, _ = generate(e, prompt, params)
    assert e.cache_positions() != (-1, -1)
    e.warm_up()
    assert e.cache_positions() == (-1, -1) and e.pending_rows == 0
    again, ev = generate(e, prompt, params)
    assert again == first and ev.stats.n_prompt_reused == 0
