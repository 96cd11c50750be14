"""A classic draft model (app.engine.sources.DraftModelSource) through the one decode loop:
the target as its own drafter must have every draft accepted (forced acceptance), a different
model sharing the vocabulary must be rejected now and then, and the output is plain decoding's."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine.controller import DraftController, policy_for_mode
from app.engine.dflash import Engine, EngineConfig
from app.engine.draft_policy import DRAFT_MODEL, FixedDraftLength
from app.engine.params import GenerationParams
from gguf_tools.pair import check_draft_model

PROMPT = "the cat sat on the mat and then it ran out"


def run(e: Engine, prompt: list[int], policy, n: int) -> tuple[list[int], object]:  # noqa: ANN001
    out: list[int] = []
    ev = None
    for ev in e.generate(prompt, GenerationParams(max_tokens=n), policy=policy):
        out += ev.tokens
        dm = e.draft_model
        # its cache is a prefix of the verified history, never a rejected draft
        hist = prompt + out
        assert dm._cached == hist[:len(dm._cached)] and len(dm._cached) <= len(hist) - 1
        assert dm.ctx.pos_max() == len(dm._cached) - 1
    return out, ev.stats


def test_target_as_its_own_draft_model(tiny_pair: tuple[Path, Path]) -> None:
    target, _ = tiny_pair
    e = Engine(target, None, EngineConfig(n_ctx=512), draft_model=target)
    prompt = e.tokenize(PROMPT)
    plain, _ = run(e, prompt, FixedDraftLength(0), 64)
    spec, st = run(e, prompt, FixedDraftLength(4, DRAFT_MODEL), 64)
    assert spec == plain
    assert st.steps_by_source[DRAFT_MODEL] >= 10
    # greedy drafts of the same model on the same kernels: every one passes
    assert st.accepted_by_source[DRAFT_MODEL] == st.drafted_by_source[DRAFT_MODEL]
    e.close()


def test_other_model_sharing_the_vocabulary(tiny_pair: tuple[Path, Path], tiny_draft_model: Path) -> None:
    target, _ = tiny_pair
    e = Engine(target, None, EngineConfig(n_ctx=512), draft_model=tiny_draft_model)
    prompt = e.tokenize(PROMPT)
    plain, _ = run(e, prompt, FixedDraftLength(0), 64)
    spec, st = run(e, prompt, FixedDraftLength(3, DRAFT_MODEL), 64)
    assert spec == plain
    assert st.drafted_by_source[DRAFT_MODEL] > st.accepted_by_source[DRAFT_MODEL]  # rejections rolled back
    # a second turn reusing the prefix: the draft model's cache is cut where the prompt differs
    again, _ = run(e, prompt + spec[:5], FixedDraftLength(3, DRAFT_MODEL), 16)
    assert again == plain[5:21]
    e.close()


@pytest.mark.slow  # a calibration of the tiny pair (~25 s on 2 busy cores)
def test_controller_learns_the_draft_model(tiny_pair: tuple[Path, Path]) -> None:
    target, drafter = tiny_pair
    e = Engine(target, drafter, EngineConfig(n_ctx=512), draft_model=target)
    prompt = e.tokenize(PROMPT)
    plain, _ = run(e, prompt, FixedDraftLength(0), 48)
    pol = policy_for_mode(e, "hybrid")
    assert isinstance(pol, DraftController) and DRAFT_MODEL in pol.sources
    assert pol.pass_s[DRAFT_MODEL] > 0  # measured at load
    out, st = run(e, prompt, pol, 48)
    assert out == plain
    assert pol.sequential[DRAFT_MODEL].tried.sum() > 0 or st.steps_by_source.get(DRAFT_MODEL, 0) == 0
    alone = policy_for_mode(e, "draft-model")
    assert alone.sources == (DRAFT_MODEL,)
    out, st = run(e, prompt, alone, 48)
    assert out == plain
    assert st.steps_by_source.get(DRAFT_MODEL, 0) > 0
    # every draft passes: the learned acceptance rises above the prior
    assert alone.sequential[DRAFT_MODEL].p[0] > 0.8  # the prior is 0.6
    e.close()


def test_pair_check_of_a_draft_model(tiny_pair: tuple[Path, Path], tiny_draft_model: Path,
                                     tiny_gemma_pair: tuple[Path, Path], gemma_target: Path) -> None:
    target, drafter = tiny_pair
    assert check_draft_model(target, tiny_draft_model).ok
    bad = check_draft_model(target, drafter)  # a DFlash drafter is not a draft model
    assert not bad.ok and "drafter" in " ".join(bad.problems)
    other_vocab = check_draft_model(gemma_target, target)
    assert not other_vocab.ok and "vocabulary" in " ".join(other_vocab.problems)


@pytest.mark.slow  # two copies of the 270M target (~20 s)
def test_gemma_as_its_own_draft_model(gemma_target: Path) -> None:
    """The bundled target drafting for itself: every draft accepted, plain decoding's output."""
    e = Engine(gemma_target, None, EngineConfig(n_ctx=512), draft_model=gemma_target)
    prompt = e.tokenize("The three primary colours are")
    plain, _ = run(e, prompt, FixedDraftLength(0), 24)
    spec, st = run(e, prompt, FixedDraftLength(4, DRAFT_MODEL), 24)
    assert spec == plain
    assert st.drafted_by_source[DRAFT_MODEL] > 0
    assert st.accepted_by_source[DRAFT_MODEL] == st.drafted_by_source[DRAFT_MODEL]
    e.close()
