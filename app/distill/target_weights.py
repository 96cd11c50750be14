"""Read (and dequantize) a target's tensors as float32 numpy arrays."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf.quants import dequantize


class TargetWeights:
    """Lazy access to a GGUF's tensors by name, dequantized to float32 with
    the same kernels' reference code (gguf-py), shaped [rows, cols] = torch's
    Linear layout (out_features, in_features)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._reader = gguf.GGUFReader(str(self.path))
        self._by_name = {t.name: t for t in self._reader.tensors}

    def has(self, name: str) -> bool:
        return name in self._by_name

    def get(self, name: str) -> np.ndarray:
        t = self._by_name.get(name)
        if t is None:
            raise KeyError(f"{self.path}: no tensor {name!r}")
        a = dequantize(t.data, t.tensor_type)
        a = np.ascontiguousarray(a, dtype=np.float32)
        return a if a.flags.writeable else a.copy()  # F32 tensors come back as read-only views of the file

    def integers(self, name: str) -> np.ndarray:
        """An integer tensor (a drafter's d2t), as int64."""
        t = self._by_name.get(name)
        if t is None:
            raise KeyError(f"{self.path}: no tensor {name!r}")
        return np.array(t.data, dtype=np.int64).reshape(-1)

    def token_embd(self) -> np.ndarray:
        return self.get("token_embd.weight")

    def output_head(self) -> np.ndarray:
        """The LM head (tied to the embeddings when the file has no output.weight)."""
        return self.get("output.weight") if self.has("output.weight") else self.token_embd()
