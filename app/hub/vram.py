"""VRAM a catalog pair needs at a given context.

Two sources, best first:
- "scheduler": both GGUFs are on disk, so the layer-split planner
  (app.scheduler) sizes them from their headers on a hypothetical card big
  enough for everything; the answer is what llama.cpp would allocate on it.
- "catalog": the files are not here yet, so a small formula works from the
  catalog's published architecture numbers and file sizes: weights (file
  sizes) + f16 KV cache (sliding-window layers hold window + ubatch cells,
  recurrent layers none) + the drafter's KV + logits buffers (the target's
  twice with the argmax on the GPU). It is an
  estimate; the entry's sizes may themselves be approximate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from app.engine.dflash import backend_greedy_on
from app.errors import ModelLoadError
from app.hub.catalog import CatalogEntry
from app.scheduler.errors import PlanInputError
from app.scheduler.inventory import HostSpec, Inventory, parse_gpu_spec
from app.scheduler.memory import logit_buffers
from app.scheduler.plan import PlanRequest
from app.scheduler.planner import plan_split

N_UBATCH = 512  # the engine's target batch
N_UBATCH_DRAFTER = 256  # the engine's drafter batch (engine: min(256, n_batch))
_F16 = 2


@dataclass(frozen=True)
class VramEstimate:
    n_ctx: int
    total: int
    weights: int
    kv: int
    compute: int
    drafter: int
    source: str  # "scheduler" | "catalog"
    approximate: bool

    def text(self) -> str:
        return f"{'~' if self.approximate else ''}{self.total / 2**30:.1f} GiB"

    def to_dict(self) -> dict:
        return asdict(self)


def _pad(x: int, n: int = 256) -> int:
    return (x + n - 1) // n * n


def _layer_cells(entry: CatalogEntry, n_ctx: int) -> list[int]:
    """KV cells per target layer (0 for recurrent layers)."""
    a = entry.arch
    cells = []
    for il in range(a.n_layer):
        if a.full_attention_interval and (il + 1) % a.full_attention_interval:
            cells.append(0)  # a gated-delta-net layer keeps a small recurrent state, no KV
        elif a.sliding_window and a.swa_period and (il + 1) % a.swa_period:
            cells.append(min(n_ctx, _pad(a.sliding_window + N_UBATCH)))
        else:
            cells.append(n_ctx)
    return cells


def estimate_from_catalog(entry: CatalogEntry, n_ctx: int) -> VramEstimate:
    """The formula above, from catalog numbers only."""
    a, d = entry.arch, entry.drafter_arch
    n_ctx = _pad(min(n_ctx, a.n_ctx_train) if a.n_ctx_train else n_ctx)
    kv = sum(c * a.n_head_kv * a.head_dim * 2 * _F16 for c in _layer_cells(entry, n_ctx))
    d_kv = d.n_layer * n_ctx * d.n_head_kv * d.head_dim * 2 * _F16
    weights = entry.target.size_bytes or 0
    d_weights = entry.drafter.size_bytes or 0
    # f32 logits of a full batch on both contexts (the target's twice where the argmax runs on the GPU:
    # llama.cpp's backend sampler keeps a second buffer of them), plus the target's FFN activations
    logits = logit_buffers(backend_greedy_on(True)) * N_UBATCH * a.n_vocab
    compute = (logits + (3 * a.n_ff + 2 * a.n_embd) * N_UBATCH) * 4
    d_compute = N_UBATCH_DRAFTER * a.n_vocab * 4
    drafter = d_weights + d_kv + d_compute
    approx = not (entry.target.size_verified and entry.drafter.size_verified)
    return VramEstimate(n_ctx, weights + kv + compute + drafter, weights, kv, compute, drafter, "catalog", approx)


def estimate_from_files(target: Path, drafter: Path | None, n_ctx: int) -> VramEstimate:
    """The scheduler's plan on one hypothetical card that fits everything."""
    inv = Inventory(gpus=(parse_gpu_spec("estimate:4096GiB"),), host=HostSpec(ram_total=2**40, ram_free=2**40),
                    sources=("hypothetical",))
    plan = plan_split(target, drafter, inv, PlanRequest(n_ctx=n_ctx, margin=0, advise=False))
    b = plan.devices[0].bytes
    return VramEstimate(plan.n_ctx, b.used, b.weights, b.kv, b.compute, b.drafter, "scheduler", False)


def estimate_vram(entry: CatalogEntry, n_ctx: int, target: Path | None = None,
                  drafter: Path | None = None) -> VramEstimate:
    """The scheduler's figure when both files are local, else the catalog formula."""
    if target is not None and drafter is not None:
        try:
            return estimate_from_files(target, drafter, n_ctx)
        except (PlanInputError, ModelLoadError):  # a file the planner cannot size: the catalog's formula
            pass
    return estimate_from_catalog(entry, n_ctx)
