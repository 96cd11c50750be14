"""The target's replies as tokens only: the part of the distillation data that outlives a machine.

A data folder (generate.py) keeps each reply's tapped features and top-K logits, ~6 KB a token with
the bundled target's five taps: too large for anything but the machine that made it, and new machines
started with none (stop 48's 717k labelled tokens and stop 49's 953k were lost that way). The tokens
compress to under a byte each. `write_reply_tokens` saves a folder's sequences (id, kind, greedy or
sampled, prompt length, tokens) to one compressed .npz small enough for the repository
(assets/distill/replies/); `relabel_replies` rebuilds a data folder from such a file with the target:
one pass over each prompt (its last row's logits the only ones output) and one over each of its
replies with every row an output (the replies of a prompt share its pass), so the same features and
top-K that generation stored, at a prefill's rate instead of decoding's.

Resumable as the other sources are: sequences already in the folder's shards are skipped and
`stop_after_s` ends a run between prompts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.distill.generate import SIBLING
from app.distill.shards import ShardWriter, add_seconds, data_meta, to_bf16, topk_rows
from app.engine.llama_objects import ContextConfig, LlamaContext, LlamaModel, ModelPlacement, TokenBatch

FORMAT = 1  # the file's layout; a reader of another refuses it by name
BATCH = 512  # rows a decode takes (a longer prompt is read in several)


@dataclass
class RelabelConfig:
    tap_layers: list[int]
    top_k_store: int = 32
    shard_size: int = 64
    n_threads: int = 0


def write_reply_tokens(data_dir: Path, out_file: Path) -> dict:
    """Every sequence of `data_dir`'s shards, tokens only, to `out_file` (written atomically)."""
    meta_file = data_dir / "meta.json"
    shards = sorted(data_dir.glob("shard-*.npz"))
    if not meta_file.exists() or not shards:
        raise ValueError(f"{data_dir}: no generated replies to write")
    meta = json.loads(meta_file.read_text())
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("prompt_ids", "kinds", "greedy", "n_prompt", "lengths",
                                                          "tokens")}
    for s in shards:
        with np.load(s) as z:  # one array at a time: the features are never read
            for k in cols:
                cols[k].append(z[k])
    arrays = {k: np.concatenate(v) for k, v in cols.items()}
    arrays["tokens"] = arrays["tokens"].astype(np.int32)
    header = {"format": FORMAT, "target": Path(meta["target"]).name, "target_sha": meta["target_sha"],
              "n_vocab": meta["n_vocab"], "generation_seconds": meta.get("generation_seconds")}
    out_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_file.with_name(out_file.name + ".tmp.npz")
    np.savez_compressed(tmp, header=np.array(json.dumps(header)), **arrays)
    tmp.rename(out_file)
    n_reply = int((arrays["lengths"] - arrays["n_prompt"]).sum())
    return {"sequences": len(arrays["lengths"]), "reply_tokens": n_reply, "tokens": int(arrays["lengths"].sum()),
            "bytes": out_file.stat().st_size, "file": str(out_file)}


@dataclass
class Reply:
    id: str
    kind: str
    greedy: bool
    tokens: list[int]
    n_prompt: int


def read_reply_tokens(path: Path, target_sha: str | None = None) -> list[Reply]:
    """A file's sequences; with `target_sha`, a file of another target is refused."""
    try:
        z = np.load(path)
        header = json.loads(str(z["header"]))
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{path}: not a reply-tokens file ({e})") from None
    if header.get("format") != FORMAT:
        raise ValueError(f"{path}: reply-tokens format {header.get('format')}, this version reads {FORMAT}")
    if target_sha is not None and header["target_sha"] != target_sha:
        raise ValueError(f"{path}: replies of another target ({header['target']}), not this one")
    ends = np.cumsum(z["lengths"])
    toks = z["tokens"]
    return [Reply(str(i), str(k), bool(g), toks[e - n:e].tolist(), int(p))
            for i, k, g, p, n, e in zip(z["prompt_ids"], z["kinds"], z["greedy"], z["n_prompt"], z["lengths"], ends)]


def relabel_replies(target: Path, file: Path, out_dir: Path, cfg: RelabelConfig,
                    progress: Callable[[str], None] | None = None, stop_after_s: float | None = None,
                    placement: ModelPlacement | None = None) -> dict:
    """The sequences of `file` not yet in `out_dir`, read by the target into its shards; returns
    counts and throughput."""
    model = LlamaModel(target, placement)
    meta = data_meta(target, cfg.tap_layers, model.n_embd, model.n_vocab, cfg.top_k_store)
    replies = read_reply_tokens(file, meta["target_sha"])
    writer = ShardWriter(out_dir, meta, cfg.shard_size)
    done = writer.done_ids()
    groups: dict[str, list[Reply]] = {}  # a prompt's replies, in their order (the first, then "~2", ...)
    for r in replies:
        if r.id not in done:
            groups.setdefault(r.id.split(SIBLING)[0], []).append(r)
    if progress:
        progress(f"{len(replies)} replies in {file.name}, {len(replies) - sum(map(len, groups.values()))} "
                 f"already in {out_dir}, {len(groups)} prompts to read")
    n_ctx = max((len(r.tokens) for g in groups.values() for r in g), default=1)
    ctx = LlamaContext(model, ContextConfig(n_ctx=n_ctx, n_batch=BATCH, n_ubatch=BATCH, n_threads=cfg.n_threads))
    ctx.enable_taps(cfg.tap_layers)
    batch = TokenBatch(BATCH)
    t0 = time.time()
    n_seq = n_reply = n_rows = 0
    t_decode = 0.0
    last_report = 0.0

    def read(tokens: list[int], pos0: int, every_row: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Decode tokens at pos0..: the features (bf16) of every row, and the top-K of every row
        (`every_row`) or of the last only (a prompt: its other rows' logits are never used, and the
        output layer is the largest matrix of a small target)."""
        nonlocal n_rows, t_decode
        feats, ids, vals = [], [], []
        for i in range(0, len(tokens), BATCH):
            chunk = tokens[i:i + BATCH]
            outs = np.full(len(chunk), every_row)
            outs[-1] |= i + BATCH >= len(tokens)  # a prompt's last row: the reply's first label
            batch.set(chunk, pos0 + i, outs)
            t1 = time.time()
            ctx.decode(batch)
            t_decode += time.time() - t1
            n_rows += len(chunk)
            feats.append(to_bf16(ctx.taps(len(chunk))))
            if outs.any():
                top_i, top_v = topk_rows(ctx.logits_rows(int(outs.sum())), cfg.top_k_store)
                ids.append(top_i)
                vals.append(top_v.astype(np.float16))
        return np.concatenate(feats), np.concatenate(ids), np.concatenate(vals)

    left = len(groups)
    for group in groups.values():
        if stop_after_s is not None and time.time() - t0 >= stop_after_s:
            break
        head: tuple | None = None  # (prompt tokens, their features, the top-K of their last row)
        for r in group:
            prompt = r.tokens[:r.n_prompt]
            # a prompt's siblings share it (checked, not assumed); the previous reply's rows go, the prompt's stay
            if head is None or head[0] != prompt or not ctx.seq_rm(r.n_prompt):
                ctx.clear()
                head = (prompt, *read(prompt, 0, every_row=False))
            _, pf, pi, pv = head
            # the last token is never read (it ended the reply); row j of the top-K predicts
            # tokens[n_prompt + j], the first from the prompt's last row
            if len(r.tokens) > r.n_prompt + 1:
                rf, ri, rv = read(r.tokens[r.n_prompt:-1], r.n_prompt, every_row=True)
            else:
                rf, ri, rv = pf[:0], pi[:0], pv[:0]
            writer.add({"id": r.id, "kind": r.kind, "greedy": r.greedy, "n_prompt": r.n_prompt, "tokens": r.tokens,
                        "features": np.concatenate([pf, rf]), "topk_ids": np.concatenate([pi, ri]),
                        "topk_logits": np.concatenate([pv, rv])})
            n_seq += 1
            n_reply += len(r.tokens) - r.n_prompt
        left -= 1
        now = time.time()
        if progress and now - last_report > 30:
            last_report = now
            rate = n_reply / (now - t0)
            progress(f"{n_seq} replies, {n_reply} reply tokens, {rate:.0f} tok/s ({n_rows / max(t_decode, 1e-9):.0f} "
                     f"rows/s in decode), {left} prompts left")
    writer.flush()
    ctx.close()
    model.close()
    dt = time.time() - t0
    add_seconds(out_dir, "relabelling_seconds", dt)
    return {"sequences": n_seq, "reply_tokens": n_reply, "rows_decoded": n_rows, "prompts_left": left,
            "seconds": round(dt, 1), "tokens_per_s": round(n_reply / dt, 1) if dt else 0.0,
            "decode_rows_per_s": round(n_rows / t_decode, 1) if t_decode else 0.0}
