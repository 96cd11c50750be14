"""The transformer hyperparameters every GGUF that gguf_tools writes carries.

llama.cpp reads them as `<arch>.<key>`; the synthetic pairs, the shaped
header-only files and the distilled drafter's export all write the same set.
"""

from __future__ import annotations

import gguf


def add_transformer_header(w: gguf.GGUFWriter, *, n_ctx: int, n_embd: int, n_layer: int, n_ff: int,
                           n_head: int, n_head_kv: int | list[int], head_dim: int, rms_eps: float = 1e-6) -> None:
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(rms_eps)
