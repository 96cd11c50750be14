"""What would make a plan fit, in numbers. Every suggestion is checked by
planning again with the change; only the "more memory" one can be out of
reach, and it says so."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

from app.scheduler import memory as mem
from app.scheduler.inventory import Inventory
from app.scheduler.plan import Advice, PlanRequest, SplitPlan, gib
from app.scheduler.profile import ModelProfile

# KV cache types from largest to smallest; advice only ever suggests smaller ones
KV_LADDER = ("f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0")
SUGGESTED_KV = ("q8_0", "q4_0")

# plans the same pair again with another request, optionally on other devices or without the drafter
Replan = Callable[..., SplitPlan]  # (req, inv=None, with_drafter=True) -> SplitPlan


def _full_fit(plan: SplitPlan) -> bool:
    return plan.fits and plan.offload != "partial"


def _max_context(req: PlanRequest, replan: Replan, lo: int = 256) -> int:
    """The longest context (a multiple of 256, up to the request) that fits fully offloaded."""

    def ok(n_ctx: int) -> bool:
        return _full_fit(replan(replace(req, n_ctx=n_ctx, allow_partial=False, advise=False)))

    hi = req.n_ctx // 256
    if hi < 1 or not ok(lo):
        return 0
    a, b = lo // 256, hi
    while a < b:  # largest k with ok(256 k)
        m = (a + b + 1) // 2
        if ok(256 * m):
            a = m
        else:
            b = m - 1
    return 256 * a


def advise(plan: SplitPlan, target: ModelProfile, drafter: ModelProfile | None, inv: Inventory,
           req: PlanRequest, replan: Replan) -> list[Advice]:
    """Ways to reach a full offload (or any fit) for a plan that is partial or does not fit;
    `replan` plans the same pair on the same devices with another request (each suggestion is
    checked with it)."""
    out: list[Advice] = []
    base = replace(req, advise=False)
    kv_bytes = sum(d.bytes.kv for d in [*plan.devices, plan.host])

    n_ctx = _max_context(base, replan) if inv.gpus else 0
    if 0 < n_ctx < plan.n_ctx:
        p = replan(replace(base, n_ctx=n_ctx, allow_partial=False))
        kv = sum(d.bytes.kv for d in [*p.devices, p.host])
        out.append(Advice("context", f"a context of {n_ctx} tokens instead of {plan.n_ctx} fits on the GPUs "
                                     f"(KV {gib(kv)} GiB instead of {gib(kv_bytes)} GiB)", {"n_ctx": n_ctx}, True))

    cur = KV_LADDER.index(req.kv_type) if req.kv_type in KV_LADDER else 0
    for kv_type in SUGGESTED_KV:
        if KV_LADDER.index(kv_type) <= cur:
            continue
        variant = replace(base, kv_type=kv_type, allow_partial=False)
        p = replan(variant)
        kv = sum(d.bytes.kv for d in [*p.devices, p.host])
        if _full_fit(p):
            out.append(Advice("kv_type", f"--kv {kv_type}: the KV cache takes {gib(kv)} GiB instead of "
                                         f"{gib(kv_bytes)} GiB and everything fits at {plan.n_ctx} tokens",
                              {"kv_type": kv_type}, True))
            break
        m = _max_context(variant, replan) if inv.gpus else 0
        if m > n_ctx:
            out.append(Advice("kv_type", f"--kv {kv_type} with a context of {m} tokens fits on the GPUs",
                              {"kv_type": kv_type, "n_ctx": m}, True))

    if inv.gpus and plan.offload != "partial":
        p = replan(replace(base, allow_partial=True))
        if p.fits and p.offload == "partial":
            cpu_w = sum(target.layers[i].weights for i in range(p.n_cpu_layers))
            out.append(Advice("partial_offload",
                              f"partial offload: n_gpu_layers {p.n_gpu_layers} keeps the first {p.n_cpu_layers} of "
                              f"{target.n_layer} layers ({gib(cpu_w)} GiB of weights) on the CPU, using "
                              f"{gib(p.host.bytes.used)} GiB of RAM; those layers run at host-memory speed, "
                              f"so decoding slows down a lot",
                              {"n_gpu_layers": p.n_gpu_layers}, True))

    if drafter is not None:
        p = replan(replace(base, use_drafter=False, allow_partial=False), with_drafter=False)
        if _full_fit(p):
            d_bytes = sum(d.bytes.drafter for d in [*plan.devices, plan.host])
            out.append(Advice("no_drafter", f"without the drafter ({gib(d_bytes)} GiB) the target alone fits; "
                                            f"decoding is then plain (no speculation)", {"use_drafter": False}, True))

    # a partial plan fits by design: what a full offload would lack is the number to give
    full = plan if plan.offload != "partial" else replan(replace(base, allow_partial=False))
    short = {d.name: -d.headroom for d in full.devices if not d.fits}
    if short:
        bigger = replace(inv, gpus=tuple(replace(g, memory_free=g.memory_free + short.get(g.name, 0),
                                                 memory_total=g.memory_total + short.get(g.name, 0))
                                         for g in inv.gpus))
        ok = _full_fit(replan(replace(base, allow_partial=False), bigger))
        need = ", ".join(f"{gib(v)} GiB more on {k}" for k, v in short.items())
        what = "a full offload" if full is not plan else "this plan"
        out.append(Advice("more_memory", f"{what} needs {need}", {"extra_bytes": short}, ok))
        # "plan before buying": one more card like the biggest one
        card = max(inv.gpus, key=lambda g: g.memory_total)
        model = re.sub(r"#\d+$", "", card.name)
        extra = replace(card, name=f"{model}+", handle=None, description="hypothetical")
        more = replace(inv, gpus=(*inv.gpus, extra))
        p = replan(replace(base, allow_partial=False, split=None), more)
        if _full_fit(p):
            out.append(Advice("add_gpu", f"with one more {model} ({gib(card.memory_total)} GiB) everything fits "
                                         f"on the GPUs", {"gpu": f"{model}:{gib(card.memory_total)}GiB"}, True))
    return out


def kv_type_row(kv_type: str, n: int) -> int:
    """Bytes of one KV row of width n in `kv_type` (for explanations)."""
    return mem.row_bytes(kv_type, n)
