"""Hidden-state taps: for every architecture we patched (and two upstream
ones as a control), tap 0 equals the input embeddings computed by hand from
the GGUF, and tap i+1 equals layer i's output as llama.cpp's eval callback
sees it ("l_out-i")."""

from __future__ import annotations

import ctypes
import math
from pathlib import Path

import gguf
import numpy as np
import pytest

from gguf_tools.synth import TinyShape, write_tiny_target
from native import lib
from native.api import ext
from native.api import llama as lc

_base = ctypes.CDLL(str(lib.build_info().lib_dir / "libggml-base.so"))
_base.ggml_get_name.argtypes = [ctypes.c_void_p]
_base.ggml_get_name.restype = ctypes.c_char_p
_base.ggml_nbytes.argtypes = [ctypes.c_void_p]
_base.ggml_nbytes.restype = ctypes.c_size_t
_base.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]

PATCHED = ["gemma3", "gemma2", "mistral3", "phi3", "granite"]
UPSTREAM = ["qwen3", "llama", "lfm2", "qwen35"]  # lfm2, qwen35: hybrids (short convolutions, gated delta nets)
SHAPE = TinyShape(n_layer=4)
TOKENS = [5, 9, 17, 33, 40, 41, 50]


def _embedding_scale(arch: str) -> float:
    if arch in ("gemma2", "gemma3"):
        return math.sqrt(SHAPE.n_embd)
    if arch == "granite":
        return 2.0  # synth writes granite.embedding_scale = 2
    return 1.0


def _run_with_taps(path: Path, layer_ids: list[int]) -> tuple[dict[int, np.ndarray], dict[str, np.ndarray]]:
    captured: dict[str, np.ndarray] = {}

    @lc.ggml_backend_sched_eval_callback
    def cb(t: int, ask: bool, _user: int) -> bool:
        name = _base.ggml_get_name(t).decode()
        if not name.startswith("l_out-"):
            return False if ask else True
        if ask:
            return True
        nbytes = _base.ggml_nbytes(t)
        buf = np.empty(nbytes // 4, dtype=np.float32)
        _base.ggml_backend_tensor_get(t, buf.ctypes.data, 0, nbytes)
        captured[name] = buf.reshape(-1, SHAPE.n_embd).copy()
        return True

    model = lc.llama_model_load_from_file(str(path).encode(), lc.llama_model_default_params())
    assert model
    cp = lc.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 128, 32, 32
    cp.cb_eval = cb
    ctx = lc.llama_init_from_model(model, cp)
    try:
        for lid in layer_ids:
            ext.flashdesk_set_layer_tap(ctx, lid, True)
        toks = (ctypes.c_int32 * len(TOKENS))(*TOKENS)
        assert lc.llama_decode(ctx, lc.llama_batch_get_one(toks, len(TOKENS))) == 0
        taps = {}
        for lid in layer_ids:
            p = ext.flashdesk_get_layer_tap(ctx, lid)
            assert p, f"tap {lid} missing"
            taps[lid] = np.ctypeslib.as_array(p, shape=(len(TOKENS), SHAPE.n_embd)).copy()
        assert not ext.flashdesk_get_layer_tap(ctx, SHAPE.n_layer), "a tap that was not enabled must read as NULL"
    finally:
        lc.llama_free(ctx)
        lc.llama_model_free(model)
    return taps, captured


@pytest.mark.parametrize("arch", PATCHED + UPSTREAM)
def test_taps_equal_layer_inputs(arch: str, tmp_path: Path) -> None:
    path = write_tiny_target(tmp_path / f"{arch}.gguf", arch, SHAPE, seed=3)
    taps, l_out = _run_with_taps(path, list(range(SHAPE.n_layer)))

    # tap 0 is the scaled token embedding, computed here from the file's weights
    emb = next(t for t in gguf.GGUFReader(path).tensors if t.name == "token_embd.weight")
    table = np.asarray(emb.data, dtype=np.float32).reshape(-1, SHAPE.n_embd)
    np.testing.assert_allclose(taps[0], table[TOKENS] * _embedding_scale(arch), rtol=1e-5, atol=1e-5)

    # tap i+1 is the output of layer i
    for il in range(SHAPE.n_layer - 1):
        assert f"l_out-{il}" in l_out, f"{arch}: no l_out-{il} seen by the eval callback"
        np.testing.assert_allclose(taps[il + 1], l_out[f"l_out-{il}"], rtol=1e-5, atol=1e-5)
        assert not np.allclose(taps[il + 1], taps[il]), "consecutive taps must differ (layers do work)"


def test_build_reports_patched_architectures() -> None:
    archs = lib.build_info().tap_architectures
    for arch in PATCHED + UPSTREAM:
        assert arch in archs
    assert "dflash" not in archs
