"""Offline document Q&A: ingest files, chunk them, index them in SQLite (FTS5 +
optional embedding vectors), retrieve by hybrid rank fusion, answer with sources.

    ingest.py     read one file (PDF, DOCX, HTML, Markdown, text, code) into blocks
    chunking.py   blocks -> overlapping chunks that keep file, page and line range
    index.py      the SQLite database: collections, files, chunks, FTS5, vectors
    embedding.py  a GGUF embedding model through llama.cpp in embedding mode
    indexer.py    the (background) indexing run: progress, cancel, resume, skip-unchanged
    retrieve.py   BM25 + vector search fused by reciprocal rank fusion
    answer.py     the prompt with labelled sources within a token budget, the answer
    open_at.py    the command that opens a source file at its page or line
    cli.py        `flashdesk docs ...`

Nothing here knows about Qt; app/ui/documents_panel.py wraps it.
"""
