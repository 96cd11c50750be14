"""A GGUF embedding model through llama.cpp in embedding mode (optional: the
user picks one; FTS5 alone works without it).

The model is loaded with the engine's LlamaModel (header checks, clear
errors); the context is our own because it runs with embeddings on and a
pooling layer. A model whose GGUF names no pooling type (a plain decoder
LLM used as an embedder) gets mean pooling.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from pathlib import Path

import numpy as np

from app.engine.llama_objects import LlamaModel, TokenBatch
from app.errors import GenerationError, ModelLoadError
from native import lib

lc = lib.load()


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
        n_ctx = min(n_ctx, self.model.n_ctx_train) if self.model.n_ctx_train > 0 else n_ctx
        cp = lc.llama_context_default_params()
        cp.n_ctx = n_ctx
        # pooling needs a whole sequence in one ubatch
        cp.n_batch = n_ctx
        cp.n_ubatch = n_ctx
        cp.n_seq_max = 1
        threads = n_threads or os.cpu_count() or 2
        cp.n_threads = threads
        cp.n_threads_batch = threads
        cp.embeddings = True
        cp.no_perf = True
        has_pooling = self.model.meta(f"{self.model.arch}.pooling_type") is not None
        cp.pooling_type = lc.LLAMA_POOLING_TYPE_UNSPECIFIED if has_pooling else lc.LLAMA_POOLING_TYPE_MEAN
        self.ctx = lc.llama_init_from_model(self.model.ptr, cp)
        if not self.ctx:
            self.model.close()
            raise ModelLoadError(f"{self.path}: llama.cpp could not create an embedding context (n_ctx={n_ctx})")
        pooling = lc.llama_pooling_type(self.ctx)
        if pooling in (lc.LLAMA_POOLING_TYPE_NONE, lc.LLAMA_POOLING_TYPE_RANK):
            self.close()
            raise ModelLoadError(f"{self.path}: this model does not produce sentence embeddings "
                                 f"(pooling type {pooling})")
        self.n_ctx = lc.llama_n_ctx(self.ctx)
        self.dim = lc.llama_model_n_embd_out(self.model.ptr) or self.model.n_embd
        self.mem = lc.llama_get_memory(self.ctx)
        self._batch = TokenBatch(self.n_ctx)

    def embed(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dim) float32, each row of unit length (cosine = dot product)."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            toks = self.model.tokenize(text, add_special=True, parse_special=False)[: self.n_ctx]
            if not toks:
                continue
            if self.mem:
                lc.llama_memory_clear(self.mem, True)
            self._batch.set(toks, 0, True)
            rc = lc.llama_decode(self.ctx, self._batch.batch)
            if rc != 0:
                raise GenerationError(f"{self.path}: embedding decode failed with code {rc}")
            p = lc.llama_get_embeddings_seq(self.ctx, 0)
            if not p:
                raise GenerationError(f"{self.path}: llama.cpp returned no pooled embedding")
            v = np.ctypeslib.as_array(ctypes.cast(p, ctypes.POINTER(ctypes.c_float)), shape=(self.dim,)).copy()
            norm = float(np.linalg.norm(v))
            out[i] = v / norm if norm > 0 and np.isfinite(norm) else 0.0
        return out

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            self._batch.close()
            self._batch = None
        if getattr(self, "ctx", None):
            lc.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None) is not None:
            self.model.close()

    def __del__(self) -> None:
        self.close()
