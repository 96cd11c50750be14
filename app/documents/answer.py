"""Answer a question from retrieved chunks: the chunks go into the prompt with
numbered source labels, as many as fit the context budget (counted in the
model's tokens), and the answer carries its sources (file, page, lines, score).

Speculation stays on: retrieved text is copied into answers a lot, which the
context lookup and the drafter predict well, so acceptance (tau) on these
answers is reported with them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from app.chat.format import ChatMessage, PromptFormat, prompt_format_of, with_format_stops
from app.documents.retrieve import Hit, RetrievalResult, Retriever
from app.engine.params import GenerationParams

if TYPE_CHECKING:
    from app.engine.dflash import Engine
    from app.engine.draft_policy import DraftPolicy

# short on purpose: small base models follow "read, then answer" better than long rules
INSTRUCTIONS = "Read the sources and answer the question from them."
NO_SOURCES = "Nothing in the selected collections matches this question."
_MARGIN_TOKENS = 8  # tokenizing pieces apart may differ by a token or two from the whole


@dataclass
class Source:
    n: int  # the number the prompt labels it with: [n]
    file: str
    name: str
    page: int | None
    line_start: int
    line_end: int
    heading: str
    score: float
    collection: str
    text: str
    cited: bool = False  # the answer mentions [n]

    def label(self) -> str:
        where = f"page {self.page}" if self.page is not None else (
            f"line {self.line_start}" if self.line_start == self.line_end else
            f"lines {self.line_start}-{self.line_end}")
        return f"[{self.n}] {self.name}, {where}"

    def to_dict(self, with_text: bool = False) -> dict:
        d = asdict(self)
        d["score"] = round(self.score, 6)
        if not with_text:
            d.pop("text")
        return d

    @classmethod
    def from_hit(cls, n: int, hit: Hit, text: str | None = None) -> Source:
        c = hit.chunk
        return cls(n, c.path, c.name, c.page, c.line_start, c.line_end, c.heading, hit.score, c.collection,
                   c.text if text is None else text)


@dataclass
class Answer:
    question: str
    text: str
    sources: list[Source]
    retrieval: dict
    generation: dict = field(default_factory=dict)
    finish_reason: str | None = None
    prompt_tokens: int = 0

    def to_dict(self) -> dict:
        return {"question": self.question, "answer": self.text,
                "sources": [s.to_dict() for s in self.sources], "retrieval": self.retrieval,
                "generation": self.generation, "finish_reason": self.finish_reason,
                "prompt_tokens": self.prompt_tokens}


def source_block(src: Source) -> str:
    head = src.label() + (f" ({src.heading})" if src.heading else "")
    return f"{head}\n{src.text.strip()}\n\n"


def build_prompt(question: str, hits: Sequence[Hit], count_tokens: Callable[[str], int],
                 budget_tokens: int, render: Callable[[str, str], str],
                 truncate: Callable[[str, int], str] | None = None) -> tuple[str, list[Source]]:
    """The prompt and the sources in it. Hits are taken best first while they
    fit `budget_tokens` (the prompt's whole size, instructions and question
    included); one that does not fit is passed over for smaller ones after it.
    `render(sources_text, question)` lays out the final prompt."""
    room = budget_tokens - count_tokens(render("", question)) - _MARGIN_TOKENS
    sources: list[Source] = []
    for hit in hits:
        src = Source.from_hit(len(sources) + 1, hit)
        cost = count_tokens(source_block(src))
        if cost > room and not sources and truncate is not None and room > 32:
            # not even the best chunk fits: keep its beginning rather than nothing
            keep = room - count_tokens(source_block(Source.from_hit(1, hit, "")))
            while keep > 0 and cost > room:  # re-tokenizing a cut text can cost a token or two more
                src.text = truncate(hit.chunk.text, keep)
                cost = count_tokens(source_block(src))
                keep -= max(1, cost - room)
        if cost <= room:
            sources.append(src)
            room -= cost
    prompt = render("".join(source_block(s) for s in sources), question)
    while sources and count_tokens(prompt) > budget_tokens:  # the pieces undercounted: drop the last
        sources.pop()
        prompt = render("".join(source_block(s) for s in sources), question)
    return prompt, sources


def conversation_renderer(fmt: PromptFormat, history: Sequence[ChatMessage] = ()) -> Callable[[str, str], str]:
    """`render(sources_text, question)` for a question asked after `history` (a
    system prompt and earlier turns, in order), laid out in `fmt`: what
    build_prompt needs to answer the last message of a chat from documents."""
    system = "\n\n".join(m.content.strip() for m in history if m.role == "system" and m.content.strip())
    turns = [m for m in history if m.role != "system"]
    if fmt.is_plain:
        def render(sources: str, question: str) -> str:
            head = "\n\n".join(x for x in (system, f"{INSTRUCTIONS}\n\n{sources}".rstrip()) if x)
            return fmt.render([ChatMessage("system", head), *turns, ChatMessage("user", question)])
    else:
        # many templates refuse a system turn: the sources go in the (last) user turn
        before = [ChatMessage("system", system)] if system else []

        def render(sources: str, question: str) -> str:
            user = f"{INSTRUCTIONS}\n\nSources:\n\n{sources}Question: {question}"
            return fmt.render([*before, *turns, ChatMessage("user", user)])
    return render


def fit_sources(engine: Engine, question: str, hits: Sequence[Hit], render: Callable[[str, str], str],
                max_tokens: int, budget_tokens: int | None = None) -> tuple[str, list[Source]]:
    """build_prompt with the engine's tokenizer and its context budget: the context
    minus the room the reply may take (or budget_tokens: a prompt of a set size)."""

    def count(text: str) -> int:
        return len(engine.tokenize(text, add_special=False))

    def truncate(text: str, n_tokens: int) -> str:
        return engine.detokenize(engine.tokenize(text, add_special=False)[:max(n_tokens, 0)])

    budget = engine.n_ctx - max_tokens if budget_tokens is None else budget_tokens
    return build_prompt(question, hits, count, budget, render, truncate)


@dataclass
class AnswerPrompt:
    """What answering a question sends to the model: the prompt with the sources that fit, its
    stop strings, and what retrieval found (no prompt when nothing matched)."""
    text: str | None
    sources: list[Source]
    stop: list[str]
    retrieval: dict


def answer_prompt(engine: Engine, retriever: Retriever, question: str, collections: Sequence[str], *,
                  k: int = 5, mode: str = "auto", max_tokens: int = 128,
                  budget_tokens: int | None = None) -> AnswerPrompt:
    """Retrieve, and build the prompt within the context budget (the context minus max_tokens, or
    budget_tokens: a prompt of a set size): the one way a question becomes a prompt (`docs ask`,
    the bench's document Q&A sets)."""
    t0 = time.perf_counter()
    found: RetrievalResult = retriever.search(question, collections, k=k, mode=mode)
    retrieval = found.stats()
    retrieval["collections"] = list(collections)
    fmt = prompt_format_of(engine.target)
    if not found.hits:
        return AnswerPrompt(None, [], list(fmt.stop), retrieval)
    prompt, sources = fit_sources(engine, question, found.hits, conversation_renderer(fmt), max_tokens, budget_tokens)
    retrieval["n_hits"] = len(found.hits)
    retrieval["n_sources_in_prompt"] = len(sources)
    retrieval["t_prompt_s"] = round(time.perf_counter() - t0 - found.t_total_s, 6)
    return AnswerPrompt(prompt, sources, list(fmt.stop), retrieval)


def answer_question(engine: Engine, retriever: Retriever, question: str, collections: Sequence[str], *,
                    k: int = 5, mode: str = "auto", params: GenerationParams | None = None,
                    cancel: threading.Event | None = None, policy: DraftPolicy | None = None,
                    on_text: Callable[[str], None] | None = None) -> Answer:
    """Retrieve, build the prompt within the context budget, generate (speculative with
    `policy`, or the engine's default)."""
    question = question.strip()
    if not question:
        raise ValueError("the question is empty")
    params = params or GenerationParams(max_tokens=128)
    ap = answer_prompt(engine, retriever, question, collections, k=k, mode=mode, max_tokens=params.max_tokens)
    if ap.text is None:
        return Answer(question, NO_SOURCES, [], ap.retrieval, finish_reason="no_sources")
    tokens = engine.tokenize(ap.text)
    gen = GenerationParams(**{**asdict(params), "stop": with_format_stops(ap.stop, params.stop)})
    done = engine.complete(tokens, gen, cancel=cancel, policy=policy, on_text=on_text)
    answer = done.text.strip()
    for s in ap.sources:
        s.cited = f"[{s.n}]" in answer
    return Answer(question, answer, ap.sources, ap.retrieval, done.stats.to_dict(), done.finish_reason, len(tokens))
