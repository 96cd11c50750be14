"""The PyTorch drafter and llama.cpp's dflash graph compute the same logits
for the same context features and block (export is 1:1)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from app.distill.export import export_gguf  # noqa: E402
from app.distill.model import Drafter, DrafterConfig  # noqa: E402
from app.distill.target_weights import TargetWeights  # noqa: E402
from app.engine.llama_objects import ContextConfig, EmbeddingBatch, LlamaContext, LlamaModel, TokenBatch  # noqa: E402
from gguf_tools.synth import TINY_MASK_ID, TinyShape, write_tiny_target  # noqa: E402

GGML_TYPE_F32 = 0


def _random_drafter(target: Path, gemma: bool, seed: int = 0) -> Drafter:
    s = TinyShape()
    c = DrafterConfig(n_embd=s.n_embd, n_layer=2, n_head=s.n_head, n_head_kv=s.n_head_kv, head_dim=s.head_dim,
                      n_ff=s.n_ff, target_layers=[1, 3], block_size=8, mask_token_id=TINY_MASK_ID,
                      rope_base=10000.0, embedding_scale=math.sqrt(s.n_embd) if gemma else 1.0,
                      activation="gelu" if gemma else "silu", post_norms=gemma)
    tw = TargetWeights(target)
    tok = torch.from_numpy(tw.token_embd().copy())
    d2t = torch.tensor(sorted(set(range(0, 64, 2)) | {TINY_MASK_ID}), dtype=torch.long)  # a reduced vocabulary
    m = Drafter(c, tok, torch.from_numpy(tw.output_head()[d2t.numpy()]), d2t)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[1]))
    return m


@pytest.mark.parametrize(("arch", "dtype", "scale"), [("gemma3", "f32", 3.0), ("qwen3", "f32", 3.0),
                                                     ("gemma3", "f16", 2e5)])
def test_torch_and_llamacpp_drafter_logits_agree(arch: str, dtype: str, scale: float, tmp_path: Path) -> None:
    """f16 with features past float16's range (as Gemma's residual stream is): no inf/NaN on the way."""
    target = write_tiny_target(tmp_path / "t.gguf", arch, seed=5)
    model = _random_drafter(target, gemma=arch == "gemma3")
    out = export_gguf(model, target, tmp_path / "d.gguf", dtype=dtype)
    if dtype == "f16":  # compare against the weights as exported
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.ndim == 2 and name != "fc.weight":
                    p.copy_(p.half().float())

    rng = np.random.default_rng(0)
    T, B = 11, 8
    feats = rng.standard_normal((T, 2 * 64)).astype(np.float32) * scale
    anchor = 17

    with torch.no_grad():
        ref = model(torch.from_numpy(feats), torch.tensor([T]), torch.tensor([[anchor] + [TINY_MASK_ID] * (B - 1)]))
    ref = ref[0, 1:].numpy()  # [B-1, draft vocab]

    tm = LlamaModel(target)
    tctx = LlamaContext(tm, ContextConfig(n_ctx=256, n_batch=64, n_ubatch=64))
    dm = LlamaModel(out)
    dctx = LlamaContext(dm, ContextConfig(n_ctx=256, n_batch=64, n_ubatch=64, non_causal=True,
                                          type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32), other=tctx)
    eb = EmbeddingBatch(64, feats.shape[1])
    eb.set(feats, 0)
    dctx.decode(eb)
    tb = TokenBatch(B)
    tb.set([anchor] + [TINY_MASK_ID] * (B - 1), T, True)  # all rows are outputs, as the engine drafts
    dctx.decode(tb)
    got = np.stack([dctx.logits_row(i) for i in range(1, B)])  # full vocabulary, scattered through d2t
    d2t = model.d2t.numpy()
    assert np.isfinite(got[:, d2t]).all()
    tol = 1e-2 if dtype == "f32" else 5e-2  # f16 activations in the block path
    np.testing.assert_allclose(got[:, d2t], ref, rtol=tol, atol=tol * 10)
    outside = np.setdiff1d(np.arange(64), d2t)
    assert np.all(np.isneginf(got[:, outside])), "tokens outside the draft vocabulary must be -inf"
    assert (got[:, d2t].argmax(1) == ref.argmax(1)).all()
    # the engine's readout: compact logits (only the draft vocabulary) mapped through d2t in C
    cctx = LlamaContext(dm, ContextConfig(n_ctx=256, n_batch=64, n_ubatch=64, non_causal=True,
                                          type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32), other=tctx)
    cctx.set_dflash_compact_logits()
    cctx.decode(eb)
    cctx.decode(tb)
    toks, prob = cctx.dflash_readout(1, B - 1, np.ascontiguousarray(d2t, dtype=np.int64), True)
    assert (toks == d2t[ref.argmax(1)]).all()
    p_ref = 1.0 / np.exp(ref - ref.max(1, keepdims=True)).sum(1)
    np.testing.assert_allclose(prob, p_ref, rtol=tol, atol=tol)
    for o in (eb, tb, cctx, dctx, tctx, dm, tm):
        o.close()
