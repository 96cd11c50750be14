"""Greedy tokens from llama.cpp's backend sampling (the argmax in the graph, no logits copied out)
on the real Gemma 3 270M target: the same tokens as the argmax in C, row for row in a verify batch
and token for token through the DFlash loop, plain and speculative.

The engine uses one sequence (seq 0), so one sequence is what is checked. Each check also shows the
backend path was the one taken (the logits are not there to read), so a silent fallback to the
argmax in C cannot pass it."""

from __future__ import annotations

import pytest

from app.engine.dflash import Engine, EngineConfig
from app.engine.draft_policy import Choice
from app.engine.llama_objects import ContextConfig, LlamaContext, LlamaModel, TokenBatch
from app.engine.lossless import check_lossless
from app.engine.params import GenerationParams
from app.errors import GenerationError

pytestmark = pytest.mark.gemma

PROMPT = 'def is_sorted(values):\n    """Return True if the list is sorted in ascending order."""\n'


def test_backend_rows_equal_the_argmax_in_c(gemma_target) -> None:  # noqa: ANN001 - a fixture path
    model = LlamaModel(gemma_target)
    ctx = LlamaContext(model, ContextConfig(n_ctx=512, n_batch=64, n_ubatch=64, backend_greedy_rows=16))
    batch = TokenBatch(64)
    try:
        toks = model.tokenize(PROMPT)[:16]
        batch.set(toks, 0, True)
        ctx.decode(batch)
        want = ctx.argmax_rows(list(range(len(toks))))[0]
        assert ctx.use_backend_greedy(True)
        ctx.seq_rm(0)
        ctx.decode(batch)
        got = ctx.greedy_rows(list(range(len(toks))))
        assert got.tolist() == want.tolist()
        assert len(set(got.tolist())) > 4  # rows that differ: a row read for another would show
        assert ctx.greedy_rows([3, 7]).tolist() == [want[3], want[7]]
        with pytest.raises(GenerationError, match="sampled in the graph"):
            ctx.logits_row(0)  # not copied out: the tokens above came from the graph
        assert not ctx.use_backend_greedy(False)
        ctx.seq_rm(0)
        ctx.decode(batch)
        assert ctx.greedy_rows(list(range(len(toks)))).tolist() == want.tolist()  # the C path again
    finally:
        batch.close()
        ctx.close()
        model.close()


def test_a_context_without_the_option_stays_on_the_argmax_in_c(gemma_target) -> None:  # noqa: ANN001
    model = LlamaModel(gemma_target)
    ctx = LlamaContext(model, ContextConfig(n_ctx=256, n_batch=32, n_ubatch=32))
    try:
        assert not ctx.use_backend_greedy(True)
    finally:
        ctx.close()
        model.close()


@pytest.fixture(scope="module")
def backend_engine(gemma_target, gemma_random_drafter):  # noqa: ANN001, ANN201 - fixture paths
    e = Engine(gemma_target, gemma_random_drafter, EngineConfig(n_ctx=2048, backend_greedy=True))
    yield e
    e.close()


def _generate(engine: Engine, prompt: list[int], params: GenerationParams, **kw) -> tuple[list[int], object]:
    out: list[int] = []
    ev = None
    for ev in engine.generate(prompt, params, **kw):
        out += ev.tokens
    return out, ev


def _both_paths(engine: Engine, prompt: list[int], params: GenerationParams, **kw) -> tuple[list[int], list[int]]:
    """The reply with backend greedy sampling, then with the argmax in C, on the same context."""
    engine.backend_greedy = True
    engine.reset()
    backend, _ = _generate(engine, prompt, params, **kw)
    assert engine.ctx.backend_greedy  # the reply ran on the backend path ...
    with pytest.raises(GenerationError):
        engine.ctx.logits_row(0)  # ... and its last verify copied no logits out
    engine.backend_greedy = False
    engine.reset()
    in_c, _ = _generate(engine, prompt, params, **kw)
    assert not engine.ctx.backend_greedy
    engine.backend_greedy = True
    return backend, in_c


@pytest.mark.slow  # ~60 s on 2 cores: seven replies of 32 tokens and a teacher-forced check
def test_the_loop_gives_the_same_tokens_on_both_paths(backend_engine: Engine) -> None:
    e = backend_engine
    prompt = e.tokenize(PROMPT)
    plain_b, plain_c = _both_paths(e, prompt, GenerationParams(max_tokens=32, speculative=False))
    assert plain_b == plain_c

    def oracle(hist: list[int], choice: Choice) -> list[int]:  # plain's own tokens: long accepted blocks
        i = len(hist) - len(prompt)
        return plain_c[i:i + choice.k]

    e.backend_greedy = True
    e.reset()
    forced_b, ev = _generate(e, prompt, GenerationParams(max_tokens=32, draft_max=7), draft_override=oracle)
    assert ev.stats.accepted >= 8 and max(ev.stats.accepted_history) >= 3  # verify batches of many rows
    forced_b2, forced_c = _both_paths(e, prompt, GenerationParams(max_tokens=32, draft_max=7), draft_override=oracle)
    assert forced_b == forced_b2 == forced_c
    spec_b, spec_c = _both_paths(e, prompt, GenerationParams(max_tokens=32, draft_max=4))
    assert spec_b == spec_c
    # and what plain decoding would emit (the near-tie bar of the loop's own tests)
    rep = check_lossless(e, prompt, forced_b)
    assert rep.lossless, rep.hard_mismatches


def test_replies_that_read_logits_turn_it_off(backend_engine: Engine) -> None:
    e = backend_engine
    prompt = e.tokenize(PROMPT)
    e.backend_greedy = True
    out, ev = _generate(e, prompt, GenerationParams(max_tokens=6, logprobs=2))
    assert not e.ctx.backend_greedy and len(ev.logprobs) >= 1
    out, _ = _generate(e, prompt, GenerationParams(max_tokens=6, temperature=0.8, seed=1))
    assert not e.ctx.backend_greedy
    _generate(e, prompt, GenerationParams(max_tokens=6))
    assert e.ctx.backend_greedy
    argmax, _ = e.reference_scores(prompt, out)  # reads the logits: turns it off itself
    assert not e.ctx.backend_greedy and len(argmax) == len(out)
