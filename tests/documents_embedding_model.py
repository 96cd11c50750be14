"""A tiny synthetic GGUF embedding model for the hybrid retrieval tests.

A 1-layer `llama` model whose attention and MLP write nothing (zero output
projections), so each token's hidden state is its own embedding; llama.cpp
RMS-normalises it and mean-pools over the text. The vocabulary holds whole
words (with every "▁"-prefix on the way to them, which SentencePiece-style
merging needs) and single characters; a word and its capitalised form share
one random vector. The result is a bag-of-words sentence embedding: cosine
similarity follows word overlap, so vector search finds real matches, through
llama.cpp's real embedding path.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import gguf
import numpy as np

_SPECIALS = ["<unk>", "<s>", "</s>"]
_CHARS = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,:;!?'\"-_/()=#*+<>[]{}~%&@$|")


def write_bow_embedding_model(path: Path, words: Iterable[str], dim: int = 256, seed: int = 0) -> Path:
    """Write the model to `path`; `words` are the whole words it knows."""
    # all 256 byte pieces: SentencePiece falls back to them for unknown characters
    vocab: list[str] = _SPECIALS + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581"] + _CHARS
    word_row: dict[str, int] = {}
    prefixes: set[str] = set()
    for w in sorted({w.lower() for w in words if re.fullmatch(r"[A-Za-z0-9]+", w)}):
        for form in (w, w.capitalize(), w.upper()):
            piece = "\u2581" + form
            for i in range(2, len(piece)):
                prefixes.add(piece[:i])
            word_row[piece] = -1
    index = {p: i for i, p in enumerate(vocab)}
    for p in sorted(prefixes | set(word_row)):
        if p not in index:
            index[p] = len(vocab)
            vocab.append(p)
    rng = np.random.default_rng(seed)
    emb = rng.standard_normal((len(vocab), dim)).astype(np.float32)
    emb[index["<s>"]] = 0.0  # BOS adds nothing to the mean's direction
    for piece in word_row:  # a word and its capitalised forms share one vector
        emb[index[piece]] = emb[index["\u2581" + piece[1:].lower()]]

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("flashdesk tiny bag-of-words embedder")
    w.add_context_length(2048)
    w.add_embedding_length(dim)
    w.add_block_count(1)
    w.add_feed_forward_length(dim)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_key_length(dim // 4)
    w.add_value_length(dim // 4)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(dim // 4)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_pooling_type(gguf.PoolingType.MEAN)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(vocab)
    # longer pieces win merges: whole words beat their prefixes
    w.add_token_scores([float(len(p)) if i >= len(_SPECIALS) + 256 else 0.0 for i, p in enumerate(vocab)])
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256
    w.add_token_types(types + [gguf.TokenType.NORMAL] * (len(vocab) - len(types)))
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_tensor("token_embd.weight", emb)
    w.add_tensor("output_norm.weight", np.ones(dim, dtype=np.float32))
    p = "blk.0."
    w.add_tensor(p + "attn_norm.weight", np.ones(dim, dtype=np.float32))
    w.add_tensor(p + "ffn_norm.weight", np.ones(dim, dtype=np.float32))
    for name in ("attn_q", "attn_k", "attn_v"):
        w.add_tensor(p + name + ".weight", (rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32))
    w.add_tensor(p + "attn_output.weight", np.zeros((dim, dim), dtype=np.float32))
    w.add_tensor(p + "ffn_gate.weight", (rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32))
    w.add_tensor(p + "ffn_up.weight", (rng.standard_normal((dim, dim)) / np.sqrt(dim)).astype(np.float32))
    w.add_tensor(p + "ffn_down.weight", np.zeros((dim, dim), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
