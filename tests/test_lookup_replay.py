"""scripts/lookup_replay.py's counting, on hand-made token lists: where each lookup query is counted
(as the controller learns it) and whether its first token and its whole draft passed."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "lookup_replay.py"
spec = importlib.util.spec_from_file_location("lookup_replay", SCRIPT)
lookup_replay = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lookup_replay)


def test_first_step_then_agreement_and_match_length() -> None:
    # the first query is "first" whatever its match; then [5, 1] was followed by 2 both times: agreed, n = 2,
    # its draft (k = room = 2) [2, 9] passes its first token, not whole (the reply ends after 2)
    got = lookup_replay.replay([7, 5, 1, 2, 8, 5, 1, 2, 9, 5], [1, 2], [], max_tokens=4)
    assert got == {"first": [1, 1, 0], "agreed": [1, 1, 0], "agreed:2": [1, 1, 0]}


def test_mixed_match_fails() -> None:
    # [5, 1] was followed by 2, then by 3: mixed, the last occurrence's continuation (3) is drafted
    got = lookup_replay.replay([5, 1, 2, 5, 1, 3, 5], [1, 4], [], max_tokens=16)
    assert got == {"first": [1, 1, 0], "mixed": [1, 0, 0], "mixed:2": [1, 0, 0]}


def test_reply_end_drafts_and_the_whole_marker() -> None:
    # stops [7, 8] (how a reply ends) and [5, 6] (the user's turn's end, in the prompt): after 10 the
    # copy 11, 5, 6 becomes 11, 7, 8, and after 10, 11 it becomes 7, 8; both pass whole
    got = lookup_replay.replay([10, 11, 5, 6, 20, 21], [10, 11, 7, 8], [[7, 8], [5, 6]], max_tokens=16)
    assert got == {"none": [2, 0, 0], "reply_end": [2, 2, 2]}
