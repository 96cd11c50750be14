"""The drafter's window over the injected target features (issue 29, item 3): on the bundled pair, with
a window of 64 positions and a prompt of ~500 tokens, the drafter's cache holds only the last 64
positions, at their true positions, the prompt's head is never fed to it, and the output is still
plain decoding's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.engine.dflash import DRAFTER_SLACK, Engine, EngineConfig
from app.engine.lossless import check_lossless
from app.engine.params import GenerationParams
from app.engine.stats import GenerationStats

pytestmark = pytest.mark.gemma

W = 64
DOC = "".join(f"Record {i}: the shelf code of box {i} is {i * 7 % 97}.\n" for i in range(40))
PROMPT = DOC + "Question: what is the shelf code of box 12?\nAnswer:"


@pytest.fixture(scope="module")
def engine(gemma_target: Path, shipped_drafter: Path):
    e = Engine(gemma_target, shipped_drafter, EngineConfig(n_ctx=2048, drafter_window=W))
    yield e
    e.close()


def run(e: Engine, prompt: list[int], params: GenerationParams) -> tuple[list[int], GenerationStats]:
    """The output and its stats; after every step, the drafter's cache (fed what waits) holds exactly the last W
    positions before the anchor, at their true positions (pos_min/pos_max read from llama.cpp)."""
    out: list[int] = []
    ev = None
    for ev in e.generate(prompt, params):
        out += ev.tokens
        n_past = len(prompt) - 1 + len(out)
        assert e.cache_positions() == (n_past - 1, n_past - 1)
        if params.speculative:
            assert e.dctx.pos_min() == max(0, n_past - W), "cells older than the window stay, or were renumbered"
    assert ev is not None
    return out, ev.stats


def test_window_bounds_the_drafter_cache_and_keeps_the_output(engine: Engine) -> None:
    e = engine
    prompt = e.tokenize(PROMPT)
    assert len(prompt) > 4 * W
    # the drafter's cache is sized to the window (and a slack), fewer cells than the positions it is given:
    # llama.cpp keeps each cell's position, so positions past its n_ctx are fine
    assert W + DRAFTER_SLACK <= e.dctx.n_ctx == 512 < len(prompt) < e.n_ctx  # padded to 256 by llama.cpp
    plain, _ = run(e, prompt, GenerationParams(max_tokens=24, speculative=False))
    e.reset()
    fed0 = e.injected_rows
    spec, st = run(e, prompt, GenerationParams(max_tokens=24, draft_max=7))
    assert st.drafted > 0 and st.accepted > 0
    assert spec == plain
    # the prompt's head was never fed: at most the window at the end of the prompt, then the replies'
    assert e.injected_rows - fed0 <= W + len(spec)


def test_window_zero_feeds_and_keeps_everything(engine: Engine) -> None:
    e = engine
    prompt = e.tokenize(PROMPT)
    e.set_drafter_window(0)
    try:
        assert e.dctx.n_ctx == e.n_ctx  # unbounded: the whole context
        fed0 = e.injected_rows
        e.complete(prompt, GenerationParams(max_tokens=8, draft_max=7))
        e.cache_positions()
        assert e.dctx.pos_min() == 0
        assert e.injected_rows - fed0 >= len(prompt) - 1
    finally:
        e.set_drafter_window(W)
    assert e.dctx.n_ctx == 512  # sized to the window again


@pytest.mark.slow
def test_turns_that_reuse_the_cache_across_the_window(engine: Engine) -> None:
    """Turns that extend the cached conversation: a speculative turn, then a plain one adding more
    than W tokens (its prompt's head skipped, its rows left waiting), then a speculative one. The
    drafter's cache follows (llama.cpp refuses a gap between its last position and an injection)
    and the last reply is still lossless; a negative window is refused."""
    e = engine
    e.reset()
    first = e.tokenize(PROMPT)
    out1, _ = run(e, first, GenerationParams(max_tokens=8, draft_max=7))
    more = e.tokenize("".join(f"Record {i}: box {i} moved to aisle {i % 9}.\n" for i in range(40, 52)),
                      add_special=False)
    assert len(more) > W
    second = first + out1 + more + e.tokenize("Question: which aisle holds box 44?\nAnswer:", add_special=False)
    out2, _ = run(e, second, GenerationParams(max_tokens=8, speculative=False))
    third = second + out2 + e.tokenize("\nQuestion: and box 47?\nAnswer:", add_special=False)
    out3, st = run(e, third, GenerationParams(max_tokens=16, draft_max=7))
    assert st.drafted > 0
    assert check_lossless(e, third, out3).lossless
    with pytest.raises(ValueError):
        e.set_drafter_window(-1)


def test_generate_takes_the_window_and_reports_it(tiny_pair: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    from app.cli import main

    t, d = tiny_pair
    args = ["generate", "--target", str(t), "--drafter", str(d), "--prompt", "the cat sat on the mat " * 8,
            "--max-tokens", "12", "--json", "--draft-mode", "fixed"]
    outs = []
    for w in ("4", "0"):
        assert main(args + ["--drafter-window", w]) == 0
        outs.append(json.loads(capsys.readouterr().out))
    assert [o["drafter_window"] for o in outs] == [4, 0]
    assert outs[0]["tokens"] == outs[1]["tokens"] and outs[0]["stats"]["drafted"] > 0
    with pytest.raises(SystemExit):
        main(args + ["--drafter-window", "-1"])


def test_the_default_window_is_the_span_the_drafter_file_says(tiny_pair: tuple[Path, Path], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    """No --drafter-window: the drafter attends to the span its file says it was trained on (distill writes
    it), else DRAFTER_WINDOW; an explicit window (0 included) wins; the plan sizes the drafter's cache the
    same way."""
    from app.cli import main
    from app.engine.dflash import DRAFTER_WINDOW, drafter_context
    from app.scheduler.inventory import host_spec, hypothetical_inventory
    from app.scheduler.plan import PlanRequest
    from app.scheduler.planner import plan_split
    from gguf_tools.edit import copy_gguf
    from gguf_tools.formats import TRAINED_SPAN_KEY

    t, d = tiny_pair
    spanned = copy_gguf(d, tmp_path / "spanned.gguf", meta={TRAINED_SPAN_KEY: 40})
    args = ["generate", "--target", str(t), "--prompt", "the cat sat on the mat " * 8, "--max-tokens", "4",
            "--json", "--draft-mode", "fixed"]
    windows = []
    for drafter, extra in ((d, []), (spanned, []), (spanned, ["--drafter-window", "0"]),
                           (spanned, ["--drafter-window", "8"])):
        assert main(args + ["--drafter", str(drafter)] + extra) == 0
        windows.append(json.loads(capsys.readouterr().out)["drafter_window"])
    assert windows == [DRAFTER_WINDOW, 40, 0, 8]
    inv = hypothetical_inventory(["RTX3090:24GiB"], host_spec())
    for drafter, window in ((d, DRAFTER_WINDOW), (spanned, 40)):
        plan = plan_split(t, drafter, inv, PlanRequest(n_ctx=1024))  # the tiny target's training context
        assert plan.drafter_plan.n_ctx == -(-drafter_context(1024, window) // 256) * 256  # llama.cpp pads to 256
