"""The DFlash drafter in PyTorch, computing exactly what llama.cpp's `dflash`
graph computes (src/models/dflash.cpp), so a trained model exports 1:1.

Context path (KV injection), shared by every layer:
    g = RMSNorm(fc(concat(target layer inputs)))            # hidden_norm
    K_ctx = rope(k_norm(Wk g)),  V_ctx = Wv g                # per layer
Block path, queries only from the block [anchor, MASK x (B-1)]:
    h = embed(tokens) * embedding_scale
    per layer: x = attn_norm(h); Q,K,V from x (q/k norm, NeoX rope);
               attention over [K_ctx (positions < anchor); K_block] with no
               mask inside the block; h += post_norm(Wo attn);
               h += post_norm(FFN(ffn_norm(h)))
    logits = head(output_norm(h))   (reduced draft vocabulary via d2t)

Layers may carry Gemma's sandwich norms (attn_post_norm, ffn_post_norm) and
GELU, which the dflash graph supports, so a drafter layer can start as a
copy of a target layer.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class DrafterConfig:
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    target_layers: list[int]
    block_size: int = 16
    mask_token_id: int = 0
    rms_eps: float = 1e-6
    rope_base: float = 10000.0
    embedding_scale: float = 1.0
    activation: str = "silu"  # silu | gelu (tanh approximation, as ggml's GELU)
    post_norms: bool = False  # Gemma-style attn_post_norm / ffn_post_norm
    n_ctx: int = 32768

    def to_dict(self) -> dict:
        return asdict(self)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * w, as ggml_rms_norm + mul (weights stored as used)."""

    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_neox(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """NeoX rotary embedding over the last dim: pairs (i, i + d/2). x: [..., T, H, D], pos: [..., T]."""
    d = x.shape[-1]
    inv = base ** (-torch.arange(0, d // 2, dtype=torch.float32, device=x.device) * 2.0 / d)  # theta_i
    ang = pos.to(torch.float32)[..., None] * inv  # [..., T, D/2]
    cos, sin = ang.cos()[..., None, :], ang.sin()[..., None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class DrafterLayer(nn.Module):
    def __init__(self, c: DrafterConfig):
        super().__init__()
        self.c = c
        q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        self.attn_norm = RMSNorm(c.n_embd, c.rms_eps)
        self.wq = nn.Linear(c.n_embd, q_dim, bias=False)
        self.wk = nn.Linear(c.n_embd, kv_dim, bias=False)
        self.wv = nn.Linear(c.n_embd, kv_dim, bias=False)
        self.wo = nn.Linear(q_dim, c.n_embd, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_eps)
        self.ffn_norm = RMSNorm(c.n_embd, c.rms_eps)
        self.gate = nn.Linear(c.n_embd, c.n_ff, bias=False)
        self.up = nn.Linear(c.n_embd, c.n_ff, bias=False)
        self.down = nn.Linear(c.n_ff, c.n_embd, bias=False)
        self.attn_post_norm = RMSNorm(c.n_embd, c.rms_eps) if c.post_norms else None
        self.ffn_post_norm = RMSNorm(c.n_embd, c.rms_eps) if c.post_norms else None

    def context_kv(self, g: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V injected from the fused context g: [T, n_embd] -> [T, n_kv, hd] each."""
        c = self.c
        k = self.k_norm(self.wk(g).view(*g.shape[:-1], c.n_head_kv, c.head_dim))
        v = self.wv(g).view(*g.shape[:-1], c.n_head_kv, c.head_dim)
        return rope_neox(k, pos, c.rope_base), v

    def forward(self, h: torch.Tensor, pos: torch.Tensor, k_ctx: torch.Tensor, v_ctx: torch.Tensor,
                ctx_mask: torch.Tensor) -> torch.Tensor:
        """h: [N, B, n_embd] blocks at positions pos [N, B]; k_ctx/v_ctx: [T, n_kv, hd];
        ctx_mask: [N, T] True where block n may see context position t."""
        c = self.c
        n, b, _ = h.shape
        x = self.attn_norm(h)
        q = rope_neox(self.q_norm(self.wq(x).view(n, b, c.n_head, c.head_dim)), pos, c.rope_base)
        k = rope_neox(self.k_norm(self.wk(x).view(n, b, c.n_head_kv, c.head_dim)), pos, c.rope_base)
        v = self.wv(x).view(n, b, c.n_head_kv, c.head_dim)
        rep = c.n_head // c.n_head_kv
        scale = 1.0 / math.sqrt(c.head_dim)
        qh = q.permute(0, 2, 1, 3)  # [N, H, B, D]
        kc = k_ctx.repeat_interleave(rep, dim=1).permute(1, 0, 2)  # [H, T, D]
        vc = v_ctx.repeat_interleave(rep, dim=1).permute(1, 0, 2)
        kb = k.repeat_interleave(rep, dim=2).permute(0, 2, 1, 3)  # [N, H, B, D]
        vb = v.repeat_interleave(rep, dim=2).permute(0, 2, 1, 3)
        s_ctx = torch.einsum("nhbd,htd->nhbt", qh, kc) * scale
        s_ctx = s_ctx.masked_fill(~ctx_mask[:, None, None, :], float("-inf"))
        s_blk = torch.einsum("nhbd,nhcd->nhbc", qh, kb) * scale
        p = torch.softmax(torch.cat([s_ctx, s_blk], dim=-1), dim=-1)
        t = k_ctx.shape[0]
        o = torch.einsum("nhbt,htd->nhbd", p[..., :t], vc) + torch.einsum("nhbc,nhcd->nhbd", p[..., t:], vb)
        o = self.wo(o.permute(0, 2, 1, 3).reshape(n, b, c.n_head * c.head_dim))
        if self.attn_post_norm is not None:
            o = self.attn_post_norm(o)
        h = h + o
        f = self.ffn_norm(h)
        act = F.gelu(self.gate(f), approximate="tanh") if c.activation == "gelu" else F.silu(self.gate(f))
        f = self.down(act * self.up(f))
        if self.ffn_post_norm is not None:
            f = self.ffn_post_norm(f)
        return h + f


class Drafter(nn.Module):
    """Trainable parts: fc, hidden_norm, layers, output_norm. Frozen: the
    target's token embeddings and the (reduced) output head."""

    def __init__(self, c: DrafterConfig, tok_embd: torch.Tensor, head: torch.Tensor, d2t: torch.Tensor):
        super().__init__()
        self.c = c
        self.fc = nn.Linear(len(c.target_layers) * c.n_embd, c.n_embd, bias=False)
        self.hidden_norm = RMSNorm(c.n_embd, c.rms_eps)
        self.layers = nn.ModuleList(DrafterLayer(c) for _ in range(c.n_layer))
        self.output_norm = RMSNorm(c.n_embd, c.rms_eps)
        self.register_buffer("tok_embd", tok_embd, persistent=False)  # [n_vocab, n_embd], frozen
        self.register_buffer("head", head, persistent=False)  # [n_draft_vocab, n_embd], frozen
        # draft row -> target token id; saved with checkpoints so a resume can check it
        self.register_buffer("d2t", d2t.to(torch.long))
        t2d = torch.full((tok_embd.shape[0],), -1, dtype=torch.long)
        t2d[d2t] = torch.arange(len(d2t))
        self.register_buffer("t2d", t2d, persistent=False)

    def fuse(self, feats: torch.Tensor) -> torch.Tensor:
        return self.hidden_norm(self.fc(feats))

    def forward(self, feats: torch.Tensor, anchors: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """feats: [T, n_taps*n_embd] target features of one sequence (positions 0..T-1);
        anchors: [N] anchor positions; tokens: [N, B] block tokens ([anchor, mask...]).
        Returns draft-vocabulary logits [N, B, n_draft_vocab]; block n sees context < anchors[n]."""
        t = feats.shape[0]
        g = self.fuse(feats)
        ctx_pos = torch.arange(t, device=feats.device)
        b = tokens.shape[1]
        pos = anchors[:, None] + torch.arange(b, device=feats.device)[None, :]
        ctx_mask = ctx_pos[None, :] < anchors[:, None]
        h = self.tok_embd[tokens] * self.c.embedding_scale
        for layer in self.layers:
            k_ctx, v_ctx = layer.context_kv(g, ctx_pos)
            h = layer(h, pos, k_ctx, v_ctx, ctx_mask)
        return self.output_norm(h) @ self.head.T

    def trainable_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad)
