"""The context lookup: the continuation of the longest earlier match of the context's suffix,
kept right as tokens are appended, as a step's rejected drafts are dropped, and as a history
is edited (a regenerated reply); a draft that runs into a stop string ends the reply there."""

from __future__ import annotations

import random
from pathlib import Path

from app.chat.format import PLAIN_STOP, with_format_stops
from app.engine.dflash import Engine, EngineConfig
from app.engine.draft_policy import LOOKUP, FixedDraftLength
from app.engine.lookup import AGREED, MIXED, ONCE, ContextLookup, LookupMatch
from app.engine.params import GenerationParams


def end_reply(tokens: list[int], draft: list[int], k: int, stops: list[list[int]]) -> tuple[list[int], str]:
    """The definition of the reply-end rewrite, by scanning the emitted tokens and the draft: the
    stop string that starts earliest (the first listed at a tie) and is not wholly emitted, found
    whole or as 2+ tokens running off the draft's end, ends the draft: the draft's tokens before it,
    then the rest of the reply's end marker (stops[0]) when the tokens of the stop already emitted
    begin that marker too ("end"), else the rest of that stop ("stop"). "" when nothing changes."""
    seq, a = tokens + draft, len(tokens)
    for p in range(len(seq)):
        for stop in stops:
            whole = seq[p:p + len(stop)] == stop
            runs_off = p + len(stop) > len(seq) and len(seq) - p >= 2 and seq[p:] == stop[:len(seq) - p]
            if (whole or runs_off) and p + min(len(stop), len(seq) - p) > a:
                h = max(0, a - p)  # its tokens already emitted
                if stops[0][:h] == stop[:h]:
                    return (draft[:max(0, p - a)] + stops[0][h:])[:k], "end"
                return (draft[:max(0, p - a)] + stop[h:])[:k], "stop"
    return draft, ""


def brute_force(tokens: list[int], k: int, max_n: int, stops: list[list[int]] | None = None,
                seen: set[str] | None = None) -> LookupMatch | None:
    """The definition, by rescanning: the longest n <= max_n whose n tokens ending at the anchor
    occurred ending earlier (the latest such occurrence), up to k tokens after it, and whether
    that n-gram occurred once, always with the same successor, or with different ones; with stop
    strings, the draft rewritten by end_reply, and a draft it leaves empty is no match (a shorter n
    is tried). `seen` collects which rewrites ran ("empty" for an emptied draft)."""
    a = len(tokens) - 1
    for n in range(min(max_n, a), 0, -1):
        suffix = tokens[a - n + 1:a + 1]
        ends = [e for e in range(n - 1, a) if tokens[e - n + 1:e + 1] == suffix]
        if ends:
            e = ends[-1]
            successors = {tokens[x + 1] for x in ends}
            agreement = ONCE if len(ends) == 1 else AGREED if len(successors) == 1 else MIXED
            draft, how = end_reply(tokens, tokens[e + 1:min(e + 1 + k, a + 1)], k, stops or [])
            if seen is not None and how:
                seen.add(how if draft else "empty")
            if draft:
                return LookupMatch(n, tuple(draft), agreement, ends_reply=bool(how))
    return None


def test_matches_the_definition_under_appends_and_edits() -> None:
    """Random histories, steps, turns and edits, with and without stop strings (1-3 tokens, from
    the same small vocabulary, so that drafts run into them often): every rewrite happens, a draft
    left empty among them."""
    rng = random.Random(0)
    seen: set[str] = set()
    for trial in range(60):
        vocab = rng.choice([3, 5, 20])
        lk = ContextLookup(max_n=4)
        if trial % 2:
            lk.reply_ends = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 4))]
                             for _ in range(rng.randrange(1, 4))]
        hist = [rng.randrange(vocab) for _ in range(rng.randrange(2, 30))]
        lk.set_history(hist)
        for _ in range(60):
            k = rng.randrange(1, 8)
            assert lk.find(k) == brute_force(lk.tokens, k, 4, lk.reply_ends, seen), (trial, lk.tokens, lk.reply_ends)
            r = rng.random()
            if r < 0.7:  # a step: 1..4 emitted tokens (the accepted drafts and the target's own)
                lk.append([rng.randrange(vocab) for _ in range(rng.randrange(1, 5))])
            elif r < 0.85:  # the next turn: the history grew by a user message
                lk.set_history(lk.tokens + [rng.randrange(vocab) for _ in range(rng.randrange(1, 6))])
            else:  # an edit or a regenerate: the history is cut and continues differently
                cut = rng.randrange(1, len(lk.tokens))
                lk.set_history(lk.tokens[:cut] + [rng.randrange(vocab)])
    assert seen == {"end", "stop", "empty"}  # the marker's rest, a stop's rest, an emptied draft


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


def test_a_draft_into_a_stop_already_begun_finishes_that_stop() -> None:
    """The reply has emitted "8 10" (the start of the stop "8 10 12", not of its own marker "8 9 11"):
    the draft finishes the stop begun, "12", not the marker's rest "11", which would not follow it."""
    user, other = [8, 9, 11], [8, 10, 12]
    lk = ContextLookup()
    lk.set_history([8, 9, 11, 3, 4] + other + [5, 4, 8, 10])
    lk.reply_ends = [user, other]
    assert lk.find(5) == LookupMatch(3, (12,), ONCE, ends_reply=True)  # "4 8 10" -> "12", cut there


def test_a_draft_the_rewrite_leaves_empty_is_no_match() -> None:
    """The reply's marker "8 9" is emitted whole and the draft would finish a longer stop that
    begins with it: nothing is left to draft at n = 2, so the next shorter match drafts."""
    lk = ContextLookup()
    lk.set_history([8, 9, 11, 3, 9, 5, 4, 8, 9])
    lk.reply_ends = [[8, 9], [8, 9, 11]]
    # "8 9" -> "11 ..." is emptied; "9" last ended at 4 -> "5 4", then the marker in place of its copy
    assert lk.find(4) == LookupMatch(1, (5, 4, 8, 9), MIXED, ends_reply=True)
    lk.set_history([8, 9, 11, 3, 8, 9])  # every match emptied: none
    assert lk.find(4) is None


def test_the_formats_stops_come_first(gemma_target: Path) -> None:
    """The lookup drafts the first stop string as the reply's end: the format's own marker, whatever
    order the caller's stops come in (a request, a CLI option)."""
    stops = with_format_stops(PLAIN_STOP, ["\nAssistant:", "###", "\nUser:"])
    assert stops == ["\nUser:", "\nAssistant:", "###"]
    e = Engine(gemma_target, None, EngineConfig(n_ctx=512, n_threads=2))
    try:
        e.complete(e.tokenize("User: hi\nAssistant:"), GenerationParams(max_tokens=2, stop=stops))
        marker = e.target.tokenize("\nUser:", add_special=False, parse_special=False)
        assert e.lookup.reply_ends[0] == marker and len(e.lookup.reply_ends) == 3
    finally:
        e.close()


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
