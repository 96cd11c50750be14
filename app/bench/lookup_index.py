"""`python -m app.bench.lookup_index`: what indexing a prompt for the context lookup costs, by prompt
length, one token at a time (old: what a speculative reply's first step paid, 124 ms at 16k tokens in
docs/bench/drafter-window-2048.json) and in bulk with numpy (new: at prefill, LookupSource.begin).

The prompts are real text: the first N tokens of the docqa-long documents (app.bench.prompt_sets:
Debian's licences, then Python's language reference) through the target's tokenizer. "old" runs the
one-at-a-time path of today's ContextLookup (bulk_min above N): the same dictionary writes as before
bulk indexing, its entries now tuples where they were lists. Both build the same index
(tests/test_lookup_bulk.py); `same_index` checks it again here.

    python -m app.bench.lookup_index [--target T.gguf] [--lengths 2048,8192,16384,32768] [--reps 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from app.bench.info import emit_result, run_info
from app.bench.prompt_sets import docqa_long_corpus
from app.bundled import default_target
from app.engine.llama_objects import LlamaModel
from app.engine.lookup import BULK_MIN, DEFAULT_MAX_N, ContextLookup

LENGTHS = (2048, 8192, 16384, 32768)
ONE_BY_ONE = 1 << 62  # a bulk_min no history reaches: every position indexed on its own


def document_tokens(model: LlamaModel, n: int) -> list[int]:
    """The first n tokens of the docqa-long documents, each tokenized as plain text, in corpus order."""
    out: list[int] = []
    with tempfile.TemporaryDirectory() as d:
        for f in docqa_long_corpus(Path(d)):
            out += model.tokenize(f.read_text(errors="replace"), add_special=False, parse_special=False)
            if len(out) >= n:
                return out[:n]
    raise ValueError(f"the docqa-long documents have {len(out)} tokens, fewer than {n}")


def time_indexing(tokens: list[int], bulk_min: int, reps: int) -> tuple[float, ContextLookup]:
    """Median seconds to index `tokens` up to its anchor from an empty index, and the last index built."""
    times = []
    lk = ContextLookup()
    for _ in range(reps):
        lk = ContextLookup(bulk_min=bulk_min)
        lk.set_history(tokens)
        t0 = time.perf_counter()
        lk.index_history()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), lk


def measure(target: Path, lengths: list[int], reps: int) -> list[dict]:
    model = LlamaModel(target)
    try:
        tokens = document_tokens(model, max(lengths))
    finally:
        model.close()
    rows = []
    for n in lengths:
        old, a = time_indexing(tokens[:n], ONE_BY_ONE, reps)
        new, b = time_indexing(tokens[:n], BULK_MIN, reps)
        rows.append({"n_tokens": n, "old_ms": round(old * 1e3, 3), "new_ms": round(new * 1e3, 3),
                     "speedup": round(old / new, 2) if new > 0 else None,
                     "same_index": a._last == b._last})  # the two paths built the same index
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.bench.lookup_index", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="target GGUF, for its tokenizer (default: the bundled Gemma 3 270M)")
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="prompt lengths in tokens")
    ap.add_argument("--reps", type=int, default=5, help="indexings per length and path (the median is kept)")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args(argv)
    target = Path(args.target) if args.target else default_target()
    lengths = [int(x) for x in args.lengths.split(",")]
    out = {"run": run_info(), "target": str(target), "max_n": DEFAULT_MAX_N, "bulk_min": BULK_MIN,
           "reps": args.reps, "tokens_from": "the docqa-long documents (Debian's licences, Python's reference)",
           "by_length": measure(target, lengths, args.reps)}
    return emit_result(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
