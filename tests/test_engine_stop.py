"""A stop string inside an accepted block ends the reply where plain decoding ends it."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine.dflash import Engine, EngineConfig
from app.engine.draft_policy import LOOKUP, Choice, FixedDraftLength
from app.engine.params import GenerationParams

PROMPT = "Monday, Tuesday, Wednesday,"


@pytest.mark.gemma
def test_a_stop_string_mid_block_ends_the_reply_at_the_same_token_as_plain(gemma_target: Path) -> None:
    e = Engine(gemma_target, None, EngineConfig(n_ctx=512))
    try:
        prompt = e.tokenize(PROMPT)
        free = e.complete(prompt, GenerationParams(max_tokens=24, speculative=False))
        # a stop string a few tokens in, made of whole tokens and of part of one
        head = e.detokenize(free.tokens[:6])
        stop = e.detokenize(free.tokens[6:9])[:-1]
        assert stop.strip() and stop not in head
        params = GenerationParams(max_tokens=24, stop=[stop], speculative=False)
        plain = e.complete(prompt, params)

        def oracle(history: list[int], choice: Choice) -> list[int]:
            """The plain continuation as the draft: every draft passes, the stop falls inside a block."""
            done = len(history) - len(prompt)
            return free.tokens[done:done + choice.k]

        params = GenerationParams(max_tokens=24, stop=[stop], draft_max=7)
        spec = e.complete(prompt, params, policy=FixedDraftLength(7, LOOKUP), draft_override=oracle)
    finally:
        e.close()
    assert plain.text == head and spec.text == plain.text
    assert spec.tokens == plain.tokens and spec.stats.n_generated == len(plain.tokens) == 9
    assert spec.stats.steps < len(plain.tokens)  # it did verify blocks
    assert spec.stats.n_generated - spec.stats.accepted == spec.stats.steps  # one target token per step
