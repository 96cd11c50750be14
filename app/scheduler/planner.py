"""The layer-split planner: pure, fast, from GGUF headers and an inventory.

Decisions, in order:
  1. the output device is the fastest GPU (ties: the one with most free memory);
     the output head lives there, so the DFlash drafter, which reuses the head
     through ctx_other, runs there too (llama.cpp aborts otherwise)
  2. if everything fits on that one card, use it alone: a layer split adds a
     PCIe hop per token and makes nothing faster
  3. otherwise split across all GPUs, layers contiguous, the output device last:
     - cards of equal speed: layers in proportion to what each card can hold
       after its fixed costs (compute buffers, margin, head, drafter)
     - cards of different speed: fill the faster cards first, so the larger
       share of the bytes read per token sits on the faster card
  4. if the GPUs cannot hold every layer: partial offload, the first layers on
     the CPU (llama.cpp's n_gpu_layers), as few as possible
  5. what does not fit is reported per device, with checked advice (advice.py)
"""

from __future__ import annotations

from pathlib import Path

from app.engine.dflash import backend_greedy_on, drafter_context, max_draft
from app.scheduler import memory as mem
from app.scheduler.advice import advise
from app.scheduler.errors import PlanInputError
from app.scheduler.inventory import DeviceSpec, Inventory
from app.scheduler.plan import DeviceBytes, DevicePlan, DrafterPlan, PlanRequest, SplitPlan, gib
from app.scheduler.profile import ModelProfile, read_profile
from app.scheduler.traffic import plan_traffic

SAME_SPEED = 0.05  # bandwidths within 5% count as equal


def _load(p: ModelProfile | str | Path | None) -> ModelProfile | None:
    if p is None or isinstance(p, ModelProfile):
        return p
    return read_profile(p)


def _speed(g: DeviceSpec) -> float:
    return g.bandwidth_gbs or 0.0


def _same_speed(gpus: list[DeviceSpec]) -> bool:
    speeds = [_speed(g) for g in gpus]
    return min(speeds) <= 0 or max(speeds) <= min(speeds) * (1 + SAME_SPEED)


class _Planner:
    def __init__(self, target: ModelProfile, drafter: ModelProfile | None, inv: Inventory, req: PlanRequest):
        self.t, self.d, self.inv, self.req = target, drafter, inv, req
        self.warnings: list[str] = list(target.warnings)
        if req.n_ctx <= 0:
            raise PlanInputError(f"the context length must be positive, got {req.n_ctx}")
        if req.drafter_window is not None and req.drafter_window < 0:
            raise PlanInputError(f"drafter window {req.drafter_window}: expected 0 (unbounded) or a positive count")
        mem.ggml_type(req.kv_type)
        n_ctx = req.n_ctx
        if target.n_ctx_train and n_ctx > target.n_ctx_train:
            # the engine clamps to the training context; plan what it will load
            self.warnings.append(f"{target.path.name}: context {n_ctx} is beyond its training context "
                                 f"{target.n_ctx_train}; the engine loads {target.n_ctx_train}")
            n_ctx = target.n_ctx_train
        n_rs_seq = req.n_rs_seq
        if n_rs_seq is None:
            # a speculative step rolls back up to the longest draft's rejected tokens: one snapshot each
            # (the engine asks for as many; the lookup drafts without a drafter too)
            n_rs_seq = max_draft(drafter.block_size if drafter else None) if target.rs_rollback else 0
        # the engine samples greedily in the graph where the output layer is on a GPU (Engine.backend_greedy)
        self.sampled = backend_greedy_on(True)
        self.cs = mem.ContextShape.make(n_ctx, req.n_batch, req.n_ubatch or req.n_batch,
                                        type_k=req.kv_type, type_v=req.kv_type, n_rs_seq=n_rs_seq)
        for ly in target.layers:
            if ly.kind != "recurrent":
                mem.row_bytes(req.kv_type, ly.n_embd_k)  # raises a clear error for incompatible widths
        self.cost = [ly.weights + mem.layer_cache_bytes(target, i, self.cs) for i, ly in enumerate(target.layers)]
        self.dcs = None
        if drafter is not None:
            # the engine's drafter context: non-causal, ubatch max(block, min(256, n_batch)), f16 cache, its
            # cells the window's (Engine._open_drafter_context)
            ub = max(drafter.block_size, min(256, req.n_batch))
            window = drafter.window if req.drafter_window is None else req.drafter_window
            self.dcs = mem.ContextShape.make(drafter_context(self.cs.n_ctx, window), ub, ub, causal=False)

    # --- the drafter's bytes -----------------------------------------------------
    def drafter_bytes(self, on_gpu: bool) -> tuple[int, int, int]:
        """(weights, kv, compute) of the drafter on its device."""
        d = self.d
        assert d is not None and self.dcs is not None
        weights = d.layer_bytes + d.output_bytes + (0 if on_gpu else d.input_bytes)
        if not on_gpu:
            weights += sum(ly.cpu_copy for ly in d.layers) + d.output_cpu_copy
        kv = sum(mem.layer_cache_bytes(d, i, self.dcs) for i in range(d.n_layer))
        vocab = d.n_vocab if d.has_own_head and d.n_vocab else self.t.n_vocab
        compute = mem.device_compute(d, self.dcs, range(d.n_layer), True, 1, n_vocab=vocab)
        return weights, kv, compute

    def taps_in(self, layers: range) -> int:
        """Taps produced by these layers: the input of layer lid is the output of layer lid-1."""
        if self.d is None:
            return 0
        return sum(1 for lid in self.d.target_layers if lid - 1 in layers)

    def drafter_index(self, gpus: list[DeviceSpec]) -> int:
        """Which GPU runs the drafter: the output device unless the request pins another."""
        if self.d is None or not gpus:
            return -1
        want = self.req.drafter_device
        if want is not None and want not in [g.name for g in self.inv.gpus]:
            raise PlanInputError(f"no GPU named {want!r} for the drafter; have "
                                 f"{', '.join(g.name for g in self.inv.gpus) or 'none'}")
        if want is None:
            return len(gpus) - 1
        for j, g in enumerate(gpus):
            if g.name == want:
                return j
        return len(gpus) - 1  # not among these cards (a partial search): with the head

    def own_head_bytes(self, on_output_device: bool) -> int:
        """Away from the target's head, a head-sharing drafter needs its own copy of it."""
        d = self.d
        if d is None or on_output_device or d.has_own_head:
            return 0
        return self.t.head_bytes

    # --- building a plan from layer counts ---------------------------------------
    def copies(self, gpus: list[DeviceSpec], n_cpu: int) -> int:
        # llama.cpp pipelines only a full offload over 2+ devices that all do async + events
        if len(gpus) > 1 and n_cpu == 0 and all(g.pipeline_capable for g in gpus):
            return mem.PIPELINE_COPIES
        return 1

    def build(self, gpus: list[DeviceSpec], counts: list[int], n_cpu: int, strategy: str) -> SplitPlan:
        t, d, cs = self.t, self.d, self.cs
        copies = self.copies(gpus, n_cpu)
        devs: list[DevicePlan] = []
        start = n_cpu
        dj = self.drafter_index(gpus)
        for j, (g, n) in enumerate(zip(gpus, counts, strict=True)):
            out = j == len(gpus) - 1
            rng = range(start, start + n)
            b = DeviceBytes(weights=sum(t.layers[i].weights for i in rng) + (t.output_bytes if out else 0),
                            kv=sum(mem.layer_cache_bytes(t, i, cs) for i in rng),
                            compute=mem.device_compute(t, cs, rng, out, copies, n_taps=self.taps_in(rng),
                                                       sampled=out and self.sampled),
                            margin=self.req.margin)
            if j == dj:
                b.drafter_weights, b.drafter_kv, b.drafter_compute = self.drafter_bytes(True)
                b.drafter_weights += self.own_head_bytes(out)
            devs.append(DevicePlan(g.name, "gpu", g.memory_total, g.memory_free, start, n, out, j == dj,
                                   b, g.bandwidth_gbs, g))
            start += n
        host = self.host_plan(devs, n_cpu, copies)
        n_gpu_layers = (t.n_layer + 1 - n_cpu) if gpus else 0
        plan = SplitPlan(
            target=t, drafter=d, n_ctx=cs.n_ctx, kv_type=cs.type_k, n_batch=cs.n_batch, n_ubatch=cs.n_ubatch,
            n_rs_seq=cs.n_rs_seq, devices=devs, host=host, n_gpu_layers=n_gpu_layers,
            split_mode="layer" if gpus else "none",
            # layer counts reproduce llama.cpp's split exactly: it cuts at cumulative fractions of n_gpu_layers
            tensor_split=[float(dv.n_layers + (1 if dv.has_output else 0)) for dv in devs] if len(devs) > 1 else [],
            main_gpu=len(devs) - 1 if devs else 0, pipeline_copies=copies, strategy=strategy,
            warnings=list(self.warnings))
        if d is not None:
            plan.drafter_plan = self.drafter_plan(plan)
        plan.problems = self.problems(plan)
        plan.traffic = plan_traffic(plan)
        return plan

    def host_plan(self, devs: list[DevicePlan], n_cpu: int, copies: int) -> DevicePlan:
        t, d, cs, host = self.t, self.d, self.cs, self.inv.host
        cpu_layers = range(0, n_cpu if devs else t.n_layer)
        cpu_out = not devs
        b = DeviceBytes(weights=t.input_bytes + sum(t.layers[i].weights + t.layers[i].cpu_copy for i in cpu_layers),
                        kv=sum(mem.layer_cache_bytes(t, i, cs) for i in cpu_layers),
                        compute=mem.host_compute(t, cs, copies, cpu_layers, cpu_out)
                        + self.taps_in(range(-1, cpu_layers.stop)) * t.n_embd * cs.n_ubatch * 4)
        if cpu_out:
            # a tied head is the mapped token_embd itself, plus its repacked copy where the CPU makes one
            b.weights += t.output_bytes - (t.head_bytes if t.tied_output else 0) + t.output_cpu_copy
        n_out_rows = d.block_size if d is not None else 1
        b.host_buffers = n_out_rows * t.n_vocab * 4  # the target's logits rows the engine reads
        if d is not None and self.dcs is not None:
            b.host_buffers += n_out_rows * t.n_vocab * 4 + len(d.target_layers) * t.n_embd * cs.n_batch * 4
            if devs:
                b.weights += d.input_bytes
                b.compute += mem.host_compute(d, self.dcs, 1, [], False, drafter=True)
            else:
                # on the CPU alone the drafter's inputs and work share one buffer (the device rule)
                b.drafter_weights, b.drafter_kv, b.drafter_compute = self.drafter_bytes(False)
        return DevicePlan("CPU", "cpu", host.ram_total, host.ram_free, 0, len(cpu_layers), cpu_out,
                          d is not None and not devs, b)

    def drafter_plan(self, plan: SplitPlan) -> DrafterPlan:
        d = self.d
        assert d is not None
        where = next((dv for dv in plan.devices if dv.holds_drafter), plan.host)
        b = where.bytes
        own = self.own_head_bytes(where.has_output) if plan.devices else 0
        if not plan.devices:
            reason = "no GPU: the drafter runs on the CPU next to the target"
        elif where.has_output:
            reason = (f"on {where.name}, the device that holds the target's output head, which the drafter "
                      f"{'could replace with its own' if d.has_own_head else 'shares through ctx_other'}")
        else:
            reason = (f"on {where.name}, away from the target's output head ({plan.devices[-1].name}): "
                      + ("it uses its own head" if d.has_own_head else
                         f"it needs a self-contained drafter GGUF with its own token_embd and output "
                         f"({gib(own)} GiB more there); llama.cpp aborts if it must reach the target's"))
        return DrafterPlan(device=where.name, shares_head=not d.has_own_head and (where.has_output or not plan.devices),
                           needs_own_head=own > 0, own_head_bytes=own, weights=b.drafter_weights, kv=b.drafter_kv,
                           compute=b.drafter_compute, n_ubatch=self.dcs.n_ubatch if self.dcs else 0, reason=reason,
                           n_ctx=self.dcs.n_ctx if self.dcs else 0)

    def problems(self, plan: SplitPlan) -> list[str]:
        out = []
        for dv in plan.devices:
            if not dv.fits:
                b = dv.bytes
                out.append(f"{dv.name}: needs {gib(b.used)} GiB (weights {gib(b.weights)}, KV {gib(b.kv)}, "
                           f"compute {gib(b.compute)}, drafter {gib(b.drafter)}) plus a {gib(b.margin)} GiB margin, "
                           f"but has {gib(dv.memory_free)} GiB free: {gib(-dv.headroom)} GiB short")
        h = plan.host
        if h.memory_free and h.bytes.used > h.memory_free:
            out.append(f"host RAM: needs {gib(h.bytes.used)} GiB (weights {gib(h.bytes.weights)}, "
                       f"KV {gib(h.bytes.kv)}, buffers {gib(h.bytes.compute + h.bytes.host_buffers)}, "
                       f"drafter {gib(h.bytes.drafter)}) but {gib(h.memory_free)} GiB is available")
        return out

    # --- distributing layers -----------------------------------------------------
    def capacities(self, gpus: list[DeviceSpec], n_cpu: int) -> list[int]:
        """Bytes each GPU has left for layers after its fixed costs."""
        copies = self.copies(gpus, n_cpu)
        rest = range(n_cpu, self.t.n_layer)
        caps = []
        dj = self.drafter_index(gpus)
        for j, g in enumerate(gpus):
            out = j == len(gpus) - 1
            fixed = self.req.margin + mem.device_compute(self.t, self.cs, rest, out, copies,
                                                         sampled=out and self.sampled)
            if out:
                fixed += self.t.output_bytes
            if j == dj:
                fixed += sum(self.drafter_bytes(True)) + self.own_head_bytes(out)
            caps.append(g.memory_free - fixed)
        return caps

    def distribute(self, gpus: list[DeviceSpec], n_cpu: int, mode: str,
                   shares: list[float] | None = None) -> list[int]:
        cost = self.cost[n_cpu:]
        n, k = len(cost), len(gpus)
        if k == 1:
            return [n]
        caps = self.capacities(gpus, n_cpu)
        if mode == "speed":
            counts = [0] * k
            end = n
            for j in range(k - 1, 0, -1):  # the fastest card is last: fill from the end
                used = 0
                while end > 0 and used + cost[end - 1] <= caps[j]:
                    end -= 1
                    used += cost[end]
                    counts[j] += 1
            counts[0] = end
            return self.repair(counts, cost, caps)
        weights = shares if shares is not None else [max(c, 0) for c in caps]
        if sum(weights) <= 0:
            weights = [1.0] * k
        total = sum(cost)
        if shares is None and total > sum(weights):
            # it cannot fit: spread the overflow in proportion too, so every card reports its share of it
            shares = weights
        counts, start = [], 0
        for j in range(k - 1):
            goal = total * weights[j] / sum(weights)
            end, used = start, 0
            # nearest boundary to the goal (never past the card's room unless overriding)
            while end < n and used + cost[end] / 2 <= goal and (shares is not None or used + cost[end] <= caps[j]):
                used += cost[end]
                end += 1
            counts.append(end - start)
            start = end
        counts.append(n - start)
        return counts if shares is not None else self.repair(counts, cost, caps)

    @staticmethod
    def repair(counts: list[int], cost: list[int], caps: list[int]) -> list[int]:
        """Move boundary layers off overflowing cards onto neighbours with room."""
        counts = list(counts)

        def load(j: int) -> int:
            s = sum(counts[:j])
            return sum(cost[s:s + counts[j]])

        for _ in range(len(cost) * len(counts)):
            over = [j for j in range(len(counts)) if load(j) > caps[j] and counts[j] > 0]
            if not over:
                break
            j = over[0]
            first, last = sum(counts[:j]), sum(counts[:j]) + counts[j] - 1
            if j > 0 and load(j - 1) + cost[first] <= caps[j - 1]:
                counts[j - 1] += 1
                counts[j] -= 1
            elif j < len(counts) - 1 and load(j + 1) + cost[last] <= caps[j + 1]:
                counts[j + 1] += 1
                counts[j] -= 1
            else:
                break
        return counts

    # --- choosing --------------------------------------------------------------
    def ordered_gpus(self) -> list[DeviceSpec]:
        gpus = list(self.inv.gpus)
        # ties go to the last card, as llama.cpp's own default puts the output there
        out = max(reversed(gpus), key=lambda g: (_speed(g), g.memory_free))
        others = sorted((g for g in gpus if g is not out), key=_speed)  # stable: inventory order on ties
        return [*others, out]

    def split_plan(self, gpus: list[DeviceSpec], n_cpu: int) -> SplitPlan:
        if len(gpus) == 1:
            return self.build(gpus, [self.t.n_layer - n_cpu], n_cpu, "single")
        mode = "proportional" if _same_speed(gpus) else "speed"
        return self.build(gpus, self.distribute(gpus, n_cpu, mode), n_cpu, mode)

    def gpus_fit(self, plan: SplitPlan) -> bool:
        return all(dv.fits for dv in plan.devices)

    def partial(self, gpus: list[DeviceSpec]) -> SplitPlan | None:
        """The plan with the fewest layers on the CPU whose GPUs all fit."""
        lo, hi = 1, self.t.n_layer
        if not self.gpus_fit(self.split_plan(gpus, hi)):
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            if self.gpus_fit(self.split_plan(gpus, mid)):
                hi = mid
            else:
                lo = mid + 1
        return self.split_plan(gpus, lo)

    def plan(self) -> SplitPlan:
        req, t = self.req, self.t
        if not self.inv.gpus or req.n_gpu_layers == 0:
            return self.build([], [], t.n_layer, "cpu")
        if req.split is not None:
            return self.override()
        gpus = self.ordered_gpus()
        if req.n_gpu_layers is not None:
            n_cpu = max(0, t.n_layer + 1 - req.n_gpu_layers)
            if n_cpu >= t.n_layer + 1:
                return self.build([], [], t.n_layer, "cpu")
            return self.split_plan(gpus, min(n_cpu, t.n_layer))
        # a drafter pinned to another card needs that card in the plan
        single = self.split_plan(gpus[-1:], 0) if self.req.drafter_device in (None, gpus[-1].name) else None
        if single is not None and (single.fits or len(gpus) == 1):
            best = single
        else:
            best = self.split_plan(gpus, 0)
        if best.fits:
            if best is single and len(gpus) > 1:
                best.idle = [f"{g.name}: not needed; everything fits on {gpus[-1].name}, and a layer split would "
                             f"only add a PCIe hop per token" for g in gpus[:-1]]
            return best
        if req.allow_partial:
            part = self.partial(gpus)
            if part is not None and part.fits:
                return part
        return best

    def override(self) -> SplitPlan:
        shares = list(self.req.split or ())
        gpus = list(self.inv.gpus)
        if len(shares) != len(gpus) or any(s < 0 for s in shares) or sum(shares) <= 0:
            raise PlanInputError(f"the split override needs one non-negative share per GPU "
                                 f"({len(gpus)}: {', '.join(g.name for g in gpus)}), got {shares}")
        # the user's order is kept (as llama.cpp's tensor_split): the output goes to the last card with a share
        chosen = [(g, s) for g, s in zip(gpus, shares, strict=True) if s > 0]
        gs, ss = [g for g, _ in chosen], [s for _, s in chosen]
        counts = self.distribute(gs, 0, "override", ss) if len(gs) > 1 else [self.t.n_layer]
        return self.build(gs, counts, 0, "override")


def plan_split(target: ModelProfile | str | Path, drafter: ModelProfile | str | Path | None, inventory: Inventory,
               request: PlanRequest | None = None) -> SplitPlan:
    """Plan where a target (and its DFlash drafter) go on `inventory`; never raises for
    "does not fit" (see plan.problems and plan.advice), only for unusable inputs."""
    req = request or PlanRequest()
    t = _load(target)
    d = _load(drafter) if req.use_drafter else None
    assert t is not None
    if t.is_drafter:
        raise PlanInputError(f"{t.path}: this is a DFlash drafter; pass it as the drafter, not the target")
    if d is not None and not d.is_drafter:
        raise PlanInputError(f"{d.path}: architecture {d.arch!r} is not a DFlash or EAGLE-3 drafter")
    if d is not None and d.n_embd != t.n_embd:
        raise PlanInputError(f"{d.path}: drafter width {d.n_embd} does not match the target's {t.n_embd} "
                             f"({t.path.name})")
    plan = _Planner(t, d, inventory, req).plan()
    if req.advise and (not plan.fits or plan.offload == "partial"):
        def replan(r: PlanRequest, inv: Inventory | None = None, with_drafter: bool = True) -> SplitPlan:
            return plan_split(t, d if with_drafter else None, inv or inventory, r)

        plan.advice = advise(plan, t, d, inventory, req, replan)
    return plan

