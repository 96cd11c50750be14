"""What a GGUF model needs, read from its header alone: per-layer weight bytes,
the geometry of each layer's cache (full attention, sliding window, recurrent
state), the input embeddings and the output head.

The per-architecture facts (which layers slide, which are recurrent) follow
the loaders in llama.cpp's src/models/*.cpp of the pinned tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from app.engine.dflash import drafter_window_for
from app.errors import ModelLoadError
from app.scheduler.errors import PlanInputError
from gguf_tools.reader import GGUFInfo, TensorInfo, read_gguf

# (default period, dense_first) of load_swa_pattern() per architecture, used when the
# GGUF sets a sliding window but no explicit pattern.
SWA_PATTERNS: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False), "gemma3": (6, False), "gemma-embedding": (6, False), "gemma3n": (5, False),
    "cohere2": (4, False), "cohere2moe": (4, True), "afmoe": (4, False), "exaone4": (4, False),
    "exaone-moe": (4, False), "mellum": (4, False), "olmo2": (4, False), "gpt-oss": (2, False),
    "plamo3": (8, False), "smallthinker": (4, True), "laguna": (4, True), "muse-glimmer": (4, False),
}
# hybrid gated-delta-net models: attention every full_attention_interval-th layer, recurrent state elsewhere
RECURRENT_HYBRIDS = {"qwen35", "qwen35moe", "qwen3next"}
# architectures whose recurrent state keeps rollback snapshots (llm_arch_supports_rs_rollback)
RS_ROLLBACK = {"qwen35", "qwen35moe", "kimi-k3", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h",
               "nemotron_h_moe", "lfm2", "lfm2moe", "bailingmoe3"}
# tensors llama.cpp keeps with the input layer, always on the CPU (llama-model.cpp: dev_input)
_INPUT_TENSORS = ("token_embd.", "token_types.", "position_embd.", "per_layer_token_embd.")
# the drafter files the planner places beside a target (a DFlash-family drafter, an EAGLE-3 drafter)
DRAFTER_ARCHS = ("dflash", "eagle3")
_BLK = re.compile(r"^blk\.(\d+)\.")
# matmul weights the CPU backend keeps in an 8-row interleaved copy, in its own buffer
# (native/patches/0003, CPU_SMALLBATCH): on the CPU they are held twice, mapped and copied
CPU_COPIED_TYPES = frozenset({"Q8_0", "Q5_0", "Q4_0", "IQ4_NL", "Q4_K", "Q6_K"})


def cpu_copy_bytes(t: TensorInfo) -> int:
    """Bytes of `t` the CPU backend copies into its repacked buffer (0: used from the mapping)."""
    return t.n_bytes if t.type_name in CPU_COPIED_TYPES and len(t.shape) == 2 and t.shape[1] % 8 == 0 else 0


@dataclass(frozen=True)
class LayerGeometry:
    """One repeating layer: its weights and the width of its cache rows."""
    kind: str  # "full", "swa" (sliding window) or "recurrent"
    weights: int  # bytes of every blk.N.* tensor
    n_embd_k: int  # K cache row width (key_length x kv heads)
    n_embd_v: int
    cpu_copy: int = 0  # of those, the bytes repacked into a copy when the layer runs on the CPU


@dataclass(frozen=True)
class ModelProfile:
    """The memory-relevant facts of one GGUF (a target or a DFlash drafter)."""
    path: Path
    arch: str
    name: str
    n_layer: int
    n_embd: int
    n_ff: int  # the widest feed-forward (its activations set a layer's compute buffer)
    q_dim: int  # query width (heads x key length)
    n_vocab: int
    n_ctx_train: int
    n_swa: int
    layers: tuple[LayerGeometry, ...]
    input_bytes: int  # token embeddings & co: always on the CPU with a layer split
    output_bytes: int  # output head + output norm + other non-layer tensors: on the output device
    head_bytes: int  # the output projection alone (a tied head duplicates token_embd)
    tied_output: bool
    output_cpu_copy: int = 0  # non-layer weights (the head) repacked into a copy on the CPU
    n_embd_r: int = 0  # recurrent conv-state width (f32)
    n_embd_s: int = 0  # recurrent ssm-state width (f32)
    n_pos_per_embd: int = 1
    rs_rollback: bool = False
    file_bytes: int = 0
    # DFlash drafter facts
    target_layers: tuple[int, ...] = ()
    block_size: int = 0
    window: int = 0  # the window the engine gives it by default (app.engine.dflash.drafter_window_for)
    has_own_head: bool = True  # False: shares token_embd/output with the target through ctx_other
    warnings: tuple[str, ...] = field(default_factory=tuple)

    @property
    def is_drafter(self) -> bool:
        return self.arch in DRAFTER_ARCHS

    @property
    def layer_bytes(self) -> int:
        return sum(ly.weights for ly in self.layers)

    @property
    def weight_bytes(self) -> int:
        return self.layer_bytes + self.input_bytes + self.output_bytes

    def to_dict(self) -> dict:
        kinds: dict[str, int] = {}
        for ly in self.layers:
            kinds[ly.kind] = kinds.get(ly.kind, 0) + 1
        return {"path": str(self.path), "arch": self.arch, "name": self.name, "n_layer": self.n_layer,
                "n_embd": self.n_embd, "n_ff": self.n_ff, "n_vocab": self.n_vocab, "n_ctx_train": self.n_ctx_train,
                "layer_kinds": kinds, "layer_bytes": self.layer_bytes, "input_bytes": self.input_bytes,
                "output_bytes": self.output_bytes, "tied_output": self.tied_output, "file_bytes": self.file_bytes,
                "block_size": self.block_size or None, "n_taps": len(self.target_layers) or None,
                "has_own_head": self.has_own_head, "warnings": list(self.warnings)}


def _per_layer(value: object, n: int, default: int) -> list[int]:
    """A hyperparameter that is either one number or one per layer."""
    if value is None:
        return [default] * n
    if isinstance(value, list):
        vals = [int(v) for v in value] + [int(value[-1]) if value else default] * n
        return vals[:n]
    return [int(value)] * n


def _layer_kinds(info: GGUFInfo, n_layer: int) -> tuple[list[str], list[str]]:
    arch, warnings = info.arch, []
    kinds = ["full"] * n_layer
    if arch in RECURRENT_HYBRIDS:
        recurrent = info.arch_get("attention.recurrent_layers")
        if isinstance(recurrent, list):
            kinds = ["recurrent" if r else "full" for r in (list(recurrent) + [False] * n_layer)[:n_layer]]
        else:
            period = int(info.arch_get("full_attention_interval", 4) or 4)
            kinds = ["recurrent" if (i + 1) % period != 0 else "full" for i in range(n_layer)]
        return kinds, warnings
    if int(info.arch_get("ssm.state_size", 0) or 0) > 0 or arch.startswith(("mamba", "rwkv", "jamba")):
        warnings.append(f"{arch}: recurrent layers are not modelled; every layer is counted as full attention "
                        f"(an over-estimate)")
    n_swa = int(info.arch_get("attention.sliding_window", 0) or 0)
    pattern = info.arch_get("attention.sliding_window_pattern")
    if n_swa <= 0:
        return kinds, warnings
    if isinstance(pattern, list):
        return ["swa" if p else "full" for p in (list(pattern) + [False] * n_layer)[:n_layer]], warnings
    period, dense_first = SWA_PATTERNS.get(arch, (0, False))
    if isinstance(pattern, int) and not isinstance(pattern, bool):
        period = pattern
    elif arch not in SWA_PATTERNS:
        # llama.cpp ignores the window for architectures without a pattern: full caches (safe side)
        return kinds, warnings
    for i in range(n_layer):
        swa = period == 0 or ((i % period != 0) if dense_first else (i % period < period - 1))
        kinds[i] = "swa" if swa else "full"
    return kinds, warnings


def read_profile(path: str | Path) -> ModelProfile:
    """The memory profile of a GGUF from its header; raises PlanInputError naming the file."""
    try:
        info = read_gguf(path)
    except ModelLoadError as e:
        raise PlanInputError(str(e)) from None
    p = info.path
    n_layer, n_embd = info.n_layer, info.n_embd
    if n_layer <= 0 or n_embd <= 0:
        raise PlanInputError(f"{p}: no {info.arch}.block_count / embedding_length in the header: "
                             f"not a model the planner can size")
    n_head = _per_layer(info.arch_get("attention.head_count"), n_layer, 1)
    n_head_kv = _per_layer(info.arch_get("attention.head_count_kv"), n_layer, n_head[0])
    key_len = int(info.arch_get("attention.key_length", 0) or n_embd // max(1, n_head[0]))
    val_len = int(info.arch_get("attention.value_length", 0) or key_len)
    n_ff = max(_per_layer(info.arch_get("feed_forward_length"), n_layer, 4 * n_embd))
    n_ff_exp = int(info.arch_get("expert_feed_forward_length", 0) or 0)
    n_used = int(info.arch_get("expert_used_count", 0) or 0)
    n_ff = max(n_ff, n_ff_exp * n_used)  # MoE: the routed experts' activations stand in for one FFN

    weights = [0] * n_layer
    copies = [0] * n_layer
    input_bytes = output_bytes = output_copy = 0
    names = set()
    for t in info.tensors:
        names.add(t.name)
        m = _BLK.match(t.name)
        if m and int(m.group(1)) < n_layer:
            weights[int(m.group(1))] += t.n_bytes
            copies[int(m.group(1))] += cpu_copy_bytes(t)
        elif t.name.startswith(_INPUT_TENSORS):
            input_bytes += t.n_bytes  # used by GET_ROWS: never repacked
        else:
            output_bytes += t.n_bytes  # output, output_norm, rope_freqs, ...: with the output layer
            output_copy += cpu_copy_bytes(t)
    emb = info.tensor("token_embd.weight")
    out = info.tensor("output.weight")
    is_drafter = info.arch in DRAFTER_ARCHS
    tied = out is None and emb is not None and not is_drafter
    head_bytes = out.n_bytes if out is not None else (emb.n_bytes if emb is not None else 0)
    if tied:
        output_bytes += head_bytes  # llama.cpp duplicates token_embd as the output head on the output device
        output_copy += cpu_copy_bytes(emb)  # on the CPU too, once the head's buffer type differs from GET_ROWS'

    kinds, warnings = _layer_kinds(info, n_layer)
    layers = tuple(LayerGeometry(k, weights[i], key_len * n_head_kv[i], val_len * n_head_kv[i], copies[i])
                   for i, k in enumerate(kinds))
    d_conv = int(info.arch_get("ssm.conv_kernel", 0) or 0)
    d_inner = int(info.arch_get("ssm.inner_size", 0) or 0)
    d_state = int(info.arch_get("ssm.state_size", 0) or 0)
    n_group = int(info.arch_get("ssm.group_count", 0) or 0)
    n_embd_r = max(0, d_conv - 1) * (d_inner + 2 * n_group * d_state)  # llama_hparams::n_embd_r
    n_embd_s = d_state * d_inner  # llama_hparams::n_embd_s
    n_vocab = info.n_vocab if (emb is not None or out is not None or info.has("tokenizer.ggml.tokens")) else 0
    return ModelProfile(
        path=p, arch=info.arch, name=str(info.get("general.name", p.stem)), n_layer=n_layer, n_embd=n_embd,
        n_ff=n_ff, q_dim=n_head[0] * key_len, n_vocab=n_vocab,
        n_ctx_train=int(info.arch_get("context_length", 0) or 0),
        n_swa=int(info.arch_get("attention.sliding_window", 0) or 0), layers=layers,
        input_bytes=input_bytes, output_bytes=output_bytes, head_bytes=head_bytes, tied_output=tied,
        output_cpu_copy=output_copy, n_embd_r=n_embd_r, n_embd_s=n_embd_s,
        n_pos_per_embd=4 if info.has(f"{info.arch}.rope.dimension_sections") else 1,
        rs_rollback=info.arch in RS_ROLLBACK, file_bytes=info.file_size,
        target_layers=tuple(int(x) for x in (info.arch_get("target_layers") or [])) if is_drafter else (),
        # (an EAGLE-3 pass has one output row: it drafts a token a pass)
        block_size=(int(info.arch_get("block_size", 16) or 16) if info.arch == "dflash" else 1) if is_drafter else 0,
        window=drafter_window_for(info) if is_drafter else 0,
        has_own_head=(emb is not None and out is not None) if is_drafter else True,
        warnings=tuple(warnings))
