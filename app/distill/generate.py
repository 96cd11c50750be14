"""Self-distillation data: the target writes its own responses.

Many prompts are decoded in parallel in one llama.cpp context (one sequence
each, several sequences per batch: a 16-token batch costs about 5 single
decodes on a CPU, so 16 sequences give ~3x the tokens per second). Every
token the target reads leaves its hidden states at the tap layers (the
taps return a row per batch entry) and every token it predicts leaves its
top-K logits. A finished sequence is appended to the current shard; shards
are written atomically and a restart skips the prompts already done.

Storage (why): features are stored once, as bfloat16 (Gemma's residual
stream exceeds float16's 65504 at the tapped layers; bfloat16 keeps the
range at half the size of float32), because recomputing them every epoch
would cost a full target prefill per epoch, the slowest part on a CPU.
Logits are kept as the top-K (ids + float16 values) of each response
position: enough for soft-label distillation at 1/4000 of the full size.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.distill.corpus import CorpusPrompt
from app.engine.llama_objects import ContextConfig, LlamaContext, LlamaModel, TokenBatch
from app.engine.params import GenerationParams
from app.engine.sampling import TokenSampler


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), round to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


@dataclass
class GenConfig:
    tap_layers: list[int]
    n_parallel: int = 16
    max_new_tokens: int = 160
    max_prompt_tokens: int = 384
    greedy_fraction: float = 0.75
    temperature: float = 0.8
    top_k_store: int = 32
    shard_size: int = 64  # sequences per shard
    seed: int = 0
    n_threads: int = 0


@dataclass
class _Slot:
    prompt: CorpusPrompt
    tokens: list[int]
    n_prompt: int
    fed: int = 0  # tokens already decoded (their K/V is in the cache)
    feats: list[np.ndarray] = field(default_factory=list)
    topk_ids: list[np.ndarray] = field(default_factory=list)
    topk_logits: list[np.ndarray] = field(default_factory=list)
    sampler: TokenSampler | None = None
    text: str = ""
    done: bool = False


class ShardWriter:
    """Collects finished sequences and writes them as .npz shards."""

    def __init__(self, out_dir: Path, meta: dict, shard_size: int):
        self.out_dir = out_dir
        self.shard_size = shard_size
        out_dir.mkdir(parents=True, exist_ok=True)
        meta_file = out_dir / "meta.json"
        if meta_file.exists():
            old = json.loads(meta_file.read_text())
            if old.get("tap_layers") != meta["tap_layers"] or old.get("target_sha") != meta["target_sha"]:
                raise ValueError(f"{out_dir} holds data for another target or other tap layers; use a new folder")
        else:
            meta_file.write_text(json.dumps(meta, indent=2))
        self.pending: list[dict] = []
        self.n_shards = len(list(out_dir.glob("shard-*.npz")))

    def done_ids(self) -> set[str]:
        ids: set[str] = set()
        for p in sorted(self.out_dir.glob("shard-*.npz")):
            with np.load(p) as z:
                ids.update(z["prompt_ids"].tolist())
        return ids

    def add(self, rec: dict) -> None:
        self.pending.append(rec)
        if len(self.pending) >= self.shard_size:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        recs = self.pending
        lens = np.array([len(r["tokens"]) for r in recs], dtype=np.int64)
        resp = np.array([len(r["topk_ids"]) for r in recs], dtype=np.int64)
        arrays = {
            "prompt_ids": np.array([r["id"] for r in recs]),
            "kinds": np.array([r["kind"] for r in recs]),
            "greedy": np.array([r["greedy"] for r in recs], dtype=bool),
            "n_prompt": np.array([r["n_prompt"] for r in recs], dtype=np.int64),
            "lengths": lens,
            "tokens": np.concatenate([np.asarray(r["tokens"], dtype=np.int32) for r in recs]),
            # features for every token but the last of each sequence (it is never fed)
            "features": np.concatenate([r["features"] for r in recs]),
            "resp_lengths": resp,
            "topk_ids": np.concatenate([r["topk_ids"] for r in recs]),
            "topk_logits": np.concatenate([r["topk_logits"] for r in recs]),
        }
        name = self.out_dir / f"shard-{self.n_shards:05d}.npz"
        tmp = name.with_suffix(".tmp.npz")
        np.savez(tmp, **arrays)
        tmp.rename(name)  # atomic: a killed run never leaves half a shard
        self.n_shards += 1
        self.pending = []


def _topk(row: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    idx = np.argpartition(-row, k - 1)[:k]
    order = np.argsort(-row[idx], kind="stable")
    idx = idx[order]
    return idx.astype(np.int32), row[idx].astype(np.float16)


def generate_dataset(target: Path, prompts: list[CorpusPrompt], out_dir: Path, cfg: GenConfig,
                     progress: Callable[[str], None] | None = None) -> dict:
    """Decode every prompt not yet in out_dir; returns counts and throughput."""
    import hashlib

    model = LlamaModel(target)
    h = hashlib.sha256()
    with open(target, "rb") as f:
        h.update(f.read(1 << 20))
    meta = {"target": str(target), "target_sha": h.hexdigest(), "tap_layers": cfg.tap_layers,
            "n_embd": model.n_embd, "top_k": cfg.top_k_store, "n_vocab": model.n_vocab}
    writer = ShardWriter(out_dir, meta, cfg.shard_size)
    done = writer.done_ids()
    todo = [p for p in prompts if p.id not in done]
    if progress:
        progress(f"{len(done)} prompts already done, {len(todo)} to go")
    seq_len = cfg.max_prompt_tokens + cfg.max_new_tokens + 8
    n_batch = 512
    ctx = LlamaContext(model, ContextConfig(n_ctx=seq_len * cfg.n_parallel, n_batch=n_batch, n_ubatch=n_batch,
                                            n_threads=cfg.n_threads, n_seq_max=cfg.n_parallel, kv_unified=True))
    ctx.enable_taps(cfg.tap_layers)
    batch = TokenBatch(n_batch)
    rng = np.random.default_rng(cfg.seed)
    slots: list[_Slot | None] = [None] * cfg.n_parallel
    queue = list(todo)
    t0 = time.time()
    n_tok = n_seq = 0
    last_report = 0.0

    def start(i: int) -> None:
        while queue:
            p = queue.pop(0)
            toks = model.tokenize(p.text, add_special=True, parse_special=True)
            if len(toks) > cfg.max_prompt_tokens:
                continue
            greedy = rng.random() < cfg.greedy_fraction
            sampler = None if greedy else TokenSampler(GenerationParams(
                temperature=cfg.temperature, top_k=40, top_p=0.95, seed=int(rng.integers(1 << 31))))
            ctx.seq_rm(-1, -1, seq=i)
            slots[i] = _Slot(p, toks, len(toks), sampler=sampler)
            return
        slots[i] = None

    for i in range(cfg.n_parallel):
        start(i)
    while any(s is not None for s in slots):
        # one batch: pending prompt tokens of new sequences, the last token of the others
        toks, pos, seq, outs, owner = [], [], [], [], []
        budget = n_batch
        for i, s in enumerate(slots):
            if s is None or budget == 0:
                continue
            take = min(len(s.tokens) - s.fed, budget)
            for j in range(take):
                p = s.fed + j
                toks.append(s.tokens[p])
                pos.append(p)
                seq.append(i)
                outs.append(p == len(s.tokens) - 1)
                owner.append((i, p))
            budget -= take
        batch.set_rows(np.array(toks, dtype=np.int32), np.array(pos, dtype=np.int32),
                       np.array(seq, dtype=np.int32), np.array(outs, dtype=np.int8))
        ctx.decode(batch)
        feats = to_bf16(ctx.taps(len(toks)))
        row_of = {}
        for r, (i, p) in enumerate(owner):
            s = slots[i]
            s.feats.append(feats[r:r + 1])
            s.fed = p + 1
            if outs[r]:
                row_of[i] = r
        for i, r in row_of.items():
            s = slots[i]
            logits = ctx.logits_row(r)
            ids, vals = _topk(logits, cfg.top_k_store)
            s.topk_ids.append(ids)
            s.topk_logits.append(vals)
            nxt = int(ids[0]) if s.sampler is None else s.sampler.sample(logits)
            s.tokens.append(nxt)
            n_tok += 1
            s.text += model.token_to_piece(nxt).decode("utf-8", "replace")
            n_new = len(s.tokens) - s.n_prompt
            stop = model.is_eog(nxt) or n_new >= cfg.max_new_tokens
            if s.prompt.format == "chat" and "\nUser:" in s.text:
                stop = True
            if stop:
                writer.add({"id": s.prompt.id, "kind": s.prompt.kind, "greedy": s.sampler is None,
                            "n_prompt": s.n_prompt, "tokens": s.tokens,
                            "features": np.concatenate(s.feats)[:len(s.tokens) - 1],
                            "topk_ids": np.stack(s.topk_ids), "topk_logits": np.stack(s.topk_logits)})
                n_seq += 1
                start(i)
        now = time.time()
        if progress and now - last_report > 30:
            last_report = now
            rate = n_tok / (now - t0)
            left = (len(queue) + sum(s is not None for s in slots)) * 110 / max(rate, 1e-9)
            progress(f"{n_seq}/{len(todo)} sequences, {n_tok} response tokens, {rate:.1f} tok/s, "
                     f"~{left / 60:.0f} min left")
    writer.flush()
    ctx.close()
    model.close()
    dt = time.time() - t0
    # total generation time over resumed runs, for the model card
    meta_file = out_dir / "meta.json"
    m = json.loads(meta_file.read_text())
    m["generation_seconds"] = round(m.get("generation_seconds", 0.0) + dt, 1)
    meta_file.write_text(json.dumps(m, indent=2))
    return {"sequences": n_seq, "response_tokens": n_tok, "seconds": dt, "tokens_per_s": n_tok / dt if dt else 0}
