"""ctypes bindings for FlashDesk's C API (src/flashdesk-ext.h in the patch).

One function per C function, its declaration in the comment above it, in
the style of llama_cpp.py. Importing it loads the patched build first
(native.lib.load); FlashDesk reaches it through native.lib.ext.
"""

from __future__ import annotations

import ctypes

from native.lib import EXT_API_VERSION, load

lc = load()  # llama_cpp.llama_cpp, bound to the patched build

API_VERSION = EXT_API_VERSION

_lib = lc._lib
_ctx_p = lc.llama_context_p_ctypes
_model_p = lc.llama_model_p_ctypes


def _bind(name: str, argtypes: list, restype):  # noqa: ANN001
    fn = getattr(_lib, name)
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


# int32_t flashdesk_ext_api_version(void);
flashdesk_ext_api_version = _bind("flashdesk_ext_api_version", [], ctypes.c_int32)

# void flashdesk_set_layer_tap(struct llama_context * ctx, uint32_t lid, bool on);
flashdesk_set_layer_tap = _bind("flashdesk_set_layer_tap", [_ctx_p, ctypes.c_uint32, ctypes.c_bool], None)

# float * flashdesk_get_layer_tap(struct llama_context * ctx, uint32_t lid);
flashdesk_get_layer_tap = _bind("flashdesk_get_layer_tap", [_ctx_p, ctypes.c_uint32],
                                ctypes.POINTER(ctypes.c_float))

# int32_t flashdesk_model_target_layers(const struct llama_model * model, int32_t * out, int32_t cap);
flashdesk_model_target_layers = _bind("flashdesk_model_target_layers",
                                      [_model_p, ctypes.POINTER(ctypes.c_int32), ctypes.c_int32], ctypes.c_int32)

# int32_t flashdesk_model_n_devices(const struct llama_model * model);
flashdesk_model_n_devices = _bind("flashdesk_model_n_devices", [_model_p], ctypes.c_int32)

# const char * flashdesk_model_device_name(const struct llama_model * model, int32_t i);
flashdesk_model_device_name = _bind("flashdesk_model_device_name", [_model_p, ctypes.c_int32], ctypes.c_char_p)

# int32_t flashdesk_argmax_rows(struct llama_context * ctx, const int32_t * idx, int32_t n,
#                               int32_t * out_token, float * out_gap);
flashdesk_argmax_rows = _bind("flashdesk_argmax_rows",
                              [_ctx_p, ctypes.POINTER(ctypes.c_int32), ctypes.c_int32,
                               ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_float)], ctypes.c_int32)

# int32_t flashdesk_argmax_rows_in(struct llama_context * ctx, const int32_t * idx, int32_t n,
#                                  const int32_t * cols, int32_t n_cols, int32_t * out_token, float * out_gap);
flashdesk_argmax_rows_in = _bind("flashdesk_argmax_rows_in",
                                 [_ctx_p, ctypes.POINTER(ctypes.c_int32), ctypes.c_int32,
                                  ctypes.POINTER(ctypes.c_int32), ctypes.c_int32,
                                  ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_float)], ctypes.c_int32)

# void flashdesk_set_dflash_compact_logits(struct llama_context * ctx, bool on);
flashdesk_set_dflash_compact_logits = _bind("flashdesk_set_dflash_compact_logits", [_ctx_p, ctypes.c_bool], None)

# int32_t flashdesk_dflash_readout(struct llama_context * ctx, int32_t row0, int32_t n, const int64_t * d2t,
#                                  int32_t n_draft, int32_t * out_token, float * out_prob);
flashdesk_dflash_readout = _bind("flashdesk_dflash_readout",
                                 [_ctx_p, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_int64),
                                  ctypes.c_int32, ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_float)],
                                 ctypes.c_int32)

# void flashdesk_set_nextn_output(struct llama_context * ctx, bool on, bool masked);
flashdesk_set_nextn_output = _bind("flashdesk_set_nextn_output", [_ctx_p, ctypes.c_bool, ctypes.c_bool], None)

# int32_t flashdesk_dflash2_walk(struct llama_context * ctx, int32_t n, int32_t * out_token, float * out_prob);
flashdesk_dflash2_walk = _bind("flashdesk_dflash2_walk",
                               [_ctx_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_float)],
                               ctypes.c_int32)

# float * flashdesk_get_nextn_ith(struct llama_context * ctx, int32_t i);
flashdesk_get_nextn_ith = _bind("flashdesk_get_nextn_ith", [_ctx_p, ctypes.c_int32], ctypes.POINTER(ctypes.c_float))

# void flashdesk_set_nextn_layer_offset(struct llama_context * ctx, int32_t offset);
flashdesk_set_nextn_layer_offset = _bind("flashdesk_set_nextn_layer_offset", [_ctx_p, ctypes.c_int32], None)

# int32_t flashdesk_tokenize(const struct llama_vocab * vocab, const char * text, int32_t text_len,
#                            llama_token * tokens, int32_t n_tokens_max, bool add_special, bool parse_special);
flashdesk_tokenize = _bind("flashdesk_tokenize",
                           [lc.llama_vocab_p_ctypes, ctypes.c_char_p, ctypes.c_int32, ctypes.POINTER(lc.llama_token),
                            ctypes.c_int32, ctypes.c_bool, ctypes.c_bool], ctypes.c_int32)
TOKENIZE_FAILED = -(2 ** 31)  # flashdesk_tokenize's INT32_MIN: the tokenizer threw

# int32_t flashdesk_memory_breakdown(const struct llama_context * ctx, char * buf, int32_t cap);
flashdesk_memory_breakdown = _bind("flashdesk_memory_breakdown", [_ctx_p, ctypes.c_char_p, ctypes.c_int32],
                                   ctypes.c_int32)


def target_layers(model: int) -> list[int]:
    """A drafter's target layer ids (layer-input ids, as stored in the GGUF)."""
    n = flashdesk_model_target_layers(model, None, 0)
    buf = (ctypes.c_int32 * max(n, 1))()
    flashdesk_model_target_layers(model, buf, n)
    return list(buf[:n])


def memory_breakdown(ctx: int) -> list[tuple[str, int, int, int]]:
    """(buffer type, model bytes, context bytes, compute bytes) per buffer type."""
    need = flashdesk_memory_breakdown(ctx, None, 0)
    buf = ctypes.create_string_buffer(need)
    flashdesk_memory_breakdown(ctx, buf, need)
    rows = []
    for line in buf.value.decode().splitlines():
        name, model_b, ctx_b, compute_b = line.split("\t")
        rows.append((name, int(model_b), int(ctx_b), int(compute_b)))
    return rows
