"""Reading real files (fpdf2 PDFs, python-docx DOCX, HTML, Markdown, text, code)
into blocks, and packing blocks into chunks that keep page and line range."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest
from documents_corpus import BROKEN, build_corpus

from app.documents.chunking import chunk_document
from app.documents.ingest import CODE, HEADING, SkipFile, read_document


def _norm(s: str) -> str:
    return " ".join(s.split())


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    build_corpus(root)
    return root


def test_pdf_blocks_carry_their_page_number(corpus: Path) -> None:
    doc = read_document(corpus / "pdf" / "handbook.pdf")
    assert doc.kind == "pdf" and doc.n_pages == 8
    pages = {b.page for b in doc.blocks}
    assert pages == set(range(1, 9))
    brandt = [b for b in doc.blocks if "Tomas Brandt" in _norm(b.text)]
    assert [b.page for b in brandt] == [2]
    hackathon = [b for b in doc.blocks if "second week of March" in _norm(b.text)]
    assert [b.page for b in hackathon] == [5]


def test_docx_keeps_headings_paragraphs_and_table_rows(corpus: Path) -> None:
    doc = read_document(corpus / "minutes.docx")
    assert doc.kind == "docx" and doc.n_pages == 0
    headings = [b.text for b in doc.blocks if b.kind == HEADING]
    assert headings[0] == "Committee meeting minutes" and "Equipment" in headings
    assert any(b.text == "Kestrel | backup server | basement rack 4" for b in doc.blocks)
    assert any("Priya Raman" in b.text for b in doc.blocks)
    # paragraph numbers increase through the body
    starts = [b.line_start for b in doc.blocks]
    assert starts == sorted(starts)


def test_html_drops_scripts_and_styles_and_keeps_pre_as_code(corpus: Path) -> None:
    doc = read_document(corpus / "faq.html")
    text = "\n".join(b.text for b in doc.blocks)
    assert "tracking" not in text and "color: red" not in text
    assert "Rotterdam" in text
    assert any(b.kind == CODE and "curl" in b.text for b in doc.blocks)
    assert any(b.kind == HEADING and b.text == "Shop FAQ" for b in doc.blocks)


def test_markdown_fenced_code_block_stays_whole_with_blank_lines(corpus: Path) -> None:
    doc = read_document(corpus / "guide.md")
    code = [b for b in doc.blocks if b.kind == CODE and "def example" in b.text]
    assert len(code) == 1
    assert "\n\n" in code[0].text and code[0].text.startswith("```python") and code[0].text.endswith("```")


def test_source_code_splits_only_between_top_level_definitions(corpus: Path) -> None:
    doc = read_document(corpus / "src" / "uploader.py")
    cls = [b for b in doc.blocks if b.text.startswith("class Uploader")]
    assert len(cls) == 1 and "raise RuntimeError('upload failed')" in cls[0].text
    step = [b for b in doc.blocks if b.text.startswith("def step_0")]
    assert len(step) == 1 and "return result" in step[0].text  # the blank line inside did not split it


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_files_raise_skipfile_naming_file_and_reason(corpus: Path, name: str) -> None:
    path = corpus / "notes" / name
    with pytest.raises(SkipFile) as e:
        read_document(path)
    assert BROKEN[name] in e.value.reason
    assert str(path) in str(e.value)


def test_unsupported_and_missing_files_are_skipped_with_reason(tmp_path: Path) -> None:
    (tmp_path / "photo.jpg").write_bytes(b"\xff\xd8\xff")
    with pytest.raises(SkipFile, match="unsupported file type .jpg"):
        read_document(tmp_path / "photo.jpg")
    with pytest.raises(SkipFile, match="cannot be read"):
        read_document(tmp_path / "gone.txt")
    (tmp_path / "empty.md").write_text("\n\n   \n")
    with pytest.raises(SkipFile, match="no text"):
        read_document(tmp_path / "empty.md")


def test_latin1_text_is_read_without_loss(tmp_path: Path) -> None:
    (tmp_path / "old.txt").write_bytes("Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e".encode("latin-1"))
    assert read_document(tmp_path / "old.txt").blocks[0].text == "Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e"


@pytest.mark.parametrize("name", ["notes/notes.txt", "notes/other.txt", "guide.md", "changelog.md",
                                  "src/uploader.py"])
def test_chunk_line_ranges_point_at_the_chunk_text(corpus: Path, name: str) -> None:
    path = corpus / name
    lines = path.read_text().splitlines()
    chunks = chunk_document(read_document(path))
    assert len(chunks) >= 2
    for c in chunks:
        span = _norm("\n".join(lines[c.line_start - 1:c.line_end]))
        for piece in c.text.split("\n\n"):
            # each block of the chunk (heading markup aside) lies inside the cited lines
            assert _norm(piece).lstrip("# ") in span, (name, c.line_start, c.line_end, piece[:80])


def test_chunks_overlap_and_respect_the_size_limits(corpus: Path) -> None:
    chunks = chunk_document(read_document(corpus / "notes" / "other.txt"), target_chars=600, max_chars=900,
                            overlap_chars=150)
    assert len(chunks) >= 4
    assert all(len(c.text) <= 900 + 150 for c in chunks)
    overlapping = 0
    for a, b in pairwise(chunks):
        head = _norm(b.text)[:60]
        overlapping += head in _norm(a.text)
    assert overlapping >= len(chunks) // 2  # the next chunk starts with the end of the previous one


def test_pdf_chunks_never_span_two_pages(corpus: Path) -> None:
    doc = read_document(corpus / "pdf" / "report.pdf")
    chunks = chunk_document(doc, target_chars=500, max_chars=800, overlap_chars=100)
    by_page = {b.page: _norm(" ".join(x.text for x in doc.blocks if x.page == b.page)) for b in doc.blocks}
    for c in chunks:
        assert c.page is not None
        for piece in c.text.split("\n\n"):
            assert _norm(piece) in by_page[c.page]


def test_an_oversized_paragraph_is_cut_at_sentences() -> None:
    from app.documents.ingest import Block, Document

    para = " ".join(f"Sentence number {i} says something." for i in range(200))
    doc = Document(Path("x.txt"), "text", [Block(para, None, 1, 1)])
    chunks = chunk_document(doc, target_chars=500, max_chars=700, overlap_chars=100)
    assert len(chunks) > 5
    assert all(len(c.text) <= 700 + 100 for c in chunks)
    assert all(c.text.rstrip().endswith(".") for c in chunks)
    assert "Sentence number 199 says something." in chunks[-1].text
