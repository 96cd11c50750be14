"""Teacher-forced distillation data: the target's labels over offline text, one prefill per window.

Where generate.py decodes a reply token by token, this reads existing text (app.distill.offline_text:
Python sources, Debian's documentation and man pages) in windows of `window` tokens, each window one
decode with every row an output: the taps give the hidden states of every token, the logits the
target's top-K (and so its argmax) at every position. A window is stored as a sequence whose
"response" starts after its first token (n_prompt = 1) and whose kind is "text-code" or "text-prose":
training reads the target's argmax at each position as the label (what the target would write after
that prefix), not the text's own next token.

Resumable in chunks: documents are visited in a fixed order, shards are flushed only between
documents, and meta.json records how many documents are done; `stop_after_s` ends a run after the
document it is in.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.distill.corpus import HumanEvalGuard
from app.distill.dataset import TEXT_KINDS
from app.distill.offline_text import OfflineDocument, read_document
from app.distill.shards import ShardWriter, add_seconds, data_meta, to_bf16, topk_rows
from app.engine.llama_objects import ContextConfig, LlamaContext, LlamaModel, ModelPlacement, TokenBatch


@dataclass
class LabelConfig:
    tap_layers: list[int]
    window: int = 256  # tokens per window, the first one BOS
    max_windows_per_doc: int = 4  # a long file would otherwise fill the data with one style
    # a document shorter than a window gives one window of what it has, if it has this many tokens (long
    # windows teach the drafter far context; the documents that fill them are fewer)
    min_tokens: int = 255
    top_k_store: int = 32
    shard_size: int = 64  # windows per shard (a shard is flushed between documents)
    n_threads: int = 0


def label_text(target: Path, docs: list[OfflineDocument], out_dir: Path, cfg: LabelConfig,
               progress: Callable[[str], None] | None = None, stop_after_s: float | None = None,
               guard: HumanEvalGuard | None = None, placement: ModelPlacement | None = None) -> dict:
    """Label the documents not yet done in out_dir; returns counts and throughput (`placement`: as
    generate_dataset's)."""
    model = LlamaModel(target, placement)
    writer = ShardWriter(out_dir, data_meta(target, cfg.tap_layers, model.n_embd, model.n_vocab, cfg.top_k_store),
                         cfg.shard_size)
    meta_file = out_dir / "meta.json"
    meta = json.loads(meta_file.read_text())
    if meta.setdefault("label_window", cfg.window) != cfg.window:  # a window's id names its span
        raise ValueError(f"{out_dir} was labelled in windows of {meta['label_window']} tokens, not {cfg.window}: "
                         "resume with that window or label into another work folder")
    meta_file.write_text(json.dumps(meta, indent=2))
    start_doc = meta.get("docs_done", 0)
    done = writer.done_ids()  # windows of documents a killed run wrote before it could count them
    guard = guard or HumanEvalGuard(bench_sets=True)
    ctx = LlamaContext(model, ContextConfig(n_ctx=cfg.window, n_batch=cfg.window, n_ubatch=cfg.window,
                                            n_threads=cfg.n_threads))
    ctx.enable_taps(cfg.tap_layers)
    batch = TokenBatch(cfg.window)
    bos = [model.bos] if model.add_bos() else []
    t0 = time.time()
    n_tok = n_win = n_guarded = 0
    t_decode = 0.0
    last_report = 0.0
    d = start_doc
    for d in range(start_doc, len(docs)):
        if stop_after_s is not None and time.time() - t0 >= stop_after_s:
            break
        doc = docs[d]
        text = read_document(doc)
        if text is not None:
            toks = model.tokenize(text, add_special=False, parse_special=False)
            step = cfg.window - len(bos)
            n_full = len(toks) // step
            n_windows = n_full or int(len(toks) >= min(step, cfg.min_tokens))
            for w in range(min(cfg.max_windows_per_doc, n_windows)):
                win = bos + toks[w * step:(w + 1) * step]
                if f"{doc.id}#{w}" in done:
                    continue
                if guard.overlaps(model.detokenize(win)):
                    n_guarded += 1
                    continue
                ctx.clear()
                batch.set(win, 0, True)
                t1 = time.time()
                ctx.decode(batch)
                t_decode += time.time() - t1
                feats = to_bf16(ctx.taps(len(win)))
                ids, vals = topk_rows(ctx.logits_rows(len(win))[:-1], cfg.top_k_store)
                vals = vals.astype(np.float16)
                writer.add({"id": f"{doc.id}#{w}", "kind": TEXT_KINDS[doc.kind == "prose"], "greedy": False,
                            "n_prompt": 1, "tokens": win, "features": feats[:-1], "topk_ids": ids,
                            "topk_logits": vals})
                n_win += 1
                n_tok += len(win) - 1
        if len(writer.pending) >= cfg.shard_size:
            _flush(writer, meta_file, d + 1)
        now = time.time()
        if progress and now - last_report > 30:
            last_report = now
            progress(f"{d + 1}/{len(docs)} documents, {n_win} windows, {n_tok} labelled tokens, "
                     f"{n_tok / (now - t0):.0f} tok/s ({n_tok / max(t_decode, 1e-9):.0f} in decode)")
    else:
        d = len(docs)
    _flush(writer, meta_file, d)
    ctx.close()
    model.close()
    dt = time.time() - t0
    add_seconds(out_dir, "labelling_seconds", dt)
    return {"documents_done": d, "documents": len(docs), "windows": n_win, "windows_guarded": n_guarded,
            "labelled_tokens": n_tok, "seconds": round(dt, 1), "tokens_per_s": round(n_tok / dt, 1) if dt else 0.0,
            "decode_tokens_per_s": round(n_tok / t_decode, 1) if t_decode else 0.0}


def _flush(writer: ShardWriter, meta_file: Path, docs_done: int) -> None:
    """The shard first, then the count: a run killed between them visits those documents again and
    skips the windows the shard holds."""
    writer.flush()
    m = json.loads(meta_file.read_text())
    m["docs_done"] = docs_done
    meta_file.write_text(json.dumps(m, indent=2))
