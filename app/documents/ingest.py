"""Read one file into text blocks that keep their page and line range.

A block is a paragraph, a heading or a code block: the chunker never cuts
inside one unless it is too large on its own. Every reader raises SkipFile
(naming the file and the reason) for a file it cannot read, so the indexer
records the reason and goes on with the next file.
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from app.errors import FlashDeskError

PROSE = "para"
CODE = "code"
HEADING = "heading"

CODE_EXTS = {
    ".py", ".pyi", ".js", ".mjs", ".jsx", ".ts", ".tsx", ".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh",
    ".java", ".kt", ".go", ".rs", ".rb", ".php", ".cs", ".swift", ".scala", ".lua", ".r", ".jl", ".sh",
    ".bash", ".zsh", ".ps1", ".sql", ".css", ".scss", ".toml", ".yaml", ".yml", ".json", ".ini", ".cfg",
    ".cmake", ".mk", ".proto", ".dart", ".hs", ".ml", ".ex", ".exs", ".erl", ".clj", ".vue", ".svelte",
}
KIND_BY_EXT = {".pdf": "pdf", ".docx": "docx", ".html": "html", ".htm": "html", ".xhtml": "html",
               ".md": "markdown", ".markdown": "markdown", ".mdx": "markdown",
               ".txt": "text", ".text": "text", ".rst": "text", ".log": "text", ".csv": "text", ".tex": "text"}
KIND_BY_EXT.update({e: "code" for e in CODE_EXTS})
CODE_NAMES = {"makefile": "code", "dockerfile": "code", "cmakelists.txt": "code"}

MAX_FILE_BYTES = 200 * 1024 * 1024  # larger files are skipped: almost surely not prose
# a DOCX is a ZIP: its members' declared sizes are checked before anything is inflated (a ZIP bomb)
MAX_DOCX_UNCOMPRESSED = 256 * 1024 * 1024
MAX_DOCX_RATIO = 1000  # uncompressed / compressed, over the whole package: XML compresses ~5-20x
# a "text" file whose first bytes hold more control characters than this share is binary
_BINARY_SAMPLE = 64 * 1024
_MAX_CONTROL_SHARE = 0.01
_CONTROL = bytes(b for b in range(32) if b not in b"\t\n\r\x0b\x0c\x1b") + b"\x7f"


class SkipFile(FlashDeskError):
    """This file cannot be indexed; the message names it and says why."""

    def __init__(self, path: Path, reason: str):
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


@dataclass
class Block:
    text: str
    page: int | None  # 1-based page (PDF); None where the format has no pages
    line_start: int  # 1-based, inclusive (within the page for PDFs; paragraph number for DOCX)
    line_end: int
    kind: str = PROSE  # PROSE | CODE | HEADING


@dataclass
class Document:
    path: Path
    kind: str  # pdf | docx | html | markdown | text | code
    blocks: list[Block]
    n_pages: int = 0  # 0 where the format has no pages


def kind_of(path: Path) -> str | None:
    """The reader for this file name, or None when it is not a supported format."""
    name = path.name.lower()
    if name in CODE_NAMES:
        return CODE_NAMES[name]
    return KIND_BY_EXT.get(path.suffix.lower())


def read_document(path: str | Path) -> Document:
    """Read a supported file into blocks; raises SkipFile when it cannot."""
    path = Path(path)
    kind = kind_of(path)
    if kind is None:
        raise SkipFile(path, f"unsupported file type {path.suffix or '(no extension)'}")
    try:
        size = path.stat().st_size
    except OSError as e:
        raise SkipFile(path, f"cannot be read ({e.strerror or e})") from None
    if size > MAX_FILE_BYTES:
        raise SkipFile(path, f"too large ({size / 1e6:.0f} MB; the limit is {MAX_FILE_BYTES // 10**6} MB)")
    reader = {"pdf": _read_pdf, "docx": _read_docx, "html": _read_html, "markdown": _read_markdown,
              "text": _read_text, "code": _read_code}[kind]
    try:
        doc = reader(path)
    except SkipFile:
        raise
    except OSError as e:
        raise SkipFile(path, f"cannot be read ({e.strerror or e})") from None
    if not any(b.text.strip() for b in doc.blocks):
        if kind == "pdf":
            raise SkipFile(path, "no text layer (a scanned PDF? OCR is not supported)")
        raise SkipFile(path, "no text in this file")
    return doc


# --- plain text, Markdown, code ------------------------------------------------
def _read_text_file(path: Path) -> str:
    data = path.read_bytes()
    if b"\x00" in data[:_BINARY_SAMPLE]:
        raise SkipFile(path, "binary content in a text file (NUL bytes)")
    sample = data[:_BINARY_SAMPLE]
    n_control = len(sample) - len(sample.translate(None, _CONTROL))
    if sample and n_control > _MAX_CONTROL_SHARE * len(sample):
        raise SkipFile(path, f"binary content in a text file ({n_control / len(sample):.0%} of its first "
                             f"{len(sample):,} bytes are control characters)")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        # legacy 8-bit text: latin-1 maps every byte, so nothing is lost
        return data.decode("latin-1")


def _paragraphs(lines: list[str], first_line: int = 1, page: int | None = None,
                kind: str = PROSE) -> list[Block]:
    """Blank-line separated paragraphs of `lines` (numbered from first_line)."""
    blocks: list[Block] = []
    start = None
    for i, line in enumerate(lines + [""]):
        if line.strip():
            if start is None:
                start = i
        elif start is not None:
            blocks.append(Block("\n".join(lines[start:i]).strip("\n"), page, first_line + start,
                                first_line + i - 1, kind))
            start = None
    return blocks


def _read_text(path: Path) -> Document:
    return Document(path, "text", _paragraphs(_read_text_file(path).splitlines()))


_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_MD_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+\S")


def _read_markdown(path: Path) -> Document:
    """Paragraphs, headings, and fenced code blocks kept whole (blank lines and all)."""
    lines = _read_text_file(path).splitlines()
    blocks: list[Block] = []
    para: list[tuple[int, str]] = []

    def flush() -> None:
        if para:
            blocks.append(Block("\n".join(t for _, t in para), None, para[0][0], para[-1][0], PROSE))
            para.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        fence = _FENCE.match(line)
        if fence:
            flush()
            j = i + 1
            while j < len(lines) and not lines[j].lstrip().startswith(fence.group(1)):
                j += 1
            end = min(j, len(lines) - 1)
            blocks.append(Block("\n".join(lines[i:end + 1]), None, i + 1, end + 1, CODE))
            i = end + 1
            continue
        if _MD_HEADING.match(line):
            flush()
            blocks.append(Block(line.strip().lstrip("#").strip(), None, i + 1, i + 1, HEADING))
        elif line.strip():
            para.append((i + 1, line))
        else:
            flush()
        i += 1
    flush()
    return Document(path, "markdown", blocks)


def _read_code(path: Path) -> Document:
    """Blocks split only at a blank line followed by an unindented line, so a
    function or class (blank lines inside it and all) stays one block."""
    lines = _read_text_file(path).splitlines()
    blocks: list[Block] = []
    start = None
    for i, line in enumerate(lines + [""]):
        at_end = i == len(lines)
        boundary = at_end or (not line.strip() and (i + 1 >= len(lines) or not lines[i + 1][:1].isspace()))
        if start is None:
            if line.strip():
                start = i
            continue
        if boundary:
            text = "\n".join(lines[start:i]).rstrip()
            if text.strip():
                blocks.append(Block(text, None, start + 1, start + len(text.splitlines()), CODE))
            start = None
    return Document(path, "code", blocks)


# --- PDF ---------------------------------------------------------------------------
_SENTENCE_END = re.compile(r"[.!?:;)\"'\u201d]\s*$")


def _pdf_page_blocks(text: str, page: int) -> list[Block]:
    """Paragraphs of one page's extracted text. Extraction rarely keeps blank
    lines, so a line that ends a sentence and is clearly shorter than the
    page's full lines also ends a paragraph."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    if not any(ln.strip() for ln in lines):
        return []
    full = max(len(ln) for ln in lines)
    blocks: list[Block] = []
    start = None
    for i, line in enumerate(lines):
        if not line.strip():
            if start is not None:
                blocks.append(Block("\n".join(lines[start:i]), page, start + 1, i, PROSE))
                start = None
            continue
        if start is None:
            start = i
        if _SENTENCE_END.search(line) and len(line) < 0.8 * full:
            blocks.append(Block("\n".join(lines[start:i + 1]), page, start + 1, i + 1, PROSE))
            start = None
    if start is not None:
        blocks.append(Block("\n".join(lines[start:]), page, start + 1, len(lines), PROSE))
    return blocks


def _read_pdf(path: Path) -> Document:
    # pypdf (~0.1 s to import) loads with the first PDF read, not with the app
    from pypdf import PdfReader
    from pypdf.errors import DependencyError, FileNotDecryptedError, PdfReadError

    try:
        reader = PdfReader(path)
        if reader.is_encrypted:
            # many "protected" PDFs only restrict printing and open with the empty password
            try:
                ok = reader.decrypt("")
            except (DependencyError, NotImplementedError) as e:
                raise SkipFile(path, f"encrypted with an unsupported method ({e})") from None
            if not ok:
                raise SkipFile(path, "password-protected PDF (no password is tried)")
        blocks: list[Block] = []
        n_pages = len(reader.pages)
        for i, page in enumerate(reader.pages):
            blocks.extend(_pdf_page_blocks(page.extract_text() or "", i + 1))
    except SkipFile:
        raise
    except FileNotDecryptedError:
        raise SkipFile(path, "password-protected PDF (no password is tried)") from None
    except (PdfReadError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError) as e:
        # pypdf raises many kinds of errors on damaged files; all mean "broken"
        raise SkipFile(path, f"not a readable PDF ({type(e).__name__}: {e})") from None
    return Document(path, "pdf", blocks, n_pages)


# --- DOCX --------------------------------------------------------------------------
_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"


def _read_docx(path: Path) -> Document:
    """Paragraphs and table rows in body order; 'lines' are paragraph numbers
    (a DOCX has no pages until a word processor lays it out)."""
    # python-docx and lxml (~0.1 s to import) load with the first DOCX read, not with the app
    import docx
    from docx.opc.exceptions import PackageNotFoundError
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    with open(path, "rb") as f:
        head = f.read(8)
    if head == _OLE_MAGIC:
        # Word writes encrypted documents (and old .doc files) as OLE containers
        raise SkipFile(path, "password-protected (encrypted) or old-format Word document")
    if not zipfile.is_zipfile(path):
        raise SkipFile(path, "not a readable DOCX (not a ZIP package: damaged, or not really a .docx)")
    _check_zip_sizes(path)
    try:
        d = docx.Document(str(path))
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError) as e:
        raise SkipFile(path, f"not a readable DOCX ({type(e).__name__}: {e})") from None
    except Exception as e:  # lxml errors on damaged XML parts
        raise SkipFile(path, f"not a readable DOCX ({type(e).__name__}: {e})") from None

    # style id -> name once: python-docx's per-paragraph `style` lookup scans all styles each time
    style_names = {s.style_id: s.name or "" for s in d.styles}
    blocks: list[Block] = []
    n = 0
    for el in d.element.body.iterchildren():
        tag = el.tag.rsplit("}", 1)[-1]
        if tag == "p":
            n += 1
            p = Paragraph(el, d)
            text = p.text.strip()
            if not text:
                continue
            style = style_names.get(el.style or "", "").lower()
            kind = HEADING if style.startswith(("heading", "title")) else PROSE
            blocks.append(Block(text, None, n, n, kind))
        elif tag == "tbl":
            for row in Table(el, d).rows:
                n += 1
                cells = [c.text.strip() for c in row.cells]
                if any(cells):
                    blocks.append(Block(" | ".join(cells), None, n, n, PROSE))
    return Document(path, "docx", blocks)


def _check_zip_sizes(path: Path) -> None:
    """Refuse a package that would inflate past MAX_DOCX_UNCOMPRESSED (or compresses implausibly well),
    from the sizes its directory declares, before any member is read."""
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise SkipFile(path, f"not a readable DOCX ({type(e).__name__}: {e})") from None
    total = sum(i.file_size for i in infos)
    packed = sum(i.compress_size for i in infos)
    if total > MAX_DOCX_UNCOMPRESSED:
        biggest = max(infos, key=lambda i: i.file_size)
        raise SkipFile(path, f"a DOCX that inflates to {total / 1e6:,.0f} MB (its part {biggest.filename[:60]!r} "
                             f"alone {biggest.file_size / 1e6:,.0f} MB; the limit is "
                             f"{MAX_DOCX_UNCOMPRESSED // 2**20} MB): not parsed")
    if packed and total > 1 << 20 and total > MAX_DOCX_RATIO * packed:
        raise SkipFile(path, f"a DOCX whose {packed / 1e6:,.1f} MB inflate to {total / 1e6:,.0f} MB "
                             f"({total // packed:,}x; a ZIP bomb?): not parsed")


# --- HTML --------------------------------------------------------------------------
_BLOCK_TAGS = {"p", "div", "section", "article", "main", "header", "footer", "nav", "aside", "li", "ul", "ol",
               "table", "tr", "td", "th", "blockquote", "dd", "dt", "dl", "figure", "figcaption", "form",
               "h1", "h2", "h3", "h4", "h5", "h6", "br", "hr", "title", "pre", "body"}
_SKIP_TAGS = {"script", "style", "noscript", "template", "svg", "head"}


class _HTMLBlocks(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[Block] = []
        self._buf: list[str] = []
        self._start_line = 1
        self._skip = 0
        self._pre = 0
        self._heading = False
        self._title = False

    def _flush(self) -> None:
        raw = "".join(self._buf)
        self._buf = []
        line_end = self.getpos()[0]
        if self._pre:
            text, kind = raw.strip("\n"), CODE
        else:
            text = re.sub(r"\s+", " ", raw).strip()
            kind = HEADING if self._heading else PROSE
        if text:
            self.blocks.append(Block(text, None, self._start_line, max(line_end, self._start_line), kind))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._title = True  # <title> sits in <head>, which is otherwise skipped
        if tag in _SKIP_TAGS:
            self._skip += 1
            return
        if tag in _BLOCK_TAGS:
            self._flush()
            self._start_line = self.getpos()[0]
            if tag == "pre":
                self._pre += 1
            self._heading = tag in ("h1", "h2", "h3", "h4", "h5", "h6")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._title = False
        if tag in _SKIP_TAGS:
            self._skip = max(0, self._skip - 1)
            return
        if tag in _BLOCK_TAGS:
            self._flush()
            if tag == "pre":
                self._pre = max(0, self._pre - 1)
            self._heading = False
            self._start_line = self.getpos()[0]

    def handle_data(self, data: str) -> None:
        if self._title:
            self.blocks.append(Block(data.strip(), None, self.getpos()[0], self.getpos()[0], HEADING))
            return
        if self._skip:
            return
        if not "".join(self._buf).strip():
            self._start_line = self.getpos()[0] + (len(data) - len(data.lstrip("\n")) if not self._pre else 0)
        self._buf.append(data)


def _read_html(path: Path) -> Document:
    p = _HTMLBlocks()
    p.feed(_read_text_file(path))
    p.close()
    p._flush()
    return Document(path, "html", [b for b in p.blocks if b.text])
