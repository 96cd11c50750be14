"""`flashdesk prompts docqa-long` (issue 29, item 4): questions over the licences and Python's language
reference at set prompt sizes, each laid out as `docs ask` lays out its prompt."""

from __future__ import annotations

import re
from pathlib import Path

from app.bench.prompt_sets import DOCQA_LONG_QUESTIONS, docqa_long_corpus, docqa_long_prompts
from app.documents.answer import INSTRUCTIONS
from app.engine.dflash import Engine, EngineConfig


def test_the_corpus_is_the_licences_and_the_language_reference(tmp_path: Path) -> None:
    files = docqa_long_corpus(tmp_path)
    names = {f.name for f in files}
    assert "python-with.txt" in names and all(f.suffix == ".txt" and f.stat().st_size > 0 for f in files)
    if Path("/usr/share/common-licenses/GPL-3").exists():
        assert "GPL-3.txt" in names
    assert sum(f.stat().st_size for f in files) > 4 * 32768  # more text than the largest prompt holds


def test_prompts_fill_their_size_as_docs_ask_lays_them_out(gemma_target: Path) -> None:
    """At two sizes (the set's 2k and a 6k one: the 32k ones take the same path, longer): every
    question has a prompt within its size and filling most of it, in the target's prompt format with
    the instructions, numbered sources (a licence's or a topic's lines) and the question, its stop
    strings, and the category naming the size."""
    e = Engine(gemma_target, None, EngineConfig(n_ctx=512))
    try:
        rows = docqa_long_prompts(e, sizes={"2k": 2048, "6k": 6144})
    finally:
        e.close()
    assert len(rows) == 2 * len(DOCQA_LONG_QUESTIONS)
    for r in rows:
        size = {"docqa-long-2k": 2048, "docqa-long-6k": 6144}[r["category"]]
        assert 0.9 * size <= r["n_tokens"] <= size, (r["id"], r["n_tokens"])
        assert r["prompt"].startswith(INSTRUCTIONS) or f"{INSTRUCTIONS}\n\nSources:" in r["prompt"]
        assert re.search(r"\[1\] (\S+\.txt), lines \d+-\d+", r["prompt"])
        q = DOCQA_LONG_QUESTIONS[int(r["id"].rsplit("-", 1)[1])]
        assert r["prompt"].rstrip().endswith(("Assistant:", "model")) and q in r["prompt"][-300:]
        assert r["n_sources"] >= size // 1400 and r["stop"]
