"""Offline text for teacher-forced distillation data: what this machine already holds.

Two kinds, in a reproducible order:
- code: Python source files of the standard library and of the installed packages
  (tests and generated files left out);
- prose: Debian's documentation (README, NEWS and other text files under
  /usr/share/doc, decompressed) and man pages rendered to plain text by man(1)
  (wide, so paragraphs come out whole, without hyphenation or justification).

Held back for evaluation, never returned: /usr/share/common-licenses and the
standard library's pydoc_data (the long documents docqa-long reads) and every window that overlaps
HumanEval or the bench's own prompt sets (`HumanEvalGuard(bench_sets=True)`,
checked by the caller on each window it keeps).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import subprocess
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

EVAL_RESERVED = (Path("/usr/share/common-licenses"), Path(sysconfig.get_paths()["stdlib"]) / "pydoc_data")
_SKIP_PARTS = {"test", "tests", "testing", "idlelib", "tkinter", "lib2to3", "turtledemo", "ensurepip", "__pycache__",
               "_vendor", "vendored"}
_DOC_NAMES = re.compile(r"^(readme|news|changes|faq|todo|usage|install|howto|bugs|thanks|authors)"
                        r"|\.(txt|md|markdown|rst)$", re.I)
MIN_CHARS = 400
MAX_CHARS = 200_000
MAN_FAMILY_MAX = 25  # a larger file is mostly data (tables, generated code)


@dataclass(frozen=True)
class OfflineDocument:
    id: str  # stable across runs: the kind and the path
    kind: str  # "code" | "prose"
    path: Path


def python_files(roots: list[Path] | None = None) -> list[OfflineDocument]:
    """Python sources under the stdlib and site-packages (or `roots`), sorted by path."""
    if roots is None:
        paths = sysconfig.get_paths()
        roots = sorted({Path(paths["stdlib"]), Path(paths["purelib"]), Path(paths["platlib"])})
    out: dict[Path, OfflineDocument] = {}
    for root in roots:
        for p in sorted(root.rglob("*.py")):
            rel = p.relative_to(root).parts
            if set(rel) & _SKIP_PARTS or p.name.startswith("test_") or p in out or _reserved(p):
                continue
            out[p] = OfflineDocument(f"code:{p}", "code", p)
    return [out[p] for p in sorted(out)]


def debian_docs(root: Path = Path("/usr/share/doc")) -> list[OfflineDocument]:
    """Text files of Debian's package documentation (copyright files are licences: held back)."""
    out = []
    for p in sorted(root.rglob("*")):
        name = p.name[:-3] if p.name.endswith(".gz") else p.name
        if p.is_file() and name != "copyright" and _DOC_NAMES.search(name) and not _reserved(p):
            out.append(OfflineDocument(f"prose:{p}", "prose", p))
    return out


def man_pages(root: Path = Path("/usr/share/man"), sections: tuple[str, ...] = ("man1", "man5", "man8", "man7")
              ) -> list[OfflineDocument]:
    """English man pages of the given sections (translations live in other folders), at most
    MAN_FAMILY_MAX of one family (one SDK here ships thousands of near-identical pages)."""
    out = []
    per_family: dict[str, int] = {}
    for sec in sections:
        for p in sorted((root / sec).glob("*")):
            family = re.split(r"[_.-]", p.name, maxsplit=1)[0]
            per_family[family] = per_family.get(family, 0) + 1
            if p.is_file() and per_family[family] <= MAN_FAMILY_MAX:
                out.append(OfflineDocument(f"prose:{p}", "prose", p))
    return out


def _reserved(p: Path) -> bool:
    return any(p == r or r in p.parents for r in EVAL_RESERVED)


def read_document(doc: OfflineDocument) -> str | None:
    """The document's text, or None where it is empty, binary, too small or too large."""
    try:
        if "/man/" in str(doc.path):
            text = _render_man(doc.path)
        else:
            raw = doc.path.read_bytes()
            if doc.path.suffix == ".gz":
                raw = gzip.decompress(raw)
            text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile, subprocess.SubprocessError):
        return None
    if text is None or "\x00" in text or not MIN_CHARS <= len(text) <= MAX_CHARS:
        return None
    return text


def _render_man(path: Path) -> str | None:
    env = {**os.environ, "MANWIDTH": "1000", "MAN_KEEP_FORMATTING": "0", "LC_ALL": "C.UTF-8"}
    r = subprocess.run(["man", "-l", "-E", "UTF-8", str(path)], capture_output=True, env=env, timeout=20,
                       check=False)
    if r.returncode != 0:
        return None
    # man's overstrike bold/underline; the title and footer lines (padded to the width); the margin
    lines = re.sub(r".\x08", "", r.stdout.decode("utf-8", "replace")).strip().splitlines()[1:-1]
    lines = [re.sub(r" {3,}", "  ", ln[7:] if ln.startswith(" " * 7) else ln.lstrip()).rstrip() for ln in lines]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


def offline_documents(kinds: tuple[str, ...] = ("code", "prose"), seed: int = 0) -> list[OfflineDocument]:
    """Every offline document of the given kinds, interleaved and shuffled reproducibly."""
    docs: list[OfflineDocument] = []
    if "code" in kinds:
        docs += python_files()
    if "prose" in kinds:
        docs += debian_docs() + man_pages()
    random.Random(seed).shuffle(docs)
    return docs


def iter_texts(docs: list[OfflineDocument]) -> Iterator[tuple[OfflineDocument, str]]:
    for d in docs:
        text = read_document(d)
        if text is not None:
            yield d, text


def save_documents(docs: list[OfflineDocument], path: Path) -> None:
    """The document list a text folder was labelled from: a resumed run counts documents in it."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps({"id": d.id, "kind": d.kind, "path": str(d.path)}) + "\n" for d in docs))
    tmp.rename(path)


def load_documents(path: Path) -> list[OfflineDocument]:
    rows = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return [OfflineDocument(r["id"], r["kind"], Path(r["path"])) for r in rows]
