"""Long document questions for the distillation corpus: real text files indexed full-text, real
retrieval, prompts sized in the bundled target's tokens, laid out as `docs ask` lays them out; and
generation over prompts longer than the default 384 tokens beside short ones."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from app.distill.corpus import CorpusPrompt, build_corpus, long_document_asks, tokenizer_of
from app.distill.offline_text import OfflineDocument
from app.engine.llama_objects import LlamaModel

TOPICS = {"zebrafetch": "downloads mirrored archives", "quillpack": "packs notebooks into volumes",
          "moltenlog": "rotates kernel journals", "pebblesync": "synchronises garden sensors",
          "harborctl": "schedules ferry timetables", "lanternd": "dims street lights at dawn"}


def _docs(root: Path) -> list[OfflineDocument]:
    out = []
    for name, what in TOPICS.items():
        f = root / name / "README.txt"
        f.parent.mkdir(parents=True)
        paras = [f"The {name} program {what}. Paragraph {i} explains how {name} reads its settings file, "
                 f"which options it accepts and what it prints when {name} finishes its work." for i in range(30)]
        f.write_text("\n\n".join(paras))
        out.append(OfflineDocument(f"prose:{f}", "prose", f))
    return out


@pytest.fixture(scope="module")
def tokenizer(gemma_target: Path):
    model = LlamaModel(gemma_target)
    yield tokenizer_of(model)
    model.close()


def test_long_asks_fill_their_size_with_several_retrieved_sources(tmp_path: Path, tokenizer) -> None:
    count, _ = tokenizer
    asks = long_document_asks(random.Random(3), 4, *tokenizer, docs=_docs(tmp_path), sizes=(400, 700))
    assert len(asks) == 4
    for a in asks:
        n = count(a)
        assert 300 <= n <= 700, n  # filled near the drawn size, never past the largest
        assert "Read the sources and answer the question from them." in a and a.endswith("Assistant:")
        assert "[1] " in a and "[2] " in a  # several sources, numbered as docs ask numbers them
        asked = next(name for name in TOPICS if f"{name}" in a.rsplit("User:", 1)[1])
        assert f"[1] {asked}.txt" in a  # the asked document's own chunk is retrieved first


def test_a_corpus_with_long_asks_needs_the_targets_tokenizer() -> None:
    with pytest.raises(ValueError, match="tokenizer"):
        build_corpus(n_code=0, n_chat=0, n_long_docs=2)


def test_generation_reads_a_long_prompt_beside_short_ones(tmp_path: Path, tiny_gemma_pair) -> None:
    from app.distill.dataset import DistillData, pack
    from app.distill.generate import GenConfig, generate_dataset

    target = tiny_gemma_pair[0]
    long_text = " ".join(f"word{i % 50}" for i in range(150))
    model = LlamaModel(target)
    n_long = len(model.tokenize(long_text, add_special=True, parse_special=True))
    model.close()
    assert n_long > 600  # longer than a batch (512) and the default cap (384)
    prompts = [CorpusPrompt("long", "docqa-long", long_text, "raw")] + [
        CorpusPrompt(f"short{i}", "code", f"the short prompt number {i}", "raw") for i in range(5)]
    cfg = GenConfig(tap_layers=[1, 2], n_parallel=3, max_new_tokens=12, max_prompt_tokens=n_long + 8, shard_size=4,
                    greedy_fraction=1.0, replies=1)
    res = generate_dataset(target, prompts, tmp_path / "data", cfg)
    assert res["sequences"] == 6 and res["prompts_left"] == 0
    data = DistillData(pack(tmp_path / "data", tmp_path / "packed", [1, 2]))
    seqs = [data[i] for i in range(len(data))]
    long = next(s for s in seqs if s.kind == "docqa-long")
    assert long.n_prompt == n_long and long.features.shape[0] == len(long.tokens) - 1
    # at the default 384 the long prompt is skipped
    res = generate_dataset(target, prompts, tmp_path / "data384",
                           GenConfig(tap_layers=[1, 2], n_parallel=3, max_new_tokens=12, greedy_fraction=1.0,
                                     replies=1))
    assert res["sequences"] == 5
