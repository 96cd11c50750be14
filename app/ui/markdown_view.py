"""Model output as rich text for QTextBrowser: Markdown with highlighted code blocks.

The text is untrusted: raw HTML in it is escaped (markdown-it with html
off), links are shown but only our own copy: links act. Code blocks get
Pygments colours as inline styles (Qt's rich text has no stylesheet
classes) and a "Copy" link whose href indexes the block's raw text.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name, guess_lexer
from pygments.util import ClassNotFound

COPY_SCHEME = "copy"
DRAFTED_BG = "#c8ecc8"  # background of text from accepted drafts
_FORMATTER = HtmlFormatter(noclasses=True, nowrap=True, style="default")


@dataclass
class RenderedText:
    html: str
    code_blocks: list[str] = field(default_factory=list)  # raw code, indexed by the copy:N links


def _lexer(lang: str, code: str):  # noqa: ANN202
    try:
        if lang:
            return get_lexer_by_name(lang)
        return guess_lexer(code) if len(code) > 40 else TextLexer()
    except ClassNotFound:
        return TextLexer()


def render_markdown(text: str) -> RenderedText:
    """Markdown -> Qt rich text; fenced and indented code blocks are highlighted with a copy link."""
    blocks: list[str] = []
    md = MarkdownIt("commonmark", {"html": False, "breaks": True}).enable(["table", "strikethrough"])

    def code_block(code: str, lang: str) -> str:
        n = len(blocks)
        blocks.append(code)
        body = highlight(code, _lexer(lang, code), _FORMATTER)
        label = html.escape(lang or "code")
        return (f'<table width="100%" cellspacing="0" cellpadding="6" style="background-color:#f6f8fa;">'
                f'<tr><td><span style="color:#57606a;">{label}</span> &nbsp; '
                f'<a href="{COPY_SCHEME}:{n}">Copy</a></td></tr>'
                f'<tr><td><pre style="margin:0;">{body}</pre></td></tr></table>')

    def fence(_renderer, tokens, idx, options, env) -> str:  # noqa: ANN001 - bound as a renderer method
        tok = tokens[idx]
        lang = tok.info.strip().split()[0] if tok.info.strip() else ""
        return code_block(tok.content, lang)

    def indented(_renderer, tokens, idx, options, env) -> str:  # noqa: ANN001
        return code_block(tokens[idx].content, "")

    md.add_render_rule("fence", fence)
    md.add_render_rule("code_block", indented)
    return RenderedText(md.render(text), blocks)


def render_drafted(text: str, spans: list[list[int]]) -> RenderedText:
    """Plain text with the characters that came from accepted drafts highlighted."""
    out, pos = [], 0
    for start, end in sorted((max(0, s), min(len(text), e)) for s, e in spans):
        if start < pos or start >= end:
            continue
        out.append(html.escape(text[pos:start]))
        out.append(f'<span style="background-color:{DRAFTED_BG};">{html.escape(text[start:end])}</span>')
        pos = end
    out.append(html.escape(text[pos:]))
    return RenderedText(f'<p style="white-space:pre-wrap;">{"".join(out)}</p>')
