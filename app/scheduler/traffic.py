"""PCIe traffic of a plan: what crosses the bus per generated token and per
DFlash verify block, at the split boundaries and between host and cards.

With a layer split the f32 residual row of every token crosses each device
boundary once; without NVLink (or P2P) it goes card -> host -> card. The
engine also reads logits (every output row, n_vocab floats) and the tapped
hidden states back to the host, and injects the taps into the drafter.
"""

from __future__ import annotations

from app.scheduler.plan import SplitPlan

NVLINK_GBS = 50.0  # one direction of a consumer NVLink bridge (RTX 3090: 56 GB/s), rounded down


def _us(n_bytes: int, gbs: float | None) -> float | None:
    return None if not gbs else round(n_bytes / (gbs * 1e9) * 1e6, 1)


def plan_traffic(plan: SplitPlan) -> dict:
    """Bytes (and microseconds at the slowest link involved) per token and per verify block."""
    t, d = plan.target, plan.drafter
    E4, V4 = t.n_embd * 4, t.n_vocab * 4
    B = d.block_size if d else 1  # tokens per verify block: the anchor + block_size - 1 drafts
    n_taps = len(d.target_layers) if d else 0
    used = [dev for dev in plan.devices if dev.n_layers or dev.has_output]
    # consecutive devices that both hold layers: the residual stream crosses between them
    chain = ([plan.host] if plan.host.n_layers else []) + used
    boundaries = [(a.name, b.name) for a, b in zip(chain, chain[1:], strict=False)]
    gpu_boundaries = [(a, b) for a, b in zip(used, used[1:], strict=False)]
    links = [dev.spec.pcie_gbs() for dev in used if dev.spec is not None and dev.spec.pcie_gbs()]
    host_gbs = min(links) if links else None
    nvlink = bool(gpu_boundaries) and all(a.spec is not None and a.spec.nvlink and b.spec is not None
                                          and b.spec.nvlink for a, b in gpu_boundaries)
    # card -> host -> card: each boundary row crosses two PCIe links unless NVLink carries it
    hop_gbs = NVLINK_GBS if nvlink else (host_gbs / 2 if host_gbs else None)

    boundary_tok = len(boundaries) * E4
    host_tok = (E4 + V4) if used else 0  # embeddings in, one logits row out
    out: dict = {
        "boundaries": [f"{a} -> {b}" for a, b in boundaries],
        "via": "nvlink" if nvlink else ("pcie" if boundaries else None),
        "boundary_bytes_per_token": boundary_tok,
        "boundary_bytes_per_block": boundary_tok * B,
        "host_bytes_per_token": host_tok,
        "block_tokens": B,
    }
    if d is not None and used:
        verify = B * (E4 + V4)  # embeddings in, logits of every block row out
        taps = 2 * n_taps * E4 * B  # hidden states out to the host, injected into the drafter
        draft = B * (E4 + V4)  # the drafter's block: embeddings in, logits out
        out.update(host_bytes_per_block=verify + taps + draft,
                   host_bytes_per_block_parts={"verify": verify, "taps": taps, "draft": draft})
    else:
        out["host_bytes_per_block"] = host_tok * B
    out["boundary_us_per_token"] = _us(boundary_tok, hop_gbs)
    out["boundary_us_per_block"] = _us(boundary_tok * B, hop_gbs)
    out["host_us_per_block"] = _us(out["host_bytes_per_block"], host_gbs)
    out["link_gbs"] = host_gbs
    return out
