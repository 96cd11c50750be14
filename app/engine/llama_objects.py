"""Small owners of llama.cpp objects: a model, a context, two batch kinds.

Each class checks the pointer it gets, frees it in close() (idempotent) and
in __del__, and exposes only what the engine uses. The raw C API comes from
native.lib (bound on first use); nothing else in FlashDesk calls llama.cpp
directly.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.engine.params import InvalidParams
from app.errors import GenerationError, ModelLoadError
from gguf_tools.errors import excerpt
from gguf_tools.reader import read_gguf
from gguf_tools.validate import check_model
from native.api import ext
from native.api import llama as lc


@dataclass
class ModelPlacement:
    """How a model's layers are placed (app.scheduler fills this in)."""
    n_gpu_layers: int = 0
    split_mode: int = 0  # LLAMA_SPLIT_MODE_NONE / LAYER / ROW
    main_gpu: int = 0
    tensor_split: list[float] = field(default_factory=list)
    devices: list[int] = field(default_factory=list)  # ggml_backend_dev_t handles; empty = default


class LlamaModel:
    """A loaded GGUF model."""

    def __init__(self, path: str | Path, placement: ModelPlacement | None = None,
                 progress: Callable[[float], bool] | None = None, with_mtp: bool = False):
        """`with_mtp`: load the MTP (nextn) heads the file carries too (an MTP context runs them)."""
        self.path = Path(path).expanduser()
        # the header check gives clear errors (missing, truncated, corrupt, values llama.cpp would assert
        # on) before llama.cpp sees the file
        self.info = check_model(read_gguf(self.path))
        placement = placement or ModelPlacement()
        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = placement.n_gpu_layers
        mp.split_mode = placement.split_mode
        mp.main_gpu = placement.main_gpu
        mp.load_mtp = with_mtp
        self._keep: list[object] = []
        if placement.tensor_split:
            ts = (ctypes.c_float * 128)(*placement.tensor_split)
            self._keep.append(ts)
            mp.tensor_split = ts
        if placement.devices:
            devs = (ctypes.c_void_p * (len(placement.devices) + 1))(*placement.devices, None)
            self._keep.append(devs)
            mp.devices = ctypes.cast(devs, ctypes.c_void_p)
        if progress is not None:
            @lc.llama_progress_callback
            def _cb(p: float, _user: ctypes.c_void_p) -> bool:
                return bool(progress(p))
            self._keep.append(_cb)
            mp.progress_callback = _cb
        self.ptr = lc.llama_model_load_from_file(str(self.path).encode(), mp)
        if not self.ptr:
            raise ModelLoadError(f"{self.path}: llama.cpp could not load this model "
                                 f"(architecture {excerpt(self.info.arch)}; unsupported, corrupt, or cancelled)")
        self.vocab = lc.llama_model_get_vocab(self.ptr)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        self.n_embd = lc.llama_model_n_embd(self.ptr)
        self.n_embd_out = lc.llama_model_n_embd_out(self.ptr)  # a nextn row's width
        self.n_mtp_heads = lc.llama_model_n_layer_nextn(self.ptr) if with_mtp else 0
        self.n_layer = lc.llama_model_n_layer(self.ptr)
        self.n_ctx_train = lc.llama_model_n_ctx_train(self.ptr)
        self.n_swa = lc.llama_model_n_swa(self.ptr)
        # a recurrent state (Mamba, gated delta net, short convolutions: Qwen3.5/3.6, LFM2, Nemotron-H)
        # cannot drop its last tokens the way a KV cache can: it rolls back from snapshots, if any
        self.recurrent = bool(lc.llama_model_is_recurrent(self.ptr) or lc.llama_model_is_hybrid(self.ptr))
        self.arch = self.info.arch

    # --- tokens -------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8", "replace")  # a lone surrogate (undecodable input) becomes "?"
        cap = len(data) + 16
        buf = (lc.llama_token * cap)()
        n = ext.flashdesk_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0 and n != ext.TOKENIZE_FAILED:
            cap = -n
            buf = (lc.llama_token * cap)()
            n = ext.flashdesk_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n == ext.TOKENIZE_FAILED:  # (a vocabulary without byte pieces for a character: llama.cpp threw)
            raise InvalidParams(f"{self.path.name}: its tokenizer cannot encode this text "
                                f"({excerpt(text)}): a character it has no token or byte piece for")
        return list(buf[:n])

    def tokenize_prompt(self, text: str, add_special: bool = True) -> list[int]:
        """A prompt's tokens, where only the prompt format's own markup can become special tokens.

        A PromptText (app.chat.format) marks which parts are the format's markup: the control-token
        strings found there become those tokens, and everything else (the messages, documents,
        sources, and every plain str) is tokenized as plain text, so a user's `<end_of_turn>` is
        text. The text between special tokens is tokenized piece by piece, as llama.cpp does itself
        when it parses special tokens, so a conversation without such strings in its content gets
        the same tokens as whole-string parsing would give it."""
        segments = getattr(text, "segments", None)
        if not segments or not any(markup for _, markup in segments):
            return self.tokenize(str(text), add_special, parse_special=False)
        pattern, ids = self._control_tokens()
        pieces: list[tuple[str, int | None]] = []  # (plain text, None) or (its text, a control token)
        plain: list[str] = []
        for seg, markup in segments:
            pos = 0
            if markup and pattern is not None:
                for m in pattern.finditer(seg):
                    plain.append(seg[pos:m.start()])
                    pieces.append(("".join(plain), None))
                    pieces.append((m.group(0), ids[m.group(0)]))
                    plain, pos = [], m.end()
            plain.append(seg[pos:])
        pieces.append(("".join(plain), None))
        if all(tid is None for _, tid in pieces):
            return self.tokenize(str(text), add_special, parse_special=False)
        out: list[int] = [self.bos] if add_special and self.add_bos() else []
        for piece, tid in pieces:
            if tid is not None:
                out.append(tid)
            elif piece:
                out += self.tokenize(piece, add_special=False, parse_special=False)
        if add_special and lc.llama_vocab_get_add_eos(self.vocab):
            out.append(lc.llama_vocab_eos(self.vocab))
        return out

    def _control_tokens(self) -> tuple[re.Pattern[str] | None, dict[str, int]]:
        """The strings that special-token parsing turns into control tokens (llama.cpp: tokens with
        the CONTROL or UNKNOWN attribute, longest first), as one pattern; computed once."""
        cached = getattr(self, "_control_cache", None)
        if cached is None:
            ids: dict[str, int] = {}
            special = 1 << 3 | 1 << 0  # LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_UNKNOWN
            for tid in range(self.n_vocab):
                if lc.llama_vocab_get_attr(self.vocab, tid) & special:
                    raw = lc.llama_vocab_get_text(self.vocab, tid)
                    piece = raw.decode("utf-8", "replace") if raw else ""
                    if piece:
                        ids.setdefault(piece, tid)
            texts = sorted(ids, key=len, reverse=True)
            pattern = re.compile("|".join(map(re.escape, texts))) if texts else None
            cached = self._control_cache = (pattern, ids)
        return cached

    def token_to_piece(self, token: int, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = lc.llama_token_to_piece(self.vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lc.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: list[int], special: bool = False) -> str:
        return b"".join(self.token_to_piece(t, special) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(lc.llama_vocab_is_eog(self.vocab, token))

    @property
    def bos(self) -> int:
        return lc.llama_vocab_bos(self.vocab)

    def add_bos(self) -> bool:
        return bool(lc.llama_vocab_get_add_bos(self.vocab))

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = lc.llama_model_meta_val_str(self.ptr, key.encode(), buf, 4096)
        if n < 0:
            return None
        if n >= 4096:
            buf = ctypes.create_string_buffer(n + 1)
            lc.llama_model_meta_val_str(self.ptr, key.encode(), buf, n + 1)
        return buf.value.decode("utf-8", "replace")

    def chat_template(self) -> str | None:
        t = lc.llama_model_chat_template(self.ptr, None)
        return t.decode("utf-8", "replace") if t else None

    def target_layers(self) -> list[int]:
        return ext.target_layers(self.ptr)

    def mask_token(self) -> int:
        m = lc.llama_vocab_mask(self.vocab)
        if m < 0:
            v = self.meta("tokenizer.ggml.mask_token_id")
            m = int(v) if v is not None else -1
        return m

    def device_names(self) -> list[str]:
        n = ext.flashdesk_model_n_devices(self.ptr)
        return [(ext.flashdesk_model_device_name(self.ptr, i) or b"?").decode() for i in range(n)]

    def close(self) -> None:
        if getattr(self, "ptr", None):
            lc.llama_model_free(self.ptr)
            self.ptr = None

    def __del__(self) -> None:
        self.close()


# llama_token_data as numpy lays it out: (id int32, logit float, p float)
_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])


class LlamaGrammar:
    """llama.cpp's grammar sampler over a model's vocabulary: which tokens the GBNF grammar allows
    next, advanced token by token. Accept only tokens it allows: llama.cpp aborts on any other."""

    def __init__(self, model: LlamaModel, gbnf: str, root: str = "root", _ptr: object = None):
        self.model = model
        self.ptr = _ptr if _ptr is not None else lc.llama_sampler_init_grammar(model.vocab, gbnf.encode(),
                                                                                root.encode())
        if not self.ptr:
            raise InvalidParams("grammar: llama.cpp could not parse it (see the server's log)", "grammar")
        self._one = np.zeros(1, _TOKEN_DATA)
        self._all: np.ndarray | None = None  # the whole vocabulary, made on the first mask()

    def _apply(self, data: np.ndarray) -> None:
        arr = lc.llama_token_data_array(data.ctypes.data_as(lc.llama_token_data_p), len(data), -1, False)
        lc.llama_sampler_apply(self.ptr, ctypes.byref(arr))

    def allows(self, token: int) -> bool:
        self._one[0] = (token, 0.0, 0.0)
        self._apply(self._one)
        return bool(np.isfinite(self._one["logit"][0]))

    def mask(self, logits: np.ndarray) -> None:
        """Set the logits of every token the grammar refuses here to -inf (in place; one row)."""
        if self._all is None:
            self._all = np.zeros(self.model.n_vocab, _TOKEN_DATA)
            self._all["id"] = np.arange(self.model.n_vocab, dtype=np.int32)
        self._all["logit"] = logits
        self._apply(self._all)
        logits[:] = self._all["logit"]

    def accept(self, token: int) -> None:
        lc.llama_sampler_accept(self.ptr, token)

    def fork(self) -> LlamaGrammar:
        """An independent copy in the same state (for looking ahead through drafts)."""
        return LlamaGrammar(self.model, "", _ptr=lc.llama_sampler_clone(self.ptr))

    def close(self) -> None:
        if getattr(self, "ptr", None):
            lc.llama_sampler_free(self.ptr)
            self.ptr = None

    def __del__(self) -> None:
        self.close()


@dataclass
class ContextConfig:
    n_ctx: int = 4096
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int = 0  # 0: all cores
    type_k: int | None = None  # ggml type ids; None: llama.cpp default (f16)
    type_v: int | None = None
    flash_attn: int = -1  # auto
    swa_full: bool = False
    non_causal: bool = False
    n_seq_max: int = 1  # >1 only for batch jobs (dataset generation)
    kv_unified: bool = False
    embeddings: bool = False  # a pooled sentence embedding per sequence instead of logits (documents)
    mean_pooling: bool = False  # with embeddings: mean pooling where the model names no pooling type
    # > 0: the context can take greedy tokens from llama.cpp's backend sampling (use_backend_greedy),
    # for decodes of at most this many output rows (llama.cpp's n_outputs_max_per_seq)
    backend_greedy_rows: int = 0
    # a recurrent model's snapshots per sequence: how many of its last tokens seq_rm can take back (a
    # verify's rejected drafts); llama.cpp keeps 0 for architectures that cannot roll back
    n_rs_seq: int = 0
    # an MTP context: the model's MTP (nextn) head instead of its trunk (the model loaded with_mtp)
    mtp: bool = False


class LlamaContext:
    """A decoding context on one model (sequence 0 only)."""

    def __init__(self, model: LlamaModel, cfg: ContextConfig, other: LlamaContext | None = None):
        self.model = model
        self.cfg = cfg
        cp = lc.llama_context_default_params()
        cp.n_ctx = cfg.n_ctx
        cp.n_batch = cfg.n_batch
        cp.n_ubatch = cfg.n_ubatch
        cp.n_seq_max = cfg.n_seq_max
        cp.kv_unified = cfg.kv_unified
        threads = cfg.n_threads or os.cpu_count() or 2
        cp.n_threads = threads
        cp.n_threads_batch = threads
        cp.embeddings = cfg.embeddings
        if cfg.embeddings:
            cp.pooling_type = lc.LLAMA_POOLING_TYPE_MEAN if cfg.mean_pooling else lc.LLAMA_POOLING_TYPE_UNSPECIFIED
        cp.flash_attn_type = cfg.flash_attn
        cp.swa_full = cfg.swa_full
        cp.no_perf = True
        if cfg.type_k is not None:
            cp.type_k = cfg.type_k
        if cfg.type_v is not None:
            cp.type_v = cfg.type_v
        cp.n_rs_seq = cfg.n_rs_seq
        if other is not None:
            cp.ctx_other = other.ptr
            cp.n_rs_seq = 0
        if cfg.backend_greedy_rows > 0:
            cp.n_outputs_max_per_seq = cfg.backend_greedy_rows
        if cfg.mtp:
            cp.ctx_type = lc.LLAMA_CONTEXT_TYPE_MTP
        self.ptr = lc.llama_init_from_model(model.ptr, cp)
        if not self.ptr:
            raise ModelLoadError(f"{model.path}: llama.cpp could not create a context "
                                 f"(n_ctx={cfg.n_ctx}; out of memory?)")
        if cfg.non_causal:
            lc.llama_set_causal_attn(self.ptr, False)
        self.n_ctx = lc.llama_n_ctx(self.ptr)
        # what llama.cpp made of the batch size (it clamps it to the context asked for): a decode
        # of more tokens than this aborts the process
        self.n_batch = lc.llama_n_batch(self.ptr)
        self.mem = lc.llama_get_memory(self.ptr)
        self.n_rs_seq = lc.llama_n_rs_seq(self.ptr)  # what llama.cpp granted
        self._taps: list[int] = []
        # the greedy sampler chain attached to sequence 0 (use_backend_greedy), and chains detached
        # since the last decode: the graph llama.cpp built with them still points to them until the
        # next decode rebuilds it
        self._greedy_chain = None
        self._detached: list[object] = []
        self.backend_greedy = False  # attached: decodes sample in the graph and copy no logits out
        self._sampled_decode = False  # the last decode ran with it attached: it left no logits

    def enable_taps(self, layer_ids: list[int]) -> None:
        for lid in layer_ids:
            ext.flashdesk_set_layer_tap(self.ptr, lid, True)
        self._taps = list(layer_ids)

    @property
    def tap_layers(self) -> list[int]:
        return list(self._taps)

    def taps(self, n_rows: int) -> np.ndarray:
        """Features of the last decode: (n_rows, len(taps) * n_embd) float32,
        the tapped layer inputs concatenated in tap order (a fresh array)."""
        n_embd = self.model.n_embd
        out = np.empty((n_rows, len(self._taps) * n_embd), dtype=np.float32)
        for j, lid in enumerate(self._taps):
            p = ext.flashdesk_get_layer_tap(self.ptr, lid)
            if not p:
                raise GenerationError(f"{self.model.path}: hidden-state tap {lid} is not available")
            out[:, j * n_embd:(j + 1) * n_embd] = np.ctypeslib.as_array(p, shape=(n_rows, n_embd))
        return out

    def set_nextn_output(self, masked: bool) -> None:
        """Output the nextn rows (the last hidden state before the output norm, which an MTP head
        reads): for every batch token, or (masked) for its output rows only. Before the first decode."""
        ext.flashdesk_set_nextn_output(self.ptr, True, masked)

    def nextn_rows(self, n_rows: int) -> np.ndarray:
        """The nextn rows of the last decode's first n_rows batch tokens (unmasked output), a fresh
        (n_rows, n_embd_out) float32 array."""
        p = ext.flashdesk_get_nextn_ith(self.ptr, 0)
        if not p:
            raise GenerationError(f"{self.model.path}: no nextn rows to read (MTP state)")
        return np.ctypeslib.as_array(p, shape=(n_rows, self.model.n_embd_out)).copy()

    def nextn_row(self, i: int) -> np.ndarray:
        """The nextn row of batch index i (an output row) of the last decode, a view."""
        p = ext.flashdesk_get_nextn_ith(self.ptr, i)
        if not p:
            raise GenerationError(f"{self.model.path}: no nextn row for batch index {i}")
        return np.ctypeslib.as_array(p, shape=(self.model.n_embd_out,))

    def process(self, batch: TokenStateBatch, encode: bool = False) -> None:
        """Decode an extended batch (tokens with state rows: an MTP head's or EAGLE-3's input), or run
        the model's encoder graph on it (`encode`: EAGLE-3's fc over the target's features)."""
        kind = lc.LLAMA_PROCESS_TYPE_ENCODE if encode else lc.LLAMA_PROCESS_TYPE_DECODE
        rc = lc.llama_process(self.ptr, kind, batch.ptr)
        if rc != 0:
            raise GenerationError(f"{self.model.path}: llama_process failed with code {rc} "
                                  f"({'no free KV slot: context full' if rc == 1 else 'see log'})")

    def decode(self, batch: TokenBatch | EmbeddingBatch) -> None:
        rc = lc.llama_decode(self.ptr, batch.batch)
        self._sampled_decode = self.backend_greedy
        if rc == 0 and self._detached:
            self._free_chains(self._detached)  # the graph was built again without them
        if rc != 0:
            raise GenerationError(f"{self.model.path}: llama_decode failed with code {rc} "
                                  f"({'no free KV slot: context full' if rc == 1 else 'see log'})")

    def use_backend_greedy(self, on: bool) -> bool:
        """Take greedy tokens from llama.cpp's backend sampling (the argmax runs in the graph, on the
        device holding the logits, and llama.cpp copies no logits out) or not; returns whether it is
        on. Off for anything that reads logits: they are not there while it is on. Changing it makes
        llama.cpp reserve its graphs again at the next decode (once, not per decode)."""
        on = on and self.cfg.backend_greedy_rows > 0
        if on and not self.backend_greedy:
            # a fresh chain each time: llama.cpp initialises a chain's backend part once only
            chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
            if lc.llama_set_sampler(self.ptr, 0, chain):
                self._greedy_chain, self.backend_greedy = chain, True
            else:
                lc.llama_sampler_free(chain)
        elif not on and self.backend_greedy:
            lc.llama_set_sampler(self.ptr, 0, None)
            self._detached.append(self._greedy_chain)
            self._greedy_chain, self.backend_greedy = None, False
        return self.backend_greedy

    def greedy_rows(self, rows: list[int]) -> np.ndarray:
        """The greedy token of each output row: llama.cpp's backend-sampled token when that is on,
        else the argmax in C (the same token: both take the first maximum of the same logits)."""
        if not self._sampled_decode:
            return self.argmax_rows(rows)[0]
        tok = np.fromiter((lc.llama_get_sampled_token_ith(self.ptr, r) for r in rows), dtype=np.int32,
                          count=len(rows))
        if (tok < 0).any():
            raise GenerationError(f"{self.model.path}: no backend-sampled token for rows {rows}")
        return tok

    def _logits_here(self) -> None:
        if self._sampled_decode:
            raise GenerationError(f"{self.model.path}: the last decode sampled in the graph: llama.cpp copied "
                                  "no logits out (use_backend_greedy(False) before the decode)")

    def argmax_rows(self, rows: list[int], among: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(argmax token, top1-top2 logit gap) of each output row, computed in C;
        `among` (int32 token ids) restricts both to those tokens (a drafter's d2t)."""
        self._logits_here()
        n = len(rows)
        idx = (ctypes.c_int32 * n)(*rows)
        tok = np.empty(n, dtype=np.int32)
        gap = np.empty(n, dtype=np.float32)
        tok_p = tok.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        gap_p = gap.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        if among is None:
            rc = ext.flashdesk_argmax_rows(self.ptr, idx, n, tok_p, gap_p)
        else:
            rc = ext.flashdesk_argmax_rows_in(self.ptr, idx, n, among.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                                              len(among), tok_p, gap_p)
        if rc != 0:
            raise GenerationError(f"{self.model.path}: no logits for rows {rows}")
        return tok, gap

    def set_dflash_compact_logits(self) -> None:
        """A drafter with a reduced vocabulary: output only its draft-vocabulary logits
        (read with dflash_readout). Before the first decode."""
        ext.flashdesk_set_dflash_compact_logits(self.ptr, True)

    def dflash_readout(self, row0: int, n: int, d2t: np.ndarray,
                       with_prob: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """(target token of each row's argmax, its softmax probability over the draft vocabulary)
        for output rows row0.. of the last decode, with compact logits on; computed in C."""
        tok = np.empty(n, dtype=np.int32)
        prob = np.empty(n, dtype=np.float32) if with_prob else None
        rc = ext.flashdesk_dflash_readout(self.ptr, row0, n, d2t.ctypes.data_as(ctypes.POINTER(ctypes.c_int64)),
                                          len(d2t), tok.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                                          prob.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) if prob is not None
                                          else None)
        if rc != 0:
            raise GenerationError(f"{self.model.path}: no draft logits to read")
        return tok, prob

    def set_dflash2_lattice(self) -> None:
        """A DFlash2 drafter: output its selector lattice (a row per block token, read with
        dflash2_walk). Before the first decode."""
        ext.flashdesk_set_nextn_output(self.ptr, True, False)

    def dflash2_walk(self, n: int, with_prob: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """(the drafts of block rows 1..n, the selector's probability of each) from the last
        decode's lattice, walked in C as llama.cpp's draft-dflash walks it."""
        tok = np.empty(n, dtype=np.int32)
        prob = np.empty(n, dtype=np.float32) if with_prob else None
        rc = ext.flashdesk_dflash2_walk(self.ptr, n, tok.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
                                        prob.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) if prob is not None
                                        else None)
        if rc != 0:
            raise GenerationError(f"{self.model.path}: no DFlash2 selector lattice to read")
        return tok, prob

    def logits_row(self, row: int) -> np.ndarray:
        """A view of one output row's logits (valid until the next decode)."""
        self._logits_here()
        p = lc.llama_get_logits_ith(self.ptr, row)
        if not p:
            raise GenerationError(f"{self.model.path}: no logits for row {row}")
        return np.ctypeslib.as_array(p, shape=(self.model.n_vocab,))

    def logits_rows(self, n_rows: int) -> np.ndarray:
        """A (n_rows, n_vocab) view of the last decode's output rows in batch order (valid until the
        next decode): every row at once, for batch jobs that read them all."""
        self._logits_here()
        p = lc.llama_get_logits(self.ptr)
        if not p:
            raise GenerationError(f"{self.model.path}: no logits")
        return np.ctypeslib.as_array(p, shape=(n_rows, self.model.n_vocab))

    @property
    def pools_sequences(self) -> bool:
        """An embeddings context that pools each sequence into one vector (not per token, not rank)."""
        return lc.llama_pooling_type(self.ptr) not in (lc.LLAMA_POOLING_TYPE_NONE, lc.LLAMA_POOLING_TYPE_RANK)

    @property
    def pooled_embedding_dim(self) -> int:
        return lc.llama_model_n_embd_out(self.model.ptr) or self.model.n_embd

    def pooled_embedding(self, seq: int = 0) -> np.ndarray:
        """The pooled embedding of a sequence after a decode (a copy)."""
        p = lc.llama_get_embeddings_seq(self.ptr, seq)
        if not p:
            raise GenerationError(f"{self.model.path}: llama.cpp returned no pooled embedding")
        return np.ctypeslib.as_array(ctypes.cast(p, ctypes.POINTER(ctypes.c_float)),
                                     shape=(self.pooled_embedding_dim,)).copy()

    def seq_rm(self, p0: int, p1: int = -1, seq: int = 0) -> bool:
        if not self.ptr:
            return False
        return bool(lc.llama_memory_seq_rm(self.mem, seq, p0, p1))

    def seq_cp(self, src: int, dst: int) -> None:
        """Copy sequence src's cache into dst (with split KV streams: the whole stream, at the next decode)."""
        lc.llama_memory_seq_cp(self.mem, src, dst, -1, -1)

    def pos_max(self) -> int:
        return lc.llama_memory_seq_pos_max(self.mem, 0)

    def pos_min(self) -> int:
        return lc.llama_memory_seq_pos_min(self.mem, 0)

    def clear(self) -> None:
        if not self.ptr:  # closed: an abandoned generation finalized late (by the GC) resets nothing
            return
        lc.llama_memory_clear(self.mem, True)

    def memory_breakdown(self) -> list[tuple[str, int, int, int]]:
        return ext.memory_breakdown(self.ptr)

    def close(self) -> None:
        if getattr(self, "ptr", None):
            lc.llama_free(self.ptr)
            self.ptr = None
        # after the context that pointed to them
        self._free_chains(getattr(self, "_detached", []) + [getattr(self, "_greedy_chain", None)])
        self._greedy_chain = None

    def _free_chains(self, chains: list[object]) -> None:
        for chain in chains:
            if chain is not None:
                lc.llama_sampler_free(chain)
        self._detached = []

    def __del__(self) -> None:
        self.close()


class TokenBatch:
    """A reusable token batch (sequence 0) filled through numpy views."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.batch = lc.llama_batch_init(capacity, 0, 1)
        b = self.batch
        self.token = np.ctypeslib.as_array(b.token, shape=(capacity,))
        self.pos = np.ctypeslib.as_array(b.pos, shape=(capacity,))
        self.n_seq_id = np.ctypeslib.as_array(b.n_seq_id, shape=(capacity,))
        self.logits = np.ctypeslib.as_array(b.logits, shape=(capacity,))
        for i in range(capacity):
            b.seq_id[i][0] = 0
        self.n_seq_id[:] = 1

    def set_rows(self, tokens: np.ndarray, pos: np.ndarray, seq: np.ndarray, outputs: np.ndarray) -> None:
        """Entries of several sequences in one batch (dataset generation)."""
        n = len(tokens)
        if n > self.capacity:
            raise ValueError(f"batch of {n} tokens exceeds capacity {self.capacity}")
        self.token[:n] = tokens
        self.pos[:n] = pos
        self.logits[:n] = outputs
        sid = self.batch.seq_id
        for i, s in enumerate(seq.tolist()):
            sid[i][0] = s
        self._multi = True
        self.batch.n_tokens = n

    def set(self, tokens: list[int] | np.ndarray, pos0: int, outputs: bool | np.ndarray) -> None:
        n = len(tokens)
        if getattr(self, "_multi", False):
            sid = self.batch.seq_id
            for i in range(self.capacity):
                sid[i][0] = 0
            self._multi = False
        if n > self.capacity:
            raise ValueError(f"batch of {n} tokens exceeds capacity {self.capacity}")
        self.token[:n] = tokens
        self.pos[:n] = np.arange(pos0, pos0 + n, dtype=np.int32)
        self.logits[:n] = outputs
        self.batch.n_tokens = n

    def close(self) -> None:
        if getattr(self, "batch", None) is not None:
            lc.llama_batch_free(self.batch)
            self.batch = None

    def __del__(self) -> None:
        self.close()


class EmbeddingBatch:
    """A reusable embedding batch: rows of target features injected into a
    DFlash drafter's KV cache (the legacy llama_batch path, rows of n_embd_enc)."""

    def __init__(self, capacity: int, width: int):
        self.capacity = capacity
        self.width = width
        self.batch = lc.llama_batch_init(capacity, width, 1)
        b = self.batch
        self.embd = np.ctypeslib.as_array(b.embd, shape=(capacity, width))
        self.pos = np.ctypeslib.as_array(b.pos, shape=(capacity,))
        self.n_seq_id = np.ctypeslib.as_array(b.n_seq_id, shape=(capacity,))
        self.logits = np.ctypeslib.as_array(b.logits, shape=(capacity,))
        for i in range(capacity):
            b.seq_id[i][0] = 0
        self.n_seq_id[:] = 1
        self.logits[:] = 0

    def set(self, rows: np.ndarray, pos0: int) -> None:
        n = rows.shape[0]
        if n > self.capacity or rows.shape[1] != self.width:
            raise ValueError(f"feature block {rows.shape} does not fit batch ({self.capacity}, {self.width})")
        self.embd[:n] = rows
        self.pos[:n] = np.arange(pos0, pos0 + n, dtype=np.int32)
        self.batch.n_tokens = n

    def close(self) -> None:
        if getattr(self, "batch", None) is not None:
            lc.llama_batch_free(self.batch)
            self.batch = None

    def __del__(self) -> None:
        self.close()


class TokenStateBatch:
    """A reusable extended batch (llama.cpp's llama_batch_ext) of tokens that each carry a state row
    of `width` floats: an MTP head's input, a token and the hidden state that precedes it."""

    def __init__(self, ctx: LlamaContext, capacity: int, width: int):
        self.capacity = capacity
        self.width = width
        self.ptr = lc.llama_batch_ext_init(ctx.ptr)
        if not self.ptr:
            raise GenerationError(f"{ctx.model.path}: llama.cpp could not make an extended batch")
        self.rows = np.zeros((capacity, width), dtype=np.float32)  # the state rows the batch points into
        self._pos = lc.llama_pos(0)

    def set(self, tokens: list[int] | None, pos0: int, states: np.ndarray, outputs: list[bool] | bool,
            positions: list[int] | None = None) -> None:
        """Entry i: tokens[i] with state row i (tokens None: the row alone, an embedding input) at
        position pos0 + i (or positions[i]), an output where outputs (or outputs[i]) is true."""
        n = states.shape[0]
        if n > self.capacity or states.shape[1] != self.width or (tokens is not None and len(tokens) != n):
            raise ValueError(f"{n} entries with states {states.shape} do not fit batch ({self.capacity}, {self.width})")
        lc.llama_batch_ext_clear(self.ptr)
        self.rows[:n] = states
        base = self.rows.ctypes.data
        for i in range(n):
            row = lc.llama_embd(ctypes.cast(base + 4 * i * self.width, ctypes.POINTER(ctypes.c_float)), 1, self.width)
            if tokens is None:
                idx = lc.llama_batch_ext_add_embd(self.ptr, 0, row)
                ok = idx >= 0
            else:
                idx = lc.llama_batch_ext_add_token(self.ptr, 0, int(tokens[i]))
                ok = idx >= 0 and lc.llama_batch_ext_set_embd_token(self.ptr, idx, row)
            self._pos.value = positions[i] if positions is not None else pos0 + i
            out = outputs if isinstance(outputs, bool) else outputs[i]
            if not (ok and lc.llama_batch_ext_set_pos(self.ptr, idx, ctypes.byref(self._pos))
                    and lc.llama_batch_ext_set_output_logits(self.ptr, idx, bool(out))):
                raise GenerationError(f"llama.cpp refused batch entry {i} (position {self._pos.value})")

    def close(self) -> None:
        if getattr(self, "ptr", None):
            lc.llama_batch_ext_free(self.ptr)
            self.ptr = None

    def __del__(self) -> None:
        self.close()
