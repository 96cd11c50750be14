"""The context lookup: the continuation of the longest earlier match of the context's suffix,
kept right as tokens are appended, as a step's rejected drafts are dropped, and as a history
is edited (a regenerated reply)."""

from __future__ import annotations

import random
from pathlib import Path

from app.engine.dflash import Engine, EngineConfig
from app.engine.draft_policy import LOOKUP, FixedDraftLength
from app.engine.lookup import AGREED, MIXED, ONCE, ContextLookup, LookupMatch
from app.engine.params import GenerationParams


def brute_force(tokens: list[int], k: int, max_n: int) -> LookupMatch | None:
    """The definition, by rescanning: the longest n <= max_n whose n tokens ending at the anchor
    occurred ending earlier (the latest such occurrence), up to k tokens after it, and whether
    that n-gram occurred once, always with the same successor, or with different ones."""
    a = len(tokens) - 1
    for n in range(min(max_n, a), 0, -1):
        suffix = tokens[a - n + 1:a + 1]
        ends = [e for e in range(n - 1, a) if tokens[e - n + 1:e + 1] == suffix]
        if ends:
            e = ends[-1]
            successors = {tokens[x + 1] for x in ends}
            agreement = ONCE if len(ends) == 1 else AGREED if len(successors) == 1 else MIXED
            return LookupMatch(n, tuple(tokens[e + 1:min(e + 1 + k, a + 1)]), agreement)
    return None


def test_matches_the_definition_under_appends_and_edits() -> None:
    rng = random.Random(0)
    for trial in range(40):
        vocab = rng.choice([3, 5, 20])
        lk = ContextLookup(max_n=4)
        hist = [rng.randrange(vocab) for _ in range(rng.randrange(2, 30))]
        lk.set_history(hist)
        for _ in range(60):
            k = rng.randrange(1, 8)
            assert lk.find(k) == brute_force(lk.tokens, k, 4), (trial, lk.tokens)
            r = rng.random()
            if r < 0.7:  # a step: 1..4 emitted tokens (the accepted drafts and the target's own)
                lk.append([rng.randrange(vocab) for _ in range(rng.randrange(1, 5))])
            elif r < 0.85:  # the next turn: the history grew by a user message
                lk.set_history(lk.tokens + [rng.randrange(vocab) for _ in range(rng.randrange(1, 6))])
            else:  # an edit or a regenerate: the history is cut and continues differently
                cut = rng.randrange(1, len(lk.tokens))
                lk.set_history(lk.tokens[:cut] + [rng.randrange(vocab)])


def test_proposes_what_followed_the_last_occurrence() -> None:
    lk = ContextLookup()
    lk.set_history([1, 2, 3, 4, 5, 9, 2, 3])
    assert lk.find(3) == LookupMatch(2, (4, 5, 9), ONCE)  # "2 3" was followed by "4 5 9"
    lk.append([7])  # the target said 7, not 4: the draft was rejected, the index has only what was emitted
    assert lk.find(3) is None  # 7 never occurred before
    lk.append([1, 2])
    assert lk.find(2) == LookupMatch(2, (3, 4), ONCE)  # "1 2" ... -> "3 4"


def test_says_whether_the_earlier_occurrences_agree() -> None:
    """The draft's confidence besides n: "1" was followed by 6 both times (agreed), or by 6 and
    then 7 (mixed: the draft is what followed the last one)."""
    lk = ContextLookup()
    lk.set_history([5, 1, 6, 1, 6, 2, 1])
    assert lk.find(2) == LookupMatch(1, (6, 2), AGREED)
    lk.set_history([5, 1, 6, 1, 7, 2, 1])
    assert lk.find(2) == LookupMatch(1, (7, 2), MIXED)
    lk.append([7, 2, 1])  # "1 7 2 1" now occurred once before
    assert lk.find(3) == LookupMatch(4, (7, 2, 1), ONCE)


def test_a_draft_into_a_stop_string_ends_the_reply_with_its_own_marker() -> None:
    """Token ids: 8 "\n", 9 "User", 10 "Assistant", 11 ":". The question ended "4 8 10 11" (the next turn
    the assistant's); a reply that reaches "4" again gets "8 9 11" (the user's turn next), and nothing
    after it; without stop strings, the plain copy."""
    user, assistant = [8, 9, 11], [8, 10, 11]
    history = [8, 9, 11, 3, 4] + assistant + [5, 4]  # ...question "3 4", the marker, the reply "5 4"
    lk = ContextLookup()
    lk.set_history(history)
    assert lk.find(5) == LookupMatch(1, (8, 10, 11, 5, 4), ONCE)
    lk.reply_ends = [user, assistant]
    assert lk.find(5) == LookupMatch(1, (8, 9, 11), ONCE, ends_reply=True)
    assert lk.find(2) == LookupMatch(1, (8, 9), ONCE, ends_reply=True)  # at most k
    lk.append([8])  # a stop begun before the anchor: the draft finishes the reply's marker
    assert lk.find(5) == LookupMatch(2, (9, 11), ONCE, ends_reply=True)  # "4 8" -> the marker
    lk.set_history([1, 2, 3, 7, 1, 2])  # no stop string in the draft: unchanged
    assert lk.find(3) == LookupMatch(2, (3, 7, 1), ONCE)


def test_engine_keeps_the_lookup_at_the_emitted_tokens(tiny_pair: tuple[Path, Path]) -> None:
    """Across steps whose lookup drafts were partly rejected, the index holds prompt + output, and a
    second turn after the first carries it over."""
    e = Engine(tiny_pair[0], None, EngineConfig(n_ctx=512))
    prompt = e.tokenize("the cat sat on the mat the cat sat on the mat the cat")
    done = e.complete(prompt, GenerationParams(max_tokens=60), policy=FixedDraftLength(5, LOOKUP))
    st = done.stats
    assert 0 < st.accepted_by_source["lookup"] < st.drafted_by_source["lookup"]  # some drafts were rejected
    assert e.lookup.tokens == prompt + done.tokens
    second = prompt + done.tokens + e.tokenize(" and then", add_special=False)
    e.complete(second, GenerationParams(max_tokens=5, speculative=False))
    assert e.lookup.tokens[:len(second)] == second
    e.close()
