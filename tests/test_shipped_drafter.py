"""The drafter FlashDesk ships, in the default test run: on the bundled target it drafts
tokens the target accepts (natural acceptance, no forced drafts) at the shipped
quantization, and the speculative output passes the teacher-forced lossless check.
An export or quantization bug that left the drafter guessing (tau 1.0, e.g. an `fc`
overflowing in F16) fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine.dflash import Engine
from app.engine.draft_policy import DFLASH, FixedDraftLength
from app.engine.lossless import check_lossless
from app.engine.params import GenerationParams
from gguf_tools.reader import read_gguf

pytestmark = pytest.mark.gemma

# Four HumanEval prompts, as raw code (HumanEval is held out of the drafter's training data)
PROMPTS = [
    '\n\ndef truncate_number(number: float) -> float:\n    """ Given a positive floating point number, it can be '
    'decomposed into\n    and integer part (largest integer smaller than given number) and decimals\n    (leftover '
    'part always smaller than 1).\n\n    Return the decimal part of the number.\n    >>> truncate_number(3.5)\n'
    '    0.5\n    """\n',
    "from typing import List, Optional\n\n\ndef longest(strings: List[str]) -> Optional[str]:\n    \"\"\" Out of "
    "list of strings, return the longest one. Return the first one in case of multiple\n    strings of the same "
    "length. Return None in case the input list is empty.\n    >>> longest([])\n\n    >>> longest(['a', 'b', "
    "'c'])\n    'a'\n    >>> longest(['a', 'bb', 'ccc'])\n    'ccc'\n    \"\"\"\n",
    "from typing import List\n\n\ndef filter_by_prefix(strings: List[str], prefix: str) -> List[str]:\n    \"\"\" "
    "Filter an input list of strings only for ones that start with a given prefix.\n    >>> filter_by_prefix([], "
    "'a')\n    []\n    >>> filter_by_prefix(['abc', 'bcd', 'cde', 'array'], 'a')\n    ['abc', 'array']\n    "
    "\"\"\"\n",
    '\n\ndef max_element(l: list):\n    """Return maximum element in the list.\n    >>> max_element([1, 2, 3])\n'
    '    3\n    >>> max_element([5, 3, -5, 2, -3, 3, 9, 0, 123, 1, -10])\n    123\n    """\n',
]
K = 7  # drafts per step (a verify of 8 tokens; acceptance past position 7 is near zero, see the model card)
MAX_TOKENS = 64
# Measured on these prompts (2026-12-01, the icelake CPU variant): tau 1.631 (per prompt 1.52,
# 1.73, 1.42, 1.94). The bar leaves a margin for another CPU variant breaking near-ties
# differently (other text, other acceptance), yet sits far above 1.0, a drafter that never hits.
MIN_TAU = 1.4
MIN_FIRST_POSITION = 0.35  # acceptance at block position 1: measured 0.474


def test_the_shipped_file_is_the_q8_0_drafter_for_the_bundled_target(shipped_drafter: Path,
                                                                       gemma_target: Path) -> None:
    info = read_gguf(shipped_drafter)
    types = {t.name: t.type_name for t in info.tensors}
    assert info.arch == "dflash" and types["fc.weight"] == "Q8_0" and types["blk.0.ffn_up.weight"] == "Q8_0"
    assert info.get("tokenizer.ggml.mask_token_id") == 4 and "d2t" in types
    assert int(info.get("dflash.block_size")) == 16
    assert read_gguf(gemma_target).get("general.architecture") == "gemma3"


def test_the_shipped_drafter_is_accepted_and_lossless(gemma_shipped_engine: Engine) -> None:
    e = gemma_shipped_engine
    drafted = accepted = steps = 0
    pos1 = [0, 0]  # (drafted, accepted) at block position 1
    per_prompt = []
    for text in PROMPTS:
        prompt = e.tokenize(text)
        done = e.complete(prompt, GenerationParams(max_tokens=MAX_TOKENS), policy=FixedDraftLength(K, DFLASH))
        st = done.stats
        assert st.steps_by_source[DFLASH] >= st.steps - 1  # every step with room drafted from the drafter
        drafted, accepted, steps = drafted + st.drafted, accepted + st.accepted, steps + st.steps
        pos1 = [pos1[0] + st.draft_by_pos[0], pos1[1] + st.accept_by_pos[0]]
        per_prompt.append(round(st.tau, 2))
        rep = check_lossless(e, prompt, done.tokens)
        assert rep.n_checked == len(done.tokens) and rep.lossless, rep.hard_mismatches
    tau = (accepted + steps) / steps
    print({"tau": round(tau, 3), "per_prompt": per_prompt, "acceptance_pos1": round(pos1[1] / pos1[0], 3)})
    assert tau >= MIN_TAU, (tau, per_prompt)
    assert pos1[1] / pos1[0] >= MIN_FIRST_POSITION, pos1
    assert min(per_prompt) > 1.15, per_prompt  # every prompt, not one lucky one (measured min 1.42)
