"""The context lookup's bulk indexing (issue 29, item 2): a prompt (or a turn's new message) indexed at
once with numpy gives the index, and so the proposals, of indexing it one token at a time, on real
text (the bundled tokenizer over the docqa-long documents: licences, Python's reference) and on random
histories with steps, turns and edits; a speculative reply's prompt is indexed at prefill."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from app.bench.lookup_index import ONE_BY_ONE, document_tokens
from app.engine.llama_objects import LlamaModel
from app.engine.lookup import ContextLookup
from app.engine.sources import LookupSource
from app.engine.stats import GenerationStats

N_DOC = 20000


@pytest.fixture(scope="module")
def doc(gemma_target: Path) -> list[int]:
    m = LlamaModel(gemma_target)
    try:
        return document_tokens(m, N_DOC)
    finally:
        m.close()


def same_index(a: ContextLookup, b: ContextLookup) -> bool:
    """Every n-gram's last position and agreement, and how far each has indexed."""
    return a._last == b._last and a._indexed == b._indexed


@pytest.mark.gemma
def test_bulk_equals_one_by_one_on_real_text(doc: list[int]) -> None:
    """A 12k-token prompt indexed in bulk at prefill, then 200 steps of 1-4 tokens (the text read on as
    the reply), then the next turn's 4k new tokens merged in bulk: the index is the one built a token
    at a time, and the proposal at every step is the same."""
    bulk, ref = ContextLookup(), ContextLookup(bulk_min=ONE_BY_ONE)
    pos = 12000
    st = GenerationStats()
    LookupSource(bulk).begin(doc[:pos], st, prefill=True)
    assert bulk._indexed == pos - 1 and st.t_lookup_s > 0  # the first step has nothing left to index
    ref.set_history(doc[:pos])
    ref.index_history()
    assert same_index(bulk, ref)
    matched = 0
    for step in range(200):
        emitted = doc[pos:pos + step % 4 + 1]
        pos += len(emitted)
        for lk in (bulk, ref):
            lk.append(emitted)
        m = bulk.find(8)
        assert m == ref.find(8), step
        matched += m is not None
    assert matched > 100  # licence text repeats itself: most steps have a proposal to compare
    for lk in (bulk, ref):
        lk.set_history(doc[:pos + 4000])
    assert bulk.find(8) == ref.find(8)
    assert same_index(bulk, ref)


@pytest.mark.gemma
def test_bulk_proposals_at_many_cuts_of_real_text(doc: list[int]) -> None:
    """Fresh bulk indexes of prompts cut at 20 lengths up to 20k tokens propose what the index built a
    token at a time proposes there."""
    ref = ContextLookup(bulk_min=ONE_BY_ONE)
    for cut in range(700, N_DOC + 1, 1000):
        ref.set_history(doc[:cut])  # the history only grew: ref indexes on, a token at a time
        lk = ContextLookup()
        lk.set_history(doc[:cut])
        for k in (1, 8, 15):
            assert lk.find(k) == ref.find(k), (cut, k)
    assert same_index(lk, ref)


@pytest.mark.parametrize("max_n", [4, 6])
def test_bulk_equals_one_by_one_under_appends_turns_and_edits(max_n: int) -> None:
    """Random histories over small vocabularies (many repeats, mixed successors), every indexing in
    bulk (bulk_min 1: a step's tokens too, merged into what was indexed) against one token at a time."""
    rng = random.Random(1)
    for trial in range(40):
        vocab = rng.choice([2, 3, 5, 20])
        bulk, ref = ContextLookup(max_n, bulk_min=1), ContextLookup(max_n, bulk_min=ONE_BY_ONE)
        hist = [rng.randrange(vocab) for _ in range(rng.randrange(2, 120))]
        for lk in (bulk, ref):
            lk.set_history(hist)
        for _ in range(40):
            k = rng.randrange(1, 8)
            assert bulk.find(k) == ref.find(k), (trial, bulk.tokens)
            assert same_index(bulk, ref), (trial, bulk.tokens)
            r = rng.random()
            if r < 0.6:
                new = bulk.tokens + [rng.randrange(vocab) for _ in range(rng.randrange(1, 5))]
            elif r < 0.85:  # the next turn: tens of tokens
                new = bulk.tokens + [rng.randrange(vocab) for _ in range(rng.randrange(1, 80))]
            else:  # an edit: cut and continue differently (rebuilt from empty)
                new = bulk.tokens[:rng.randrange(1, len(bulk.tokens))] + [rng.randrange(vocab)]
            for lk in (bulk, ref):
                lk.set_history(list(new))
