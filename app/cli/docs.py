"""`flashdesk docs ...`: document collections from the command line.

    flashdesk docs add PATH... [--collection NAME] [--embedding-model GGUF] [--json]
    flashdesk docs update [--collection NAME] [--json]     re-scan the roots (resume, pick up changes)
    flashdesk docs ask "QUESTION" [--collection NAME]... [--json] [--k 5] [--mode auto|fts|hybrid]
    flashdesk docs list [--json]
    flashdesk docs files [--collection NAME] [--json]
    flashdesk docs remove --collection NAME

Every command takes --db (default: documents.sqlite3 in the FlashDesk data folder).
Progress goes to stderr, one line per file; --json results go to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from pathlib import Path

from app.cli.common import add_model_args, open_engine
from app.documents.answer import answer_question
from app.documents.embedding import EmbeddingModel
from app.documents.index import DocumentIndex, default_db_path
from app.documents.indexer import OUT_UNCHANGED, FileEvent, Indexer, IndexProgress
from app.documents.retrieve import Retriever
from app.engine.controller import policy_for_mode
from app.engine.params import GenerationParams
from app.errors import FlashDeskError

DEFAULT_COLLECTION = "default"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `docs` and its subcommands to the flashdesk parser."""
    docs = subparsers.add_parser("docs", help="offline document Q&A: collections, indexing, questions")
    sub = docs.add_subparsers(dest="docs_cmd", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--db", help=f"document database (default {default_db_path()})")

    a = sub.add_parser("add", help="add files or folders to a collection and index them")
    common(a)
    a.add_argument("paths", nargs="+", metavar="PATH")
    a.add_argument("--collection", default=DEFAULT_COLLECTION)
    a.add_argument("--embedding-model", help="GGUF embedding model for hybrid retrieval (optional)")
    a.add_argument("--json", action="store_true", help="print the run summary as JSON")
    a.set_defaults(func=cmd_add)

    u = sub.add_parser("update", help="re-scan a collection's folders: resume, re-index changed files")
    common(u)
    u.add_argument("--collection", default=DEFAULT_COLLECTION)
    u.add_argument("--json", action="store_true")
    u.set_defaults(func=cmd_update)

    q = sub.add_parser("ask", help="answer a question from one or more collections, with sources")
    common(q)
    add_model_args(q)
    q.add_argument("question")
    q.add_argument("--collection", action="append", help="collection to search (repeatable; default: default)")
    q.add_argument("--k", type=int, default=5, help="chunks to retrieve (default 5)")
    q.add_argument("--mode", default="auto", choices=("auto", "fts", "hybrid"))
    q.add_argument("--max-tokens", type=int, default=128)
    q.add_argument("--no-spec", action="store_true", help="plain decoding (no speculation)")
    q.add_argument("--json", action="store_true")
    q.set_defaults(func=cmd_ask)

    ls = sub.add_parser("list", help="collections and their state")
    common(ls)
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)

    f = sub.add_parser("files", help="the files of a collection with their state and errors")
    common(f)
    f.add_argument("--collection", default=DEFAULT_COLLECTION)
    f.add_argument("--json", action="store_true")
    f.set_defaults(func=cmd_files)

    r = sub.add_parser("remove", help="delete a collection from the index (the files stay)")
    common(r)
    r.add_argument("--collection", required=True)
    r.set_defaults(func=cmd_remove)


def _open_index(args: argparse.Namespace) -> DocumentIndex:
    return DocumentIndex(Path(args.db) if args.db else default_db_path())


def _load_embedder(path: str | None) -> EmbeddingModel | None:
    if not path:
        return None
    return EmbeddingModel(path)


def _print_progress(p: IndexProgress, ev: FileEvent | None) -> None:
    if ev is None:
        if p.state == "indexing" and p.files_done == 0:
            print(f"indexing {p.files_total} files ({p.bytes_total / 1e6:.1f} MB) into {p.collection!r}",
                  file=sys.stderr, flush=True)
        return
    if ev.outcome == OUT_UNCHANGED:
        detail = ""
    elif ev.reason:
        detail = f": {ev.reason}"
    else:
        detail = f" ({ev.n_chunks} chunks)"
    print(f"[{p.files_done}/{p.files_total}] {ev.outcome} {ev.path}{detail}", file=sys.stderr, flush=True)


def _run_index(index: DocumentIndex, collection: str, embedder: object | None, as_json: bool) -> int:
    cancel = threading.Event()
    try:
        prog = Indexer(index, embedder).run(collection, cancel, _print_progress)
    except KeyboardInterrupt:
        # the file being indexed rolls back; everything committed stays, `update` resumes
        print("interrupted: run `flashdesk docs update` to resume", file=sys.stderr)
        return 130
    if as_json:
        print(json.dumps(prog.to_dict()))
    else:
        print(f"{prog.state}: {prog.n_indexed} indexed, {prog.n_unchanged} unchanged, {prog.n_skipped} skipped, "
              f"{prog.n_failed} failed, {prog.n_removed} removed in {prog.elapsed_s:.1f} s "
              f"({prog.to_dict()['mb_per_s']} MB/s, {prog.to_dict()['pages_per_s']} PDF pages/s)",
              file=sys.stderr)
    return 0


def cmd_add(args: argparse.Namespace) -> int:
    missing = [p for p in args.paths if not Path(p).exists()]
    if missing:
        raise FlashDeskError("not found: " + ", ".join(missing))
    with _open_index(args) as index:
        embedder = _load_embedder(args.embedding_model)
        cid = index.ensure_collection(args.collection)
        index.add_roots(cid, args.paths)
        if embedder is None:
            embedder = _load_embedder(index.collection_info(args.collection).embedding_model)
        return _run_index(index, args.collection, embedder, args.json)


def cmd_update(args: argparse.Namespace) -> int:
    with _open_index(args) as index:
        embedder = _load_embedder(index.collection_info(args.collection).embedding_model)
        return _run_index(index, args.collection, embedder, args.json)


def cmd_ask(args: argparse.Namespace) -> int:

    collections = args.collection or [DEFAULT_COLLECTION]
    params = GenerationParams(max_tokens=args.max_tokens, speculative=not args.no_spec)
    params.validate()  # before anything loads
    with _open_index(args) as index:
        embedder = None
        if args.mode != "fts":
            models = {index.collection_info(c).embedding_model for c in collections} - {None}
            embedder = _load_embedder(sorted(models)[0]) if models else None
        engine = open_engine(args)
        try:
            on_text = None if args.json else (lambda t: print(t, end="", flush=True))
            policy = policy_for_mode(engine, "plain" if args.no_spec else "hybrid")
            ans = answer_question(engine, Retriever(index, embedder), args.question, collections, k=args.k,
                                  mode=args.mode, params=params, policy=policy, on_text=on_text)
        finally:
            engine.close()
    if args.json:
        out = ans.to_dict()
        out["draft_mode"] = "plain" if args.no_spec else "hybrid"
        print(json.dumps(out))
        return 0
    if not ans.sources:
        print(ans.text)
    print("\n\nSources:")
    for s in ans.sources:
        print(f"  {s.label()}  {s.file}  (score {s.score:.4f})")
    g = ans.generation
    if g:
        print(f"[{g.get('n_generated')} tokens, {g.get('tokens_per_s')} tok/s, tau {g.get('tau')}]", file=sys.stderr)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    with _open_index(args) as index:
        infos = index.collections()
    if args.json:
        print(json.dumps([i.to_dict() for i in infos]))
        return 0
    if not infos:
        print("no collections yet: flashdesk docs add PATH --collection NAME")
    for i in infos:
        print(f"{i.name}: {i.n_files} files ({i.n_indexed} indexed, {i.n_pending} pending, {i.n_skipped} skipped, "
              f"{i.n_failed} failed), {i.n_chunks} chunks, {i.n_vectors} vectors")
        for r in i.roots:
            print(f"    {r}")
    return 0


def cmd_files(args: argparse.Namespace) -> int:
    with _open_index(args) as index:
        files = index.files(index.collection_id(args.collection))
    if args.json:
        print(json.dumps([f.to_dict() for f in files]))
        return 0
    for f in files:
        print(f"{f.state:8} {f.n_chunks:5} {f.path}" + (f"  ({f.error})" if f.error else ""))
    return 0


def cmd_remove(args: argparse.Namespace) -> int:
    with _open_index(args) as index:
        index.remove_collection(args.collection)
    print(f"removed collection {args.collection!r}", file=sys.stderr)
    return 0
