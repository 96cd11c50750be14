"""A plan in words: what goes where, why, what it costs on the bus, and what
to change when it does not fit."""

from __future__ import annotations

from app.scheduler.plan import DevicePlan, SplitPlan, gib


def _size(n: int) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / 1024:.1f} KiB"


def _layers(d: DevicePlan) -> str:
    parts = []
    if d.n_layers:
        parts.append(f"layers {d.first_layer}-{d.first_layer + d.n_layers - 1}")
    if d.has_output:
        parts.append("output head")
    if d.holds_drafter:
        parts.append("drafter")
    return " + ".join(parts) or "nothing"


def _bytes_line(d: DevicePlan) -> str:
    b = d.bytes
    parts = [f"weights {_size(b.weights)}", f"KV {_size(b.kv)}", f"compute {_size(b.compute)}"]
    if b.drafter:
        parts.append(f"drafter {_size(b.drafter)} (weights {_size(b.drafter_weights)}, KV {_size(b.drafter_kv)}, "
                     f"compute {_size(b.drafter_compute)})")
    if b.host_buffers:
        parts.append(f"host buffers {_size(b.host_buffers)}")
    if b.margin:
        parts.append(f"margin {_size(b.margin)}")
    return " | ".join(parts) + f" = {_size(b.total)} of {_size(d.memory_free)} free"


def explain(plan: SplitPlan) -> list[str]:
    """Human-readable lines describing `plan`."""
    t, dr = plan.target, plan.drafter
    out = [f"target: {t.name} ({t.arch}, {t.n_layer} layers, {_size(t.weight_bytes)} of weights), "
           f"context {plan.n_ctx}, KV {plan.kv_type}"]
    if dr is not None:
        out.append(f"drafter: {dr.name} ({dr.n_layer} layers, {_size(dr.weight_bytes)}), block {dr.block_size}, "
                   f"{len(dr.target_layers)} taps")
    if plan.n_rs_seq:
        out.append(f"recurrent state keeps {plan.n_rs_seq} rollback snapshots per layer (one per draft token)")
    verdict = "fits" if plan.fits else "does NOT fit"
    what = {"cpu": "everything on the CPU", "single": f"everything on {plan.devices[-1].name}" if plan.devices else "",
            "proportional": "layers split in proportion to each card's room after its fixed costs",
            "speed": "the faster card filled first", "override": "layers split by the user's ratio"}[plan.strategy]
    offload = {"none": "no GPU offload", "full": "full offload", "partial": "partial offload"}[plan.offload]
    out.append(f"plan: {what}; {offload}; {verdict}")
    names = ", ".join(d.name for d in plan.devices) or "-"
    out.append(f"llama.cpp: n_gpu_layers {plan.n_gpu_layers}, split_mode {plan.split_mode}, devices [{names}], "
               f"tensor_split {plan.tensor_split or '-'}, main_gpu {plan.main_gpu}"
               + (f", pipelined ({plan.pipeline_copies} input copies)" if plan.pipeline_copies > 1 else ""))
    for d in [*plan.devices, plan.host]:
        label = d.name if d.kind == "gpu" else "CPU / RAM"
        speed = f", {d.bandwidth_gbs:.0f} GB/s" if d.bandwidth_gbs else ""
        out.append(f"  {label}{speed}: {_layers(d)}")
        out.append(f"    {_bytes_line(d)}" + ("" if d.fits else "  <- OVER"))
    out += _why(plan)
    tr = plan.traffic
    if tr.get("boundaries"):
        us = tr.get("boundary_us_per_token")
        out.append(f"PCIe at the split ({', '.join(tr['boundaries'])}, via {tr['via']}): "
                   f"{_size(tr['boundary_bytes_per_token'])} per token"
                   + (f" (~{us} us)" if us else "")
                   + f", {_size(tr['boundary_bytes_per_block'])} per verify block of {tr['block_tokens']}")
    if plan.devices:
        us = tr.get("host_us_per_block")
        out.append(f"host <-> GPU per verify block: {_size(tr['host_bytes_per_block'])}"
                   + (f" (~{us} us at {tr['link_gbs']:.0f} GB/s)" if us else "")
                   + " - mostly full-vocabulary logits read back for the argmax")
    out += [f"idle: {x}" for x in plan.idle]
    out += [f"warning: {w}" for w in plan.warnings]
    out += [f"problem: {p}" for p in plan.problems]
    out += [f"advice: {a.message}" + ("" if a.fits else " (still not enough)") for a in plan.advice]
    return out


def _why(plan: SplitPlan) -> list[str]:
    lines = []
    if plan.drafter_plan is not None:
        lines.append(f"why the drafter is there: {plan.drafter_plan.reason}")
    gpus = plan.devices
    if plan.strategy == "proportional":
        lines.append("why this split: equal-speed cards; each gets layers in proportion to the room left after "
                     "its compute buffers, margin" + (", head and drafter" if plan.drafter else " and head"))
    elif plan.strategy == "speed":
        fast = gpus[-1]
        lines.append(f"why this split: {fast.name} is the fastest card ({fast.bandwidth_gbs:.0f} GB/s); it holds "
                     f"the head{' and the drafter' if plan.drafter else ''} and is filled first "
                     f"({fast.n_layers} of {plan.target.n_layer} layers), the rest goes to the slower card(s)")
    if plan.offload == "partial":
        lines.append(f"why partial: the GPUs cannot hold all {plan.target.n_layer} layers; the first "
                     f"{plan.n_cpu_layers} stay on the CPU ({gib(plan.host.bytes.weights)} GiB in RAM)")
    return lines
