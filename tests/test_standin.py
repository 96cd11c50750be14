"""The bandwidth-bound stand-in (issue 30, point 2): a real shape, random Q4_K_M weights, a DFlash
drafter of block 16 that llama.cpp loads with it; and drafts forced at a per-position profile pass
as the profile says in the real loop, lossless (app.bench.forced)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from app.bench.forced import ZLAB_BLOCK16, profile_drafts, tau
from app.engine.dflash import Engine, EngineConfig
from app.engine.draft_policy import FixedDraftLength
from app.engine.params import GenerationParams
from gguf_tools.reader import read_gguf
from gguf_tools.synth import STANDINS, write_standin


@pytest.fixture(scope="module")
def small_standin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_standin(tmp_path_factory.mktemp("standin"), "small")


def test_standin_has_the_shape_and_type(small_standin: tuple[Path, Path]) -> None:
    target, drafter = small_standin
    spec = STANDINS["small"]
    info = read_gguf(target)
    assert info.arch == "qwen3" and info.n_layer == spec.shape.n_layer and info.n_embd == spec.shape.n_embd
    assert len(info.get("tokenizer.ggml.tokens")) == spec.n_vocab
    types = {t.name: t.type_name for t in info.tensors}
    assert types["blk.0.ffn_gate.weight"] == "Q4_K" and "output.weight" not in types  # Q4_K_M, tied head
    assert not list(target.parent.glob("*.tmp.gguf"))  # the F16 intermediate is gone
    d = read_gguf(drafter)
    assert d.arch == "dflash" and {t.type_name for t in d.tensors if t.name.endswith("attn_q.weight")} == {"Q8_0"}


def _generate(e: Engine, prompt: list[int], params: GenerationParams, **kw) -> tuple[list[int], object]:  # noqa: ANN003
    out, ev = [], None
    for ev in e.generate(prompt, params, **kw):
        out += ev.tokens
    return out, ev


@pytest.mark.parametrize("profile, lo, hi", [
    ((1.0,) * 15, 15.5, 16.0),  # every draft passes: 16 tokens a step, bar the end of the reply
    (ZLAB_BLOCK16, tau(ZLAB_BLOCK16) - 1.0, tau(ZLAB_BLOCK16) + 1.0),  # tau 5.95
    ((0.0,) * 15, 1.0, 1.0),
])
def test_forced_profile_in_the_loop(small_standin: tuple[Path, Path], profile: tuple[float, ...], lo: float,
                                    hi: float) -> None:
    e = Engine(*small_standin, EngineConfig(n_ctx=1024, n_threads=1))
    try:
        assert e.block_size == 16
        prompt = [(7 + 13 * i) % 4000 + 100 for i in range(32)]
        plain, _ = _generate(e, prompt, GenerationParams(max_tokens=400, speculative=False))
        forced = profile_drafts(len(prompt), plain, profile, e.target.n_vocab, np.random.default_rng(0))
        out, ev = _generate(e, prompt, GenerationParams(max_tokens=400), policy=FixedDraftLength(15),
                            draft_override=forced)
        assert out == plain
        steps = ev.stats.accepted_history[:-1]  # the last step is cut by max_tokens
        assert lo <= 1 + np.mean(steps) <= hi, steps
    finally:
        e.close()
