"""Distillation data on disk, shared by both sources (generate.py: the target's own replies;
teacher_forced.py: the target's labels over offline text).

A shard is one .npz of finished sequences, written atomically; `meta.json` names the target
(a hash of its first MiB) and the tap layers, so that data of another target is never mixed in.
Features are bfloat16 bits (Gemma's residual stream exceeds float16's 65504 at the tapped
layers); logits are kept as the top-K (ids + float16 values) of each labelled position.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch


def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), round to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)



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


def topk_rows(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k ids (int32) and values (float32) of each row of a (rows, n_vocab) float32 array, best
    first; torch's topk runs on every core (numpy's argpartition on one: 16 rows of 262k logits
    took longer than the 16-token decode that made them)."""
    v, i = torch.topk(torch.from_numpy(np.ascontiguousarray(logits)), k, dim=1, sorted=True)
    return i.numpy().astype(np.int32), v.numpy()


def data_meta(target: Path, tap_layers: list[int], n_embd: int, n_vocab: int, top_k: int) -> dict:
    """What a data folder is for: written by its first run, checked by every later one."""
    h = hashlib.sha256()
    with open(target, "rb") as f:
        h.update(f.read(1 << 20))
    return {"target": str(target), "target_sha": h.hexdigest(), "tap_layers": tap_layers, "n_embd": n_embd,
            "top_k": top_k, "n_vocab": n_vocab}


def add_seconds(out_dir: Path, key: str, seconds: float) -> None:
    """Adds a run's time to meta.json (the total over resumed runs, for the model card)."""
    meta_file = out_dir / "meta.json"
    m = json.loads(meta_file.read_text())
    m[key] = round(m.get(key, 0.0) + seconds, 1)
    meta_file.write_text(json.dumps(m, indent=2))
