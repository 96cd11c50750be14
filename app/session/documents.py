"""A chat's document collections: retrieval for the message being answered, and
the prompt with its numbered sources within the context budget.

The layout and the token budget are app.documents.answer's (the same prompt
`flashdesk docs ask` builds), applied to the whole conversation: the earlier
turns stay, the sources go with the last user message. Qt-free.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.chat.format import ChatMessage, PromptFormat
from app.documents.answer import Source, conversation_renderer, fit_sources
from app.documents.index import DocumentIndex, default_db_path
from app.documents.retrieve import Retriever

DEFAULT_K = 5  # chunks retrieved per question: enough to cover, few enough to fit small contexts


@dataclass
class GroundedPrompt:
    """The prompt text and what retrieval put into it."""
    text: str
    sources: list[Source] = field(default_factory=list)
    retrieval: dict = field(default_factory=dict)  # RetrievalResult.stats() plus what the prompt kept


class ChatDocuments:
    """The documents index a ChatSession retrieves from, opened on first use in the
    thread that uses it (an SQLite connection stays in its thread)."""

    def __init__(self, db_path: str | Path | None = None, k: int = DEFAULT_K):
        self.db_path = Path(db_path) if db_path else default_db_path()
        self.k = k
        self._index: DocumentIndex | None = None

    def close(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None

    def prompt(self, engine: object, fmt: PromptFormat, messages: Sequence[ChatMessage],
               collections: Sequence[str], max_tokens: int) -> GroundedPrompt:
        """The conversation `messages` (ending with the user message to answer) as a prompt with the
        sources retrieved for that message from `collections`, fitted to `engine`'s context minus
        `max_tokens`. Collections no longer in the index are skipped (and noted); no match at all
        gives the conversation's own prompt."""
        t0 = time.perf_counter()
        question = messages[-1].content
        retrieval: dict = {"collections": list(collections), "notes": []}
        index = self._open()
        known = set(index.collection_names()) if index is not None else set()
        usable = [c for c in collections if c in known]
        missing = [c for c in collections if c not in known]
        if missing:
            retrieval["notes"].append("not in the documents index (removed?): " + ", ".join(missing))
        if not usable:
            retrieval.update(n_hits=0, n_sources_in_prompt=0)
            return GroundedPrompt(fmt.render(list(messages)), [], retrieval)
        found = Retriever(index).search(question, usable, k=self.k, mode="fts")
        retrieval.update({k: v for k, v in found.stats().items() if k != "notes"})
        retrieval["notes"] += found.notes
        if any(index.collection_info(c).embedding_model for c in usable):
            retrieval["notes"].append("searched by keywords only (chats do not load embedding models)")
        retrieval["n_hits"] = len(found.hits)
        if not found.hits:
            retrieval["n_sources_in_prompt"] = 0
            return GroundedPrompt(fmt.render(list(messages)), [], retrieval)
        render = conversation_renderer(fmt, messages[:-1])
        text, sources = fit_sources(engine, question, found.hits, render, max_tokens)
        retrieval["n_sources_in_prompt"] = len(sources)
        retrieval["t_prompt_s"] = round(time.perf_counter() - t0 - found.t_total_s, 6)
        return GroundedPrompt(text, sources, retrieval)

    def _open(self) -> DocumentIndex | None:
        # a missing file means no collection was ever indexed: do not create one just to find that out
        if self._index is None and self.db_path.exists():
            self._index = DocumentIndex(self.db_path)
        return self._index
