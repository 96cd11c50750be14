"""The distillation dataset on disk: generated shards packed for training.

`pack()` turns the shards of generate.py into one folder of flat arrays:
features of the chosen tap layers as a bfloat16 memmap (read lazily: the
whole set is several GB), tokens, per-sequence offsets, and the top-K
target logits of response positions. `DistillData` serves sequences from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# kinds of sequences labelled over offline text (app.distill.teacher_forced): code, prose
TEXT_KINDS = ("text-code", "text-prose")


@dataclass
class Sequence:
    index: int
    kind: str
    greedy: bool
    tokens: np.ndarray  # [L] int
    n_prompt: int
    features: np.ndarray  # [L-1, n_taps*n_embd] bfloat16 bits (uint16), memmap slice
    topk_ids: np.ndarray  # [L-n_prompt, K]: row j predicts tokens[n_prompt + j]
    topk_logits: np.ndarray


def pack(data_dirs: Path | list[Path], out_dir: Path, tap_layers: list[int]) -> Path:
    """Select `tap_layers` (a subset of those generated) of one or more data folders of the same
    target (the replies of generate.py, the labelled text of teacher_forced.py) into flat arrays."""
    dirs = _dirs(data_dirs)
    metas = [json.loads((d / "meta.json").read_text()) for d in dirs]
    if len({m["target_sha"] for m in metas}) > 1:
        raise ValueError(f"{', '.join(map(str, dirs))}: data of different targets")
    meta = metas[0]
    shards, cols_of = [], {}
    for d, m in zip(dirs, metas):
        have = m["tap_layers"]
        missing = [lid for lid in tap_layers if lid not in have]
        if missing:
            raise ValueError(f"{d} has taps {have}; layers {missing} were not generated")
        n_embd = m["n_embd"]
        cols = np.concatenate([np.arange(have.index(lid) * n_embd, (have.index(lid) + 1) * n_embd)
                               for lid in tap_layers])
        for s in sorted(d.glob("shard-*.npz")):
            shards.append(s)
            cols_of[s] = cols
    if not shards:
        raise ValueError(f"{', '.join(map(str, dirs))}: no generated shards")
    total_feat = 0
    total_tok = 0
    total_resp = 0
    for s in shards:
        with np.load(s) as z:
            total_feat += z["features"].shape[0]
            total_tok += z["tokens"].shape[0]
            total_resp += z["topk_ids"].shape[0]
    out_dir.mkdir(parents=True, exist_ok=True)
    feats = np.lib.format.open_memmap(out_dir / "features.npy", mode="w+", dtype=np.uint16,
                                      shape=(total_feat, len(tap_layers) * meta["n_embd"]))
    tokens, lengths, n_prompt, kinds, greedy, topk_ids, topk_logits, ids = [], [], [], [], [], [], [], []
    f0 = 0
    for s in shards:
        with np.load(s) as z:
            f = z["features"]
            feats[f0:f0 + f.shape[0]] = f[:, cols_of[s]]
            f0 += f.shape[0]
            tokens.append(z["tokens"])
            lengths.append(z["lengths"])
            n_prompt.append(z["n_prompt"])
            kinds.append(z["kinds"])
            greedy.append(z["greedy"])
            topk_ids.append(z["topk_ids"])
            topk_logits.append(z["topk_logits"])
            ids.append(z["prompt_ids"])
    feats.flush()
    np.savez(out_dir / "index.npz", tokens=np.concatenate(tokens), lengths=np.concatenate(lengths),
             n_prompt=np.concatenate(n_prompt), kinds=np.concatenate(kinds), greedy=np.concatenate(greedy),
             topk_ids=np.concatenate(topk_ids), topk_logits=np.concatenate(topk_logits),
             prompt_ids=np.concatenate(ids))
    (out_dir / "meta.json").write_text(json.dumps({**meta, "tap_layers": tap_layers, "source": [str(d) for d in dirs],
                                                   "shards": _shard_list(dirs)}))
    return out_dir


def packed_data(data_dirs: Path | list[Path], out_dir: Path, tap_layers: list[int],
                progress=print) -> DistillData:
    """The packed set of `data_dirs`, packed again when their shards changed since (a resumed
    generation added some): training never reads a stale pack."""
    meta_file = out_dir / "meta.json"
    fresh = (out_dir / "index.npz").exists() and meta_file.exists() and \
        json.loads(meta_file.read_text()).get("shards") == _shard_list(_dirs(data_dirs))
    if not fresh:
        progress(f"packing taps {tap_layers} of {', '.join(map(str, _dirs(data_dirs)))} into {out_dir}")
        pack(data_dirs, out_dir, tap_layers)
    return DistillData(out_dir)


def _dirs(data_dirs: Path | list[Path]) -> list[Path]:
    return [data_dirs] if isinstance(data_dirs, Path) else list(data_dirs)


def _shard_list(dirs: list[Path]) -> list[list]:
    """What a pack was made from: every shard's name and size (shards are written once, atomically)."""
    return [[str(s), s.stat().st_size] for d in dirs for s in sorted(d.glob("shard-*.npz"))]


class DistillData:
    def __init__(self, packed: Path):
        self.meta = json.loads((packed / "meta.json").read_text())
        self.features = np.load(packed / "features.npy", mmap_mode="r")
        z = np.load(packed / "index.npz")
        self.tokens = z["tokens"]
        self.lengths = z["lengths"]
        self.n_prompt = z["n_prompt"]
        self.kinds = z["kinds"]
        self.greedy = z["greedy"]
        self.topk_ids = z["topk_ids"]
        self.topk_logits = z["topk_logits"]
        self.prompt_ids = z["prompt_ids"]
        self.tok_off = np.concatenate([[0], np.cumsum(self.lengths)])
        self.feat_off = np.concatenate([[0], np.cumsum(self.lengths - 1)])
        resp = self.lengths - self.n_prompt
        self.resp_off = np.concatenate([[0], np.cumsum(resp)])

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> Sequence:
        return Sequence(
            index=i, kind=str(self.kinds[i]), greedy=bool(self.greedy[i]),
            tokens=self.tokens[self.tok_off[i]:self.tok_off[i + 1]],
            n_prompt=int(self.n_prompt[i]),
            features=self.features[self.feat_off[i]:self.feat_off[i + 1]],
            topk_ids=self.topk_ids[self.resp_off[i]:self.resp_off[i + 1]],
            topk_logits=self.topk_logits[self.resp_off[i]:self.resp_off[i + 1]],
        )

    def response_token_counts(self, n_vocab: int) -> np.ndarray:
        """How often each token id appears in responses (for the draft vocabulary)."""
        counts = np.zeros(n_vocab, dtype=np.int64)
        for i in range(len(self)):
            t = self.tokens[self.tok_off[i] + self.n_prompt[i]:self.tok_off[i + 1]]
            np.add.at(counts, t, 1)
        return counts
