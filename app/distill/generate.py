"""Self-distillation data: the target writes its own responses.

Many prompts are decoded in parallel in one llama.cpp context (one sequence
each, each in its own KV stream, several sequences per batch: with the
small-batch kernels a 16-token batch costs about 3 single decodes on a CPU).
Every
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

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.distill.corpus import CorpusPrompt
from app.distill.shards import ShardWriter, add_seconds, data_meta, to_bf16, topk_rows
from app.engine.llama_objects import ContextConfig, LlamaContext, LlamaModel, ModelPlacement, TokenBatch
from app.engine.params import GenerationParams
from app.engine.sampling import TokenSampler

SAMPLE_TOP_K = 40  # the sampled replies' top-k
SIBLING = "~"  # a prompt's further replies ("~2", "~3"...): sampled, from a copy of the first one's prompt cache


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
    # replies per prompt: the first, then sampled ones from a copy of its prompt cache (the prompts are as long
    # as the replies: each further reply saves a prefill, the largest share of the rows decoded)
    replies: int = 2


@dataclass
class _Slot:
    prompt: CorpusPrompt
    id: str  # the record's id: the prompt's, or SIBLING and the reply's number after it ("p~2")
    tokens: list[int]
    n_prompt: int
    fed: int = 0  # tokens already decoded (their K/V is in the cache)
    feats: list[np.ndarray] = field(default_factory=list)
    topk_ids: list[np.ndarray] = field(default_factory=list)
    topk_logits: list[np.ndarray] = field(default_factory=list)
    sampler: TokenSampler | None = None
    text: str = ""
    # the prompt's last row (SAMPLE_TOP_K ids, float32 logits) while further replies may still start from it
    first: tuple[np.ndarray, np.ndarray] | None = None
    replies_left: int = 0  # how many


def generate_dataset(target: Path, prompts: list[CorpusPrompt], out_dir: Path, cfg: GenConfig,
                     progress: Callable[[str], None] | None = None, stop_after_s: float | None = None,
                     placement: ModelPlacement | None = None) -> dict:
    """Decode every prompt not yet in out_dir; returns counts and throughput. With `stop_after_s`,
    no sequence starts after that many seconds and the run ends when the running ones finish (a
    chunk: the next run resumes where it stopped). `placement`: where the target's layers go (the
    GPU's: app.distill.pipeline --gpu; default the CPU)."""
    model = LlamaModel(target, placement)
    writer = ShardWriter(out_dir, data_meta(target, cfg.tap_layers, model.n_embd, model.n_vocab, cfg.top_k_store),
                         cfg.shard_size)
    done = writer.done_ids()
    todo = [p for p in prompts if p.id not in done]
    if progress:
        progress(f"{len(done)} prompts already done, {len(todo)} to go")
    seq_len = cfg.max_prompt_tokens + cfg.max_new_tokens + 8
    n_batch = 512
    # one KV stream per sequence (kv_unified off): a row attends over its own sequence's cells, not
    # over every sequence's (in one shared cache each of the 16 rows paid for all 16 contexts)
    ctx = LlamaContext(model, ContextConfig(n_ctx=seq_len * cfg.n_parallel, n_batch=n_batch, n_ubatch=n_batch,
                                            n_threads=cfg.n_threads, n_seq_max=cfg.n_parallel, kv_unified=False))
    ctx.enable_taps(cfg.tap_layers)
    batch = TokenBatch(n_batch)
    rng = np.random.default_rng(cfg.seed)
    slots: list[_Slot | None] = [None] * cfg.n_parallel
    queue = list(todo)
    t0 = time.time()
    n_tok = n_seq = n_steps = n_prompt_fed = n_further = n_copied = 0
    t_decode = 0.0
    last_report = 0.0

    def sampler() -> TokenSampler:
        return TokenSampler(GenerationParams(temperature=cfg.temperature, top_k=SAMPLE_TOP_K, top_p=0.95,
                                             seed=int(rng.integers(1 << 31))))

    def start(i: int) -> None:
        nonlocal n_further, n_copied
        if stop_after_s is not None and time.time() - t0 >= stop_after_s:
            slots[i] = None
            return
        # a further, sampled reply to a prompt another slot has read: its cache is copied, not prefilled again
        # (the slot's own prompt first, when its previous reply just ended: no copy then); the new slot
        # carries the prompt's last row on for the replies still to come
        k = next((k for k in [i, *range(len(slots))] if slots[k] is not None and slots[k].first is not None),
                 None)
        if k is not None:
            src = slots[k]
            first, left = src.first, src.replies_left
            src.first, src.replies_left = None, 0
            if k != i:
                ctx.seq_rm(-1, -1, seq=i)
                ctx.seq_cp(k, i)
                n_copied += 1
            ctx.seq_rm(src.n_prompt, -1, seq=i)
            n_further += 1
            s = _Slot(src.prompt, f"{src.prompt.id}{SIBLING}{cfg.replies - left + 1}", src.tokens[:src.n_prompt],
                      src.n_prompt, fed=src.n_prompt, feats=src.feats[:src.n_prompt], topk_ids=src.topk_ids[:1],
                      topk_logits=src.topk_logits[:1], sampler=sampler(),
                      first=first if left > 1 else None, replies_left=left - 1)
            slots[i] = s
            ids, vals = first
            if _emit(s, int(ids[s.sampler.sample(vals)])):
                finish(i)
            return
        while queue:
            p = queue.pop(0)
            toks = model.tokenize(p.text, add_special=True, parse_special=True)
            if len(toks) > cfg.max_prompt_tokens:
                continue
            greedy = rng.random() < cfg.greedy_fraction
            ctx.seq_rm(-1, -1, seq=i)
            slots[i] = _Slot(p, p.id, toks, len(toks), sampler=None if greedy else sampler())
            return
        slots[i] = None

    def _emit(s: _Slot, nxt: int) -> bool:
        """Append a reply token; True when the reply ends with it."""
        nonlocal n_tok
        s.tokens.append(nxt)
        n_tok += 1
        s.text += model.token_to_piece(nxt).decode("utf-8", "replace")
        n_new = len(s.tokens) - s.n_prompt
        return (model.is_eog(nxt) or n_new >= cfg.max_new_tokens
                or (s.prompt.format == "chat" and "\nUser:" in s.text))

    def finish(i: int) -> None:
        nonlocal n_seq
        s = slots[i]
        writer.add({"id": s.id, "kind": s.prompt.kind, "greedy": s.sampler is None, "n_prompt": s.n_prompt,
                    "tokens": s.tokens, "features": np.concatenate(s.feats)[:len(s.tokens) - 1],
                    "topk_ids": np.stack(s.topk_ids), "topk_logits": np.stack(s.topk_logits)})
        n_seq += 1
        start(i)

    for i in range(cfg.n_parallel):
        start(i)
    while any(s is not None for s in slots):
        # one batch: the last token of the sequences being decoded first, then what fits of the pending
        # prompt tokens of new ones (a long prompt's prefill takes several batches and must not hold the
        # others' replies back meanwhile)
        toks, pos, seq, outs, owner = [], [], [], [], []
        budget = n_batch
        live = [i for i, s in enumerate(slots) if s is not None]
        order = sorted(live, key=lambda i: len(slots[i].tokens) - slots[i].fed > 1)  # stable: decoding first
        for i in order:
            s = slots[i]
            if budget == 0:
                break
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
        t1 = time.time()
        ctx.decode(batch)
        t_decode += time.time() - t1
        n_steps += 1
        n_prompt_fed += len(toks) - sum(outs)
        feats = to_bf16(ctx.taps(len(toks)))
        out_slots = []  # output rows come in batch order
        for r, (i, p) in enumerate(owner):
            s = slots[i]
            s.feats.append(feats[r:r + 1])
            s.fed = p + 1
            if outs[r]:
                out_slots.append(i)
        top_ids, top_vals = topk_rows(ctx.logits_rows(len(out_slots)), max(cfg.top_k_store, SAMPLE_TOP_K))
        for j, i in enumerate(out_slots):
            s = slots[i]
            if not s.topk_ids and cfg.replies > 1:  # the prompt's last row: further replies start here
                s.first = (top_ids[j, :SAMPLE_TOP_K].copy(), top_vals[j, :SAMPLE_TOP_K].copy())
                s.replies_left = cfg.replies - 1
            s.topk_ids.append(top_ids[j, :cfg.top_k_store])
            s.topk_logits.append(top_vals[j, :cfg.top_k_store].astype(np.float16))
            # the sampler's top-k keeps SAMPLE_TOP_K candidates: drawing among the row's best SAMPLE_TOP_K
            # logits is the same draw as over the whole row
            nxt = int(top_ids[j, 0] if s.sampler is None else top_ids[j, s.sampler.sample(top_vals[j, :SAMPLE_TOP_K])])
            if _emit(s, nxt):
                finish(i)
        now = time.time()
        if progress and now - last_report > 30:
            last_report = now
            rate = n_tok / (now - t0)
            # ~105 reply tokens a sequence, cfg.replies sequences a prompt
            left = (cfg.replies * len(queue) + sum(s is not None for s in slots)) * 105 / max(rate, 1e-9)
            progress(f"{n_seq} sequences ({len(todo) - len(queue)}/{len(todo)} prompts), {n_tok} response tokens, "
                     f"{rate:.1f} tok/s, ~{left / 60:.0f} min left")
    writer.flush()
    # where the weights were (llama.cpp's buffers: "CPU", "CUDA0", ...): what a --gpu run really used
    weights = {name: model_b for name, model_b, _, _ in ctx.memory_breakdown() if model_b > 0}
    ctx.close()
    model.close()
    dt = time.time() - t0
    add_seconds(out_dir, "generation_seconds", dt)
    # where the time went: llama_decode (reply rows and prompt rows together) and everything else
    return {"sequences": n_seq, "further_replies": n_further, "further_replies_copied": n_copied,
            "response_tokens": n_tok, "prompt_tokens_decoded": n_prompt_fed,
            "decode_steps": n_steps, "seconds": round(dt, 1), "decode_seconds": round(t_decode, 1),
            "tokens_per_s": round(n_tok / dt, 1) if dt else 0.0, "prompts_left": len(queue),
            "weight_bytes_by_buffer": weights}
