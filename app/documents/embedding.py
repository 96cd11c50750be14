"""A GGUF embedding model through llama.cpp in embedding mode (optional: the
user picks one; FTS5 alone works without it).

The model and its context are the engine's owner classes (header checks,
clear errors), with embeddings on and a pooling layer. A model whose GGUF
names no pooling type (a plain decoder LLM used as an embedder) gets mean
pooling.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from app.engine.llama_objects import ContextConfig, LlamaContext, LlamaModel, TokenBatch
from app.errors import ModelLoadError


def model_id(path: str | Path) -> str:
    """What identifies an embedding model in stored vectors: file name, size and
    a hash of its first MiB (vectors of different models are not comparable)."""
    p = Path(path).expanduser()
    h = hashlib.sha256()
    with open(p, "rb") as f:
        h.update(f.read(1 << 20))
    return f"{p.name}:{p.stat().st_size}:{h.hexdigest()[:16]}"


class EmbeddingModel:
    """Texts -> L2-normalised vectors (one sequence per decode: simple, and any model works)."""

    def __init__(self, path: str | Path, n_ctx: int = 512, n_threads: int = 0):
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise ModelLoadError(f"{self.path}: embedding model not found")
        self.id = model_id(self.path)
        self.model = LlamaModel(self.path)
        self.ctx: LlamaContext | None = None
        self._batch: TokenBatch | None = None
        n_ctx = min(n_ctx, self.model.n_ctx_train) if self.model.n_ctx_train > 0 else n_ctx
        has_pooling = self.model.meta(f"{self.model.arch}.pooling_type") is not None
        try:
            # pooling needs a whole sequence in one ubatch
            self.ctx = LlamaContext(self.model, ContextConfig(n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                                                              n_threads=n_threads, embeddings=True,
                                                              mean_pooling=not has_pooling))
        except ModelLoadError:
            self.model.close()
            raise
        if not self.ctx.pools_sequences:
            self.close()
            raise ModelLoadError(f"{self.path}: this model does not produce sentence embeddings")
        self.n_ctx = self.ctx.n_ctx
        self.dim = int(self.ctx.pooled_embedding_dim)
        self._batch = TokenBatch(self.n_ctx)

    def embed(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dim) float32, each row of unit length (cosine = dot product)."""
        assert self.ctx is not None and self._batch is not None
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            toks = self.model.tokenize(text, add_special=True, parse_special=False)[: self.n_ctx]
            if not toks:
                continue
            self.ctx.clear()
            self._batch.set(toks, 0, True)
            self.ctx.decode(self._batch)
            v = self.ctx.pooled_embedding(0)
            norm = float(np.linalg.norm(v))
            out[i] = v / norm if norm > 0 and np.isfinite(norm) else 0.0
        return out

    def close(self) -> None:
        if self._batch is not None:
            self._batch.close()
            self._batch = None
        if self.ctx is not None:
            self.ctx.close()
            self.ctx = None
        if getattr(self, "model", None) is not None:
            self.model.close()

    def __del__(self) -> None:
        self.close()
