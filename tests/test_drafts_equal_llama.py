"""Our draft sources propose, at every step of a greedy generation, the drafts llama.cpp's own
`common_speculative` proposes for the same pair and context: the harness
native/harness/spec_drafts.cpp, built from the pinned tree by native.harness (this module's setup
builds it; minutes from a bare cache, hence slow).

- The draft-model source (app.engine.sources.DraftModelSource) against draft-simple. The two are
  compared where both are defined: p_min = 0 and n_min = 0. llama.cpp's draft-simple stops a draft
  at the first token whose probability (softmax over the drafter's top 10) is below p_min; our
  source has no cutoff and always drafts the k the policy chose (the controller picks k from the
  learned acceptance instead). test_p_min_is_a_real_difference shows the comparison sees it; the draft
  model one token behind (drafting after the token before the anchor) fails it.
- The DFlash source with DFlash v1 and DFlash2 drafters against draft-dflash, with a DSpark drafter
  against draft-dspark (fed the target's layer inputs after every target decode, as llama-server
  does). llama.cpp always decodes a whole block and cuts the draft to the room left; ours decodes
  the k it drafts, so the two are compared on the steps with room for a whole block. A DFlash2
  drafter read as v1 (its logits' argmax instead of the selector's walk), a DSpark drafter read
  as v1 (v1's block layout) and a v1 drafter fed the target's features one position late fail the
  comparison.
- The MTP source (the target's own head) against draft-mtp, on the tiny Qwen3.5 target with one
  head. llama.cpp's draft-mtp drafts its n_max whatever the room left, ours the k the room allows,
  so the two are compared on the steps that drafted a whole k. The head fed zeros instead of the
  target's states (the pairing llama.cpp does, left out) fails the comparison.
- The EAGLE-3 source against draft-eagle3, on the tiny qwen3 target with a random EAGLE-3 drafter
  (gguf_tools.synth.write_eagle3), compared on the steps that drafted a whole k as for MTP. Its fc
  fed the three layers' features in the wrong order fails the comparison.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from app.engine.dflash import Engine, EngineConfig
from app.engine.draft_policy import DFLASH, DRAFT_MODEL, EAGLE3, MTP, FixedDraftLength
from app.engine.params import GenerationParams
from gguf_tools.formats import DFLASH_V1
from gguf_tools.synth import write_eagle3, write_tiny_target
from native.harness import build_harness

pytestmark = pytest.mark.slow

PROMPT = "the cat sat on the mat and then it ran out"
N_CTX = 512


@pytest.fixture(scope="module")
def harness() -> Path:
    return build_harness()


@pytest.fixture(scope="module")
def other_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another random qwen3 model with the tiny vocabulary (seed 1): a drafter that is often wrong."""
    return write_tiny_target(tmp_path_factory.mktemp("dm-llama") / "tiny-other.gguf", "qwen3", seed=1)


def llama_steps(harness: Path, target: Path, draft: Path | None, prompt: list[int], k: int, n: int,
                p_min: float = 0.0, kind: str = "simple") -> dict:
    """llama.cpp's drafts at each step; `draft` None: the target's own MTP head (kind "mtp")."""
    res = subprocess.run([str(harness), "--target", str(target), *(["--draft", str(draft)] if draft else []),
                          "--type", kind,
                          "--tokens", ",".join(map(str, prompt)), "--n-max", str(k), "--n-min", "0",
                          "--p-min", str(p_min), "--max-tokens", str(n), "--n-ctx", str(N_CTX)],
                         capture_output=True, text=True, errors="replace", timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout)


def our_steps(target: Path, draft: Path | None, k: int, n: int, source: str = DRAFT_MODEL,
              as_v1: bool = False, stateless: bool = False, swapped: bool = False, late: bool = False,
              behind: bool = False) -> tuple[list[int], list[dict], list[int]]:
    """The prompt's tokens, each step's (n_past, anchor, drafts) as our loop proposed them, and the
    output; asserts the output is plain decoding's. `source`: the draft-model source (draft = a
    classic draft model), DFlash (draft = a DFlash v1, DFlash2 or DSpark drafter), MTP (no draft:
    the target's head) or EAGLE-3 (draft = an EAGLE-3 drafter); `as_v1`: a DFlash2 or DSpark drafter
    read as if it were v1, `stateless`: the MTP head fed zeros for the target's states, `swapped`:
    EAGLE-3's fc fed its layers' features in reverse order, `late`: the DFlash drafter fed each of the
    target's feature rows one position late (the row of p - 1 at p), `behind`: the draft model one token
    behind, drafting after the token before the anchor (the broken variants)."""
    if source == DFLASH:
        e = Engine(target, draft, EngineConfig(n_ctx=N_CTX))
        if as_v1:
            e.drafter_format, e._anchor_first = DFLASH_V1, False
        if late:
            queue, last = e._queue, [None]

            def late_rows(feats: np.ndarray, pos0: int) -> None:  # every queued row moves one position on
                prev = last[0] if last[0] is not None else np.zeros_like(feats[:1])
                last[0] = feats[-1:].copy()
                queue(np.concatenate([prev, feats[:-1]]), pos0)

            e._queue = late_rows
    elif source == EAGLE3:
        e = Engine(target, draft, EngineConfig(n_ctx=N_CTX))
        if swapped:
            src = e.sources[EAGLE3]
            src.target.enable_taps(list(reversed(src.target.tap_layers)))
    elif source == MTP:
        e = Engine(target, None, EngineConfig(n_ctx=N_CTX))
        if stateless:
            rows = e.ctx.nextn_rows
            e.ctx.nextn_rows = lambda n_rows: np.zeros_like(rows(n_rows))
    else:
        e = Engine(target, None, EngineConfig(n_ctx=N_CTX), draft_model=draft)
        if behind:
            dm = e.sources[DRAFT_MODEL]
            one_late = dm.propose

            def after_the_token_before(history, n_past, k, st, with_confidence=False):  # noqa: ANN001, ANN202
                dm.trim(n_past - 1)  # its cache up to the token before that one (the prompt's reaches it)
                proposal = one_late(history[:-1], n_past - 1, k, st, with_confidence)
                dm.trim(n_past - 1)  # a prefix of the history again: the next catch-up decodes the rest
                return proposal

            dm.propose = after_the_token_before
    try:
        prompt = e.tokenize(PROMPT)
        plain = [t for ev in e.generate(prompt, GenerationParams(max_tokens=n), policy=FixedDraftLength(0))
                 for t in ev.tokens]
        src = e.sources[source]
        propose = src.propose
        steps: list[dict] = []

        def recorded(history, n_past, k, st, with_confidence=False):  # noqa: ANN001, ANN202 - the source's own call
            drafts, conf = propose(history, n_past, k, st, with_confidence)
            steps.append({"n_past": n_past, "anchor": history[-1], "drafts": list(drafts)})
            return drafts, conf

        src.propose = recorded
        out = [t for ev in e.generate(prompt, GenerationParams(max_tokens=n), policy=FixedDraftLength(k, source))
               for t in ev.tokens]
        assert out == plain
        return prompt, steps, out
    finally:
        e.close()


def drafting(steps: list[dict]) -> list[dict]:
    """The steps that drafted (a step with no room drafts nothing in either loop)."""
    return [{key: s[key] for key in ("n_past", "anchor", "drafts")} for s in steps if s["drafts"]]


@pytest.mark.parametrize("k", [1, 3, 6])
def test_drafts_equal_llama_cpp_tiny(harness: Path, tiny_pair: tuple[Path, Path], other_tiny: Path, k: int) -> None:
    target, _ = tiny_pair
    for draft in (target, other_tiny):  # every draft accepted; most rejected (rollbacks)
        prompt, ours, out = our_steps(target, draft, k, 40)
        ref = llama_steps(harness, target, draft, prompt, k, 40)
        assert ref["output"] == out
        assert drafting(ours) == drafting(ref["steps"])
        assert len(drafting(ours)) >= 40 // (k + 1)


def test_drafts_equal_llama_cpp_gemma(harness: Path, gemma_target: Path) -> None:
    """The bundled 270M target as its own drafter: real vocabulary, real weights."""
    prompt, ours, out = our_steps(gemma_target, gemma_target, 4, 24)
    ref = llama_steps(harness, gemma_target, gemma_target, prompt, 4, 24)
    assert ref["output"] == out
    assert drafting(ours) == drafting(ref["steps"])


def test_p_min_is_a_real_difference(harness: Path, tiny_pair: tuple[Path, Path], other_tiny: Path) -> None:
    """With llama.cpp's confidence cutoff on, its drafts are shorter than ours: the comparison above
    would fail, so it holds only where both are defined (p_min = 0)."""
    target, _ = tiny_pair
    prompt, ours, _ = our_steps(target, other_tiny, 3, 24)
    ref = llama_steps(harness, target, other_tiny, prompt, 3, 24, p_min=0.5)
    assert drafting(ours) != drafting(ref["steps"])
    assert sum(len(s["drafts"]) for s in ref["steps"]) < sum(len(s["drafts"]) for s in ours)


def test_the_draft_model_one_token_behind_differs(harness: Path, tiny_pair: tuple[Path, Path],
                                                  other_tiny: Path) -> None:
    """The draft model drafting after the token before the anchor (its context one token short): the
    comparison above fails, with the target as its own drafter (whose drafts otherwise all pass) and
    with another model."""
    target, _ = tiny_pair
    for draft in (target, other_tiny):
        prompt, ours, out = our_steps(target, draft, 3, 40, behind=True)
        ref = llama_steps(harness, target, draft, prompt, 3, 40)
        assert ref["output"] == out  # lossless either way
        assert len(drafting(ours)) >= 40 // 4 and drafting(ours) != drafting(ref["steps"])


def whole_blocks(steps: list[dict], k: int) -> list[dict]:
    """The steps that drafted a whole block of k (llama.cpp cuts a block of k at the reply's end,
    ours drafts a shorter block there)."""
    return [s for s in drafting(steps) if len(s["drafts"]) == k]


# the pair fixture (conftest: the tiny target with each kind of drafter), llama.cpp's type for its drafter
FORMATS = {"v1": ("tiny_pair", "dflash"), "dflash2": ("tiny_dflash2_pair", "dflash"),
           "dspark": ("tiny_dspark_pair", "dspark")}


def _drafter(fmt: str, request: pytest.FixtureRequest) -> tuple[Path, str]:
    fixture, kind = FORMATS[fmt]
    return request.getfixturevalue(fixture)[1], kind


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("k", [3, 7])
def test_dflash_drafts_equal_llama_cpp(harness: Path, tiny_pair: tuple[Path, Path], fmt: str, k: int,
                                       request: pytest.FixtureRequest) -> None:
    """DFlash v1, DFlash2 and DSpark drafters, each against llama.cpp's own draft type for it."""
    target = tiny_pair[0]
    drafter, kind = _drafter(fmt, request)
    prompt, ours, out = our_steps(target, drafter, k, 40, DFLASH)
    ref = llama_steps(harness, target, drafter, prompt, k, 40, kind=kind)
    assert ref["output"] == out
    assert whole_blocks(ours, k) == whole_blocks(ref["steps"], k)
    assert len(whole_blocks(ours, k)) >= 40 // (k + 1)


@pytest.mark.parametrize("fmt", ["dflash2", "dspark"])
def test_a_drafter_read_as_v1_differs(harness: Path, tiny_pair: tuple[Path, Path], fmt: str,
                                      request: pytest.FixtureRequest) -> None:
    """DFlash2's selector disabled (its logits' argmax), DSpark's anchor-first layout ignored (v1's
    block): the comparison above fails, so it sees what each format does differently."""
    target, k = tiny_pair[0], 7
    drafter, kind = _drafter(fmt, request)
    prompt, ours, out = our_steps(target, drafter, k, 40, DFLASH, as_v1=True)
    ref = llama_steps(harness, target, drafter, prompt, k, 40, kind=kind)
    assert ref["output"] == out  # lossless either way
    assert whole_blocks(ours, k) != whole_blocks(ref["steps"], k)


@pytest.mark.parametrize("k", [3, 7])
def test_a_v1_drafter_fed_its_features_late_differs(harness: Path, tiny_pair: tuple[Path, Path], k: int) -> None:
    """DFlash v1 with every target feature row one position late (what the drafter reads at p is the
    target's state at p - 1): the comparison above fails."""
    target, drafter = tiny_pair
    prompt, ours, out = our_steps(target, drafter, k, 40, DFLASH, late=True)
    ref = llama_steps(harness, target, drafter, prompt, k, 40, kind="dflash")
    assert ref["output"] == out  # lossless either way
    assert len(whole_blocks(ours, k)) >= 40 // (k + 1) and whole_blocks(ours, k) != whole_blocks(ref["steps"], k)


@pytest.fixture(scope="module")
def mtp_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_target(tmp_path_factory.mktemp("mtp-llama") / "tiny-qwen35-mtp.gguf", "qwen35", mtp_layers=1)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_mtp_drafts_equal_llama_cpp(harness: Path, mtp_target: Path, k: int) -> None:
    prompt, ours, out = our_steps(mtp_target, None, k, 40, MTP)
    ref = llama_steps(harness, mtp_target, None, prompt, k, 40, kind="mtp")
    assert ref["output"] == out
    assert whole_blocks(ours, k) == whole_blocks(ref["steps"], k)
    assert len(whole_blocks(ours, k)) >= 40 // (k + 1)


def test_the_head_without_the_targets_states_differs(harness: Path, mtp_target: Path) -> None:
    prompt, ours, out = our_steps(mtp_target, None, 3, 40, MTP, stateless=True)
    ref = llama_steps(harness, mtp_target, None, prompt, 3, 40, kind="mtp")
    assert ref["output"] == out  # lossless either way
    assert whole_blocks(ours, 3) != whole_blocks(ref["steps"], 3)


@pytest.fixture(scope="module")
def eagle3_drafter(tiny_pair: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_eagle3(tmp_path_factory.mktemp("eagle3-llama") / "tiny-eagle3.gguf", tiny_pair[0])


@pytest.mark.parametrize("k", [1, 3, 6])
def test_eagle3_drafts_equal_llama_cpp(harness: Path, tiny_pair: tuple[Path, Path], eagle3_drafter: Path,
                                       k: int) -> None:
    target = tiny_pair[0]
    prompt, ours, out = our_steps(target, eagle3_drafter, k, 40, EAGLE3)
    ref = llama_steps(harness, target, eagle3_drafter, prompt, k, 40, kind="eagle3")
    assert ref["output"] == out
    assert whole_blocks(ours, k) == whole_blocks(ref["steps"], k)
    assert len(whole_blocks(ours, k)) >= 40 // (k + 1)


def test_eagle3_with_its_layers_swapped_differs(harness: Path, tiny_pair: tuple[Path, Path],
                                               eagle3_drafter: Path) -> None:
    target = tiny_pair[0]
    prompt, ours, out = our_steps(target, eagle3_drafter, 3, 40, EAGLE3, swapped=True)
    ref = llama_steps(harness, target, eagle3_drafter, prompt, 3, 40, kind="eagle3")
    assert ref["output"] == out
    assert whole_blocks(ours, 3) != whole_blocks(ref["steps"], 3)
