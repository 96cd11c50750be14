"""Blocks -> chunks: paragraphs and code blocks are packed whole up to a target
size, with overlap, and every chunk keeps its page and line range.

A chunk never spans two PDF pages, so each citation names exactly one page.
A block larger than the maximum is cut at sentence (prose) or line (code)
boundaries, and only then, for a single enormous line, by characters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import groupby

from app.documents.ingest import CODE, HEADING, Block, Document

TARGET_CHARS = 900  # ~225 tokens: five chunks and a question fit a 2k context
MAX_CHARS = 1400
OVERLAP_CHARS = 200


@dataclass
class Chunk:
    text: str
    page: int | None
    line_start: int
    line_end: int
    heading: str = ""  # the section heading in force where the chunk starts


_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=\S)")


def _pieces(block: Block) -> list[Block]:
    """The block cut into its smallest natural units (sentences or lines), each
    with its exact line range."""
    if block.kind == CODE:
        units = block.text.split("\n")
        seps = ["\n"] * len(units)
    else:
        units, seps, pos = [], [], 0
        for m in _SENTENCE.finditer(block.text):
            units.append(block.text[pos:m.start()])
            seps.append(m.group(0))
            pos = m.end()
        units.append(block.text[pos:])
        seps.append("")
    out: list[Block] = []
    line = block.line_start
    for unit, sep in zip(units, seps, strict=True):
        n_nl = unit.count("\n")
        if unit.strip():
            out.append(Block(unit, block.page, line, min(line + n_nl, block.line_end), block.kind))
        line += n_nl + sep.count("\n")
    return out


def _split_large(block: Block, limit: int) -> list[Block]:
    """Cut a block into parts of at most `limit` characters at natural boundaries."""
    if len(block.text) <= limit:
        return [block]
    joiner = "\n" if block.kind == CODE else " "
    parts: list[Block] = []
    cur: list[Block] = []
    size = 0
    for p in _pieces(block):
        if len(p.text) > limit:  # one enormous sentence or line: cut by characters
            for i in range(0, len(p.text), limit):
                cur_piece = Block(p.text[i:i + limit], p.page, p.line_start, p.line_end, p.kind)
                if cur:
                    parts.append(_join(cur, joiner))
                    cur, size = [], 0
                parts.append(cur_piece)
            continue
        if cur and size + len(joiner) + len(p.text) > limit:
            parts.append(_join(cur, joiner))
            cur, size = [], 0
        cur.append(p)
        size += len(p.text) + (len(joiner) if size else 0)
    if cur:
        parts.append(_join(cur, joiner))
    return parts


def _join(parts: list[Block], joiner: str) -> Block:
    return Block(joiner.join(p.text for p in parts), parts[0].page, parts[0].line_start,
                 max(p.line_end for p in parts), parts[0].kind)


def _tail(block: Block, budget: int) -> list[Block]:
    """The last sentences (or lines) of a block that fit in `budget` characters,
    as one block: the overlap carried into the next chunk."""
    if len(block.text) <= budget:
        return [block]
    out: list[Block] = []
    size = 0
    for p in reversed(_pieces(block)):
        if size + len(p.text) > budget:
            break
        out.insert(0, p)
        size += len(p.text) + 1
    return [_join(out, "\n" if block.kind == CODE else " ")] if out else []


def chunk_document(doc: Document, target_chars: int = TARGET_CHARS, max_chars: int = MAX_CHARS,
                   overlap_chars: int = OVERLAP_CHARS) -> list[Chunk]:
    """Pack a document's blocks into overlapping chunks (see the module doc)."""
    if not 0 <= overlap_chars < target_chars <= max_chars:
        raise ValueError(f"need 0 <= overlap ({overlap_chars}) < target ({target_chars}) <= max ({max_chars})")
    chunks: list[Chunk] = []
    heading = ""
    for page, page_blocks in groupby(doc.blocks, key=lambda b: b.page):
        cur: list[Block] = []  # blocks of the chunk being built
        n_new = 0  # how many of them are new (not overlap from the previous chunk)
        cur_heading = heading
        for big in page_blocks:
            if big.kind == HEADING:
                heading = big.text.strip()[:200]
            for block in _split_large(big, max_chars):
                size = sum(len(b.text) + 2 for b in cur)
                if n_new and size + len(block.text) > target_chars:
                    last = cur[-1]
                    if last.kind == HEADING and n_new > 1:
                        # a heading belongs with what follows it: it opens the next chunk
                        chunks.append(_make_chunk(cur[:-1], page, cur_heading))
                        cur, n_new = [last], 1
                        cur_heading = last.text.strip()[:200]
                    elif last.kind != HEADING:
                        chunks.append(_make_chunk(cur, page, cur_heading))
                        carry = _tail(last, overlap_chars)
                        if sum(len(b.text) for b in carry) + len(block.text) > max_chars:
                            carry = []
                        cur, n_new = carry, 0
                if n_new == 0:
                    cur_heading = heading
                cur.append(block)
                n_new += 1
        if n_new:
            chunks.append(_make_chunk(cur, page, cur_heading))
    return chunks


def _make_chunk(blocks: list[Block], page: int | None, heading: str) -> Chunk:
    return Chunk("\n\n".join(b.text for b in blocks), page, min(b.line_start for b in blocks),
                 max(b.line_end for b in blocks), heading)
