"""Is a GGUF's metadata something llama.cpp can load? Checked from the header, before llama.cpp sees the file.

llama.cpp trusts a model's hyperparameters: `block_count` 0 or 100000 trips a
GGML_ASSERT, a head count of 0 divides by zero, a drafter's target layer past
the target's depth or a `d2t` id past its vocabulary aborts in the graph. Any
of those takes the whole process down, so every hyperparameter llama.cpp
asserts on is checked here first: the one place that `gguf_tools inspect`,
`gguf_tools pair`, the engine's model load and the app's model choice share.

Each problem names the key, the value found and the allowed range;
`check_model` raises a ModelLoadError naming the file.

The shape checks (tensor shapes against the hyperparameters) cover the
architectures whose tensor layout is the plain transformer one
(`SHAPED_ARCHS`); other architectures get the checks every model shares.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gguf_tools.errors import ModelLoadError, excerpt
from gguf_tools.reader import GGUFInfo, TensorInfo, read_gguf

# llama.cpp's LLAMA_MAX_LAYERS: block_count past it is a GGML_ASSERT
MAX_LAYERS = 512
MAX_EMBD = 1 << 18  # the widest models are ~25k
MAX_HEADS = 1 << 12
MAX_HEAD_DIM = 1 << 12
MAX_FF = 1 << 21
MAX_VOCAB = 1 << 24  # the largest vocabularies are ~1M tokens
MAX_CTX_TRAIN = 1 << 27
MAX_TOKEN_SCORE = 1e30  # |score|: SentencePiece log-probs are ~-3e5..0; NaN or inf hang llama.cpp's tokenizer
TOKEN_TYPES = range(0, 7)  # llama.cpp's LLAMA_TOKEN_TYPE_UNDEFINED .. _BYTE
# a DFlash drafter: block sizes the engine and llama.cpp's dflash graph handle (DFlash ships 10 and 16)
MIN_BLOCK, MAX_BLOCK = 2, 64
MAX_TARGET_LAYERS = 64
# architectures whose tensors are the plain transformer's (attn_q/k/v/output, ffn_gate/up/down per block)
SHAPED_ARCHS = frozenset({"llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "dflash"})
# problems listed in one error message (each problem is one line)
_MAX_LISTED = 4
_BLOCK = re.compile(r"^blk\.(\d+)\.")
_NAME = re.compile(r"^[A-Za-z0-9_.]+$")
# tensors outside the blocks that llama.cpp loads for SHAPED_ARCHS (any other one fails its tensor count)
_GLOBAL_TENSORS = frozenset({
    "token_embd", "token_embd_norm", "output_norm", "output", "rope_freqs", "rope_factors_long",
    "rope_factors_short", "dense_2", "dense_3", "fc", "enc.output_norm", "d2t", "markov_w1", "markov_w2",
    "conf_proj", "selector_predecessor", "selector_successor", "selector_hidden", "output_hc_fn",
    "output_hc_base", "output_hc_scale", "output_hc_norm", "output_hc_down", "output_hc_up"})
_REQUIRED_GLOBAL = {"dflash": ("fc.weight", "enc.output_norm.weight", "output_norm.weight")}


@dataclass(frozen=True)
class Problem:
    key: str  # the metadata key or tensor name
    detail: str  # says the key, the value and the allowed range

    def __str__(self) -> str:
        return self.detail


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class _Checker:
    def __init__(self, info: GGUFInfo):
        self.info = info
        self.problems: list[Problem] = []
        self.tensors: dict[str, TensorInfo] = {t.name: t for t in info.tensors}

    def add(self, key: str, detail: str) -> None:
        self.problems.append(Problem(key, detail))

    def int_key(self, key: str, lo: int, hi: int, *, required: bool, why: str = "") -> int | None:
        """A scalar integer key in lo..hi (None, with a problem, when it is not)."""
        if not self.info.has(key):
            if required:
                self.add(key, f"{key} is missing{why} (allowed: {lo}..{hi:,})")
            return None
        v = self.info.get(key)
        if not _is_int(v) or not lo <= v <= hi:
            self.add(key, f"{key} = {excerpt(v)}{why}: not usable (allowed: an integer in {lo}..{hi:,})")
            return None
        return v

    def per_layer(self, key: str, n_layer: int, lo: int, hi: int, *, required: bool) -> list[int] | None:
        """A per-layer integer: one value for every layer, or an array of n_layer values."""
        if not self.info.has(key):
            if required:
                self.add(key, f"{key} is missing (allowed: {lo}..{hi:,})")
            return None
        v = self.info.get(key)
        if isinstance(v, list):
            if len(v) != n_layer:
                self.add(key, f"{key} holds {len(v):,} values but the model has {n_layer} layers "
                              f"(allowed: one value, or one per layer)")
                return None
            bad = [x for x in v if not _is_int(x) or not lo <= x <= hi]
            if bad:
                self.add(key, f"{key} holds {excerpt(bad[0])}: not usable (allowed: integers in {lo}..{hi:,})")
                return None
            return list(v)
        if not _is_int(v) or not lo <= v <= hi:
            self.add(key, f"{key} = {excerpt(v)}: not usable (allowed: an integer in {lo}..{hi:,})")
            return None
        return [v] * n_layer

    def shape(self, name: str, want: tuple[int, ...], why: str) -> bool:
        """False (and a problem) when the tensor exists with another shape."""
        t = self.tensors.get(name)
        if t is None:
            return True
        have = tuple(t.shape) + (1,) * (4 - len(t.shape))
        need = tuple(want) + (1,) * (4 - len(want))
        if have != need:
            self.add(name, f"tensor {name} has shape {list(t.shape)} but the metadata says "
                           f"{list(want)} ({why})")
            return False
        return True


def model_problems(info: GGUFInfo) -> list[Problem]:
    """Everything in one file's metadata llama.cpp would refuse or crash on (empty: loadable as far
    as the header can tell)."""
    c = _Checker(info)
    arch = info.metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        c.add("general.architecture", f"general.architecture = {excerpt(arch)}: missing or not a name")
        return c.problems
    shaped = arch in SHAPED_ARCHS
    blocks = {int(m.group(1)) for t in info.tensors if (m := _BLOCK.match(t.name))}
    n_blocks = max(blocks) + 1 if blocks else 0

    n_layer = c.int_key(f"{arch}.block_count", 1, MAX_LAYERS, required=True,
                        why=f" (the file holds {n_blocks} layers)" if blocks else "")
    if n_layer is not None and blocks and (n_layer != n_blocks if shaped else n_layer < n_blocks):
        c.add(f"{arch}.block_count", f"{arch}.block_count = {n_layer:,} but the file holds the tensors of "
                                     f"{n_blocks} layers, blk.0..blk.{n_blocks - 1} (allowed: {n_blocks})")
        n_layer = None
    n_embd = c.int_key(f"{arch}.embedding_length", 1, MAX_EMBD, required=True)
    c.int_key(f"{arch}.context_length", 1, MAX_CTX_TRAIN, required=True)

    n_vocab = _vocab(c)
    if n_layer is not None:
        heads = c.per_layer(f"{arch}.attention.head_count", n_layer, 1 if shaped else 0, MAX_HEADS, required=shaped)
        kv = c.per_layer(f"{arch}.attention.head_count_kv", n_layer, 1 if shaped else 0, MAX_HEADS, required=False)
        if heads is not None and kv is not None:
            for i, (h, k) in enumerate(zip(heads, kv, strict=True)):
                if k and (k > h or h % k):  # (0 kv heads: a recurrent layer, in the archs that have them)
                    c.add(f"{arch}.attention.head_count_kv",
                          f"{arch}.attention.head_count_kv = {k} for layer {i}, with {h} attention heads "
                          f"(allowed: a divisor of the head count, 1..{h})")
                    break
        n_ff = c.per_layer(f"{arch}.feed_forward_length", n_layer, 1 if shaped else 0, MAX_FF, required=False)
        hd_k = c.int_key(f"{arch}.attention.key_length", 1, MAX_HEAD_DIM, required=False)
        hd_v = c.int_key(f"{arch}.attention.value_length", 1, MAX_HEAD_DIM, required=False)
        if shaped and n_embd is not None and heads is not None and not c.problems:
            _layer_shapes(c, n_layer, n_embd, heads, kv or heads, n_ff, hd_k, hd_v)
    if shaped and not c.problems:
        _tensor_names(c, arch, n_blocks)
    if shaped and n_embd is not None and not c.problems:
        _global_shapes(c, arch, n_embd, n_vocab)
    if arch == "dflash":
        _dflash(c, n_embd, n_vocab)
    return c.problems


def _vocab(c: _Checker) -> int | None:
    info = c.info
    key = "tokenizer.ggml.tokens"
    if not info.has(key):
        return None  # llama.cpp refuses such a file cleanly; a drafter's tokenizer is the pair check's
    vt = info.value_types.get(key)
    n = info.array_len(key)
    if vt != (9, 8) or n is None:
        c.add(key, f"{key} is not an array of strings (GGUF type {vt})")
        return None
    if not 1 <= n <= MAX_VOCAB:
        c.add(key, f"{key} holds {n:,} tokens (allowed: 1..{MAX_VOCAB:,})")
        return None
    for other in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        m = info.array_len(other)
        if info.has(other) and m != n:
            c.add(other, f"{other} holds {excerpt(m)} values for {n:,} tokens (allowed: {n:,}, one per token)")
    _token_values(c)
    return n


def _token_values(c: _Checker) -> None:
    """Per-token scores finite and bounded, token types llama.cpp knows (a flipped byte in either
    hung llama.cpp's tokenizer or broke generation in the fuzz run)."""
    key = "tokenizer.ggml.scores"
    scores = c.info.scalar_array(key)
    if scores is not None:
        a = scores.astype(np.float64)
        with np.errstate(invalid="ignore"):
            bad = np.flatnonzero(~(np.abs(a) <= MAX_TOKEN_SCORE))  # NaN compares false: out too
        if bad.size:
            i = int(bad[0])
            c.add(key, f"{key}: token {i:,} has score {float(a[i]):.3g} (allowed: finite, |score| <= "
                       f"{MAX_TOKEN_SCORE:g}; {bad.size:,} tokens out of range)")
    key = "tokenizer.ggml.token_type"
    types = c.info.scalar_array(key)
    if types is not None:
        t = types.astype(np.int64)
        lo, hi = TOKEN_TYPES.start, TOKEN_TYPES.stop - 1
        bad = np.flatnonzero((t < lo) | (t > hi))
        if bad.size:
            i = int(bad[0])
            c.add(key, f"{key}: token {i:,} has type {int(t[i])} (allowed: {lo}..{hi}; "
                       f"{bad.size:,} tokens out of range)")


def _tensor_names(c: _Checker, arch: str, n_blocks: int) -> None:
    """Every tensor is one llama.cpp loads (it refuses a file with a tensor it does not use or without
    one it needs): the same tensors in every block, known ones outside them."""
    per_block: dict[int, dict[str, tuple[int, ...]]] = {}
    for t in c.info.tensors:
        if not _NAME.match(t.name):
            c.add(t.name, f"tensor name {excerpt(t.name)} is not a tensor name (corrupt header)")
            return
        m = _BLOCK.match(t.name)
        if m:
            per_block.setdefault(int(m.group(1)), {})[t.name[m.end():]] = tuple(t.shape)
            continue
        base = t.name.removesuffix(".weight").removesuffix(".bias").removesuffix(".scale")
        if base not in _GLOBAL_TENSORS:
            c.add(t.name, f"tensor {excerpt(t.name)} is not one a {arch} model has (llama.cpp would refuse "
                          f"the file)")
            return
    for name in _REQUIRED_GLOBAL.get(arch, ("output_norm.weight", "token_embd.weight")):
        if name not in c.tensors:
            c.add(name, f"tensor {name} is missing (a {arch} model needs it)")
            return
    if not per_block:
        return
    # the set (and, for uniform hyperparameters, the shapes) most blocks have is the model's
    sets = [frozenset(b) for b in per_block.values()]
    common = max(set(sets), key=sets.count)
    for i in range(n_blocks):
        have = frozenset(per_block.get(i, {}))
        if have != common:
            odd = sorted(have ^ common)[:2]
            c.add(f"blk.{i}", f"block {i} has other tensors than the rest ({', '.join(f'blk.{i}.{x}' for x in odd)}"
                              f"): corrupt, or not a {arch} model llama.cpp can load")
            return


def _layer_shapes(c: _Checker, n_layer: int, n_embd: int, heads: list[int], kv: list[int],
                  n_ff: list[int] | None, hd_k: int | None, hd_v: int | None) -> None:
    """Each block's attention and feed-forward tensors against the head counts and sizes (first mismatch)."""
    arch = c.info.arch
    for i in range(n_layer):
        h, k = heads[i], kv[i]
        dk = hd_k if hd_k is not None else n_embd // h
        dv = hd_v if hd_v is not None else n_embd // h
        why = (f"{arch}.embedding_length {n_embd}, {h} heads, {k} kv heads, head size {dk}"
               + (f"/{dv}" if dv != dk else ""))
        checks = [(f"blk.{i}.attn_q.weight", (n_embd, dk * h), why), (f"blk.{i}.attn_k.weight", (n_embd, dk * k), why),
                  (f"blk.{i}.attn_v.weight", (n_embd, dv * k), why),
                  (f"blk.{i}.attn_output.weight", (dk * h, n_embd), why),
                  (f"blk.{i}.attn_norm.weight", (n_embd,), f"{arch}.embedding_length {n_embd}")]
        if n_ff is not None and n_ff[i]:
            fwhy = f"{arch}.embedding_length {n_embd}, {arch}.feed_forward_length {n_ff[i]}"
            checks += [(f"blk.{i}.ffn_gate.weight", (n_embd, n_ff[i]), fwhy),
                       (f"blk.{i}.ffn_up.weight", (n_embd, n_ff[i]), fwhy),
                       (f"blk.{i}.ffn_down.weight", (n_ff[i], n_embd), fwhy)]
        for norm in ("attn_q_norm.weight", "attn_k_norm.weight"):
            checks.append((f"blk.{i}.{norm}", (dk,), f"head size {dk}"))
        if not all(c.shape(*x) for x in checks):  # the first mismatch says it: one value is wrong
            return
    # with one value per hyperparameter every block has the same shapes: the first block's
    if len(set(heads)) == len(set(kv)) == 1 and (n_ff is None or len(set(n_ff)) == 1):
        first = {t.name[len("blk.0."):]: t.shape for t in c.info.tensors if t.name.startswith("blk.0.")}
        for t in c.info.tensors:
            m = _BLOCK.match(t.name)
            if m and m.group(1) != "0" and first.get(t.name[m.end():], t.shape) != t.shape:
                c.add(t.name, f"tensor {t.name} has shape {list(t.shape)}, its block 0 twin "
                              f"{list(first[t.name[m.end():]])} (one value per layer in the metadata)")
                return


def _global_shapes(c: _Checker, arch: str, n_embd: int, n_vocab: int | None) -> None:
    why = f"{arch}.embedding_length {n_embd}" + (f", {n_vocab:,} tokens" if n_vocab else "")
    c.shape("output_norm.weight", (n_embd,), why)
    emb = c.tensors.get("token_embd.weight")
    if n_vocab is not None:
        c.shape("token_embd.weight", (n_embd, n_vocab), why)
        if arch != "dflash":  # a drafter's own head covers its draft vocabulary (d2t), checked below
            c.shape("output.weight", (n_embd, n_vocab), why)
    elif emb is not None and emb.shape[0] != n_embd:
        c.shape("token_embd.weight", (n_embd, *emb.shape[1:]), why)


def _dflash(c: _Checker, n_embd: int | None, n_vocab: int | None) -> None:
    info = c.info
    layers = target_layers(info, c.add)
    if layers is not None and n_embd is not None:
        c.shape("fc.weight", (len(layers) * n_embd, n_embd),
                f"{len(layers)} target layers x dflash.embedding_length {n_embd} features in, {n_embd} out")
        c.shape("enc.output_norm.weight", (n_embd,), f"dflash.embedding_length {n_embd}")
    if (p := block_size_problem(info)) is not None:
        c.add("dflash.block_size", p)
    mask = info.get("tokenizer.ggml.mask_token_id")
    if mask is not None and n_vocab is not None and (not _is_int(mask) or not 0 <= mask < n_vocab):
        c.add("tokenizer.ggml.mask_token_id", f"tokenizer.ggml.mask_token_id = {excerpt(mask)} is outside the "
                                              f"vocabulary (allowed: 0..{n_vocab - 1:,})")
    d2t = c.tensors.get("d2t")
    if d2t is not None:
        for p in d2t_problems(info, n_vocab if n_vocab is not None else MAX_VOCAB, "its own"):
            c.add("d2t", p)
        out = c.tensors.get("output.weight")
        if out is not None and n_embd is not None and len(d2t.shape) == 1:
            c.shape("output.weight", (n_embd, d2t.shape[0]), f"dflash.embedding_length {n_embd}, a draft "
                                                              f"vocabulary of {d2t.shape[0]:,} tokens (d2t)")


def target_layers(info: GGUFInfo, add: Callable[[str, str], None] | None = None) -> list[int] | None:
    """A drafter's dflash.target_layers when well formed (None otherwise, and a problem to `add`)."""
    key = "dflash.target_layers"
    v = info.get(key)
    if v is None:
        return None  # the pair check says what a missing list means
    bad = (not isinstance(v, list) or not 1 <= len(v) <= MAX_TARGET_LAYERS
           or any(not _is_int(x) or not 0 <= x < MAX_LAYERS for x in v) or len(set(v)) != len(v))
    if bad:
        if add is not None:
            add(key, f"{key} = {excerpt(v)}: not usable (allowed: 1..{MAX_TARGET_LAYERS} distinct layer ids, "
                     f"each 0..{MAX_LAYERS - 1} and below the target's block count)")
        return None
    return list(v)


def target_layers_problem(layers: list[int], n_layer: int) -> str | None:
    """The drafter taps the input of each of these target layers: each must be a layer the target has
    (id n_layer, one past the last, trips a GGML_ASSERT in llama.cpp's tap)."""
    bad = [lid for lid in layers if not 0 <= lid < n_layer]
    if not bad:
        return None
    return (f"the drafter reads target layers {bad}, but the target has only {n_layer} layers "
            f"(dflash.target_layers allows 0..{n_layer - 1}: the drafter was trained for a deeper model)")


def block_size_problem(info: GGUFInfo) -> str | None:
    bs = info.get("dflash.block_size", 16)
    if _is_int(bs) and MIN_BLOCK <= bs <= MAX_BLOCK:
        return None
    return (f"dflash.block_size = {excerpt(bs)}: block size {excerpt(bs)} is not usable "
            f"(allowed: {MIN_BLOCK}..{MAX_BLOCK})")


def read_d2t(info: GGUFInfo) -> np.ndarray:
    """The drafter's d2t map (draft row -> target token id); empty when it has none. Read from the
    file, not through llama.cpp; call after d2t_problems found nothing."""
    t = info.tensor("d2t")
    if t is None:
        return np.empty(0, dtype=np.int64)
    with open(info.path, "rb") as f:
        f.seek(info.data_offset + t.offset)
        return np.frombuffer(f.read(t.n_bytes), dtype=np.int64).copy()


def d2t_problems(info: GGUFInfo, n_vocab: int, whose: str) -> list[str]:
    """d2t must be one I64 row of target ids, each inside the target vocabulary of n_vocab tokens
    (llama.cpp asserts on its type and indexes the target's logits with it unchecked)."""
    t = info.tensor("d2t")
    if t is None:
        return []
    if t.type_name != "I64" or len(t.shape) != 1:
        return [f"tensor d2t is {t.type_name} {list(t.shape)} (allowed: one row of I64 token ids)"]
    if not 1 <= t.shape[0] <= min(n_vocab, MAX_VOCAB):
        return [f"tensor d2t maps {t.shape[0]:,} draft tokens (allowed: 1..{n_vocab:,}, {whose} vocabulary)"]
    ids = read_d2t(info)
    bad = np.flatnonzero((ids < 0) | (ids >= n_vocab))
    if bad.size:
        i = int(bad[0])
        return [f"tensor d2t maps draft token {i} to id {int(ids[i]):,}, outside {whose} vocabulary of "
                f"{n_vocab:,} tokens ({bad.size:,} such ids; allowed: 0..{n_vocab - 1:,})"]
    return []


def format_problems(path: str | Path, problems: list[Problem]) -> str:
    shown = [f"  - {p.detail}" for p in problems[:_MAX_LISTED]]
    if len(problems) > _MAX_LISTED:
        shown.append(f"  - and {len(problems) - _MAX_LISTED} more")
    return (f"{path}: llama.cpp cannot load this model safely; its metadata is out of range:\n"
            + "\n".join(shown))


def check_model(info: GGUFInfo | str | Path) -> GGUFInfo:
    """The header of a model llama.cpp can be handed; raises ModelLoadError naming the file, each key
    and its allowed range."""
    if not isinstance(info, GGUFInfo):
        info = read_gguf(info)
    problems = model_problems(info)
    if problems:
        raise ModelLoadError(format_problems(info.path, problems))
    return info
