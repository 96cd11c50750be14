"""The planner's answer: where every layer, the output head and the drafter go,
the bytes each device holds, and whether it fits (and if not, what would)."""

from __future__ import annotations

from dataclasses import dataclass, field

from app.scheduler.inventory import DeviceSpec, GiB
from app.scheduler.profile import ModelProfile

SPLIT_MODE_IDS = {"none": 0, "layer": 1, "row": 2}


def gib(n: int) -> float:
    return round(n / GiB, 2)


@dataclass
class DeviceBytes:
    """What one device holds, by kind (the bars of the plan view)."""
    weights: int = 0
    kv: int = 0  # KV cache and recurrent state
    compute: int = 0
    drafter_weights: int = 0
    drafter_kv: int = 0
    drafter_compute: int = 0
    host_buffers: int = 0  # host only: logits and hidden-state buffers llama.cpp keeps for the app
    margin: int = 0

    @property
    def drafter(self) -> int:
        return self.drafter_weights + self.drafter_kv + self.drafter_compute

    @property
    def used(self) -> int:
        """What llama.cpp allocates (everything but the margin)."""
        return self.weights + self.kv + self.compute + self.drafter + self.host_buffers

    @property
    def total(self) -> int:
        return self.used + self.margin

    def to_dict(self) -> dict:
        return {"weights": self.weights, "kv": self.kv, "compute": self.compute,
                "drafter_weights": self.drafter_weights, "drafter_kv": self.drafter_kv,
                "drafter_compute": self.drafter_compute, "host_buffers": self.host_buffers,
                "margin": self.margin, "used": self.used, "total": self.total}


@dataclass
class DevicePlan:
    """One device's share: a contiguous run of layers, maybe the output head and the drafter."""
    name: str
    kind: str  # "gpu" or "cpu"
    memory_total: int
    memory_free: int
    first_layer: int = 0
    n_layers: int = 0
    has_output: bool = False
    holds_drafter: bool = False
    bytes: DeviceBytes = field(default_factory=DeviceBytes)
    bandwidth_gbs: float | None = None
    spec: DeviceSpec | None = field(default=None, repr=False)

    @property
    def layers(self) -> range:
        return range(self.first_layer, self.first_layer + self.n_layers)

    @property
    def headroom(self) -> int:
        return self.memory_free - self.bytes.total

    @property
    def fits(self) -> bool:
        return self.headroom >= 0

    def to_dict(self) -> dict:
        last = self.first_layer + self.n_layers - 1
        return {"name": self.name, "kind": self.kind, "memory_total": self.memory_total,
                "memory_free": self.memory_free, "layers": [self.first_layer, last] if self.n_layers else [],
                "n_layers": self.n_layers, "has_output": self.has_output, "holds_drafter": self.holds_drafter,
                "bytes": self.bytes.to_dict(), "headroom": self.headroom, "fits": self.fits,
                "bandwidth_gbs": self.bandwidth_gbs}


@dataclass
class DrafterPlan:
    """Where the DFlash drafter runs and what it brings along."""
    device: str
    shares_head: bool  # uses the target's token_embd/output through ctx_other
    needs_own_head: bool  # its device lacks the target's output head: a self-contained drafter GGUF is needed
    own_head_bytes: int
    weights: int
    kv: int
    compute: int
    n_ubatch: int
    reason: str
    n_ctx: int = 0  # its cells: the window and some slack (drafter_context), at most the target's context

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Advice:
    """One way to make the plan fit, checked by planning with the change."""
    kind: str  # "context", "kv_type", "partial_offload", "no_drafter", "more_memory"
    message: str
    change: dict
    fits: bool

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class SplitPlan:
    """A complete placement, ready for the engine (see app.scheduler.apply)."""
    target: ModelProfile
    drafter: ModelProfile | None
    n_ctx: int  # as llama.cpp will size it (padded, clamped to the training context)
    kv_type: str
    n_batch: int
    n_ubatch: int
    n_rs_seq: int
    devices: list[DevicePlan]  # the GPUs in llama.cpp's order; the output device is last
    host: DevicePlan
    n_gpu_layers: int
    split_mode: str  # "none" or "layer"
    tensor_split: list[float]  # per device, layer counts (the output layer counts on the last one)
    main_gpu: int
    pipeline_copies: int
    strategy: str  # "cpu", "single", "proportional", "speed", "override"
    drafter_plan: DrafterPlan | None = None
    traffic: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    advice: list[Advice] = field(default_factory=list)
    idle: list[str] = field(default_factory=list)  # GPUs the plan leaves unused, and why

    @property
    def fits(self) -> bool:
        return not self.problems

    @property
    def offload(self) -> str:
        if not self.devices:
            return "none"
        return "full" if self.n_gpu_layers >= self.target.n_layer + 1 else "partial"

    @property
    def n_cpu_layers(self) -> int:
        return self.host.n_layers

    @property
    def split_mode_id(self) -> int:
        return SPLIT_MODE_IDS[self.split_mode]

    def device(self, name: str) -> DevicePlan:
        for d in [*self.devices, self.host]:
            if d.name == name:
                return d
        raise KeyError(name)

    def to_dict(self) -> dict:
        return {
            "fits": self.fits, "offload": self.offload, "strategy": self.strategy,
            "target": self.target.to_dict(), "drafter": self.drafter.to_dict() if self.drafter else None,
            "n_ctx": self.n_ctx, "kv_type": self.kv_type, "n_batch": self.n_batch, "n_ubatch": self.n_ubatch,
            "n_rs_seq": self.n_rs_seq,
            "llama": {"n_gpu_layers": self.n_gpu_layers, "split_mode": self.split_mode,
                      "tensor_split": self.tensor_split, "main_gpu": self.main_gpu,
                      "devices": [d.name for d in self.devices], "pipeline_copies": self.pipeline_copies},
            "devices": [d.to_dict() for d in self.devices], "host": self.host.to_dict(),
            "drafter_placement": self.drafter_plan.to_dict() if self.drafter_plan else None,
            "traffic": self.traffic, "problems": self.problems, "warnings": self.warnings,
            "advice": [a.to_dict() for a in self.advice], "idle": self.idle,
        }


@dataclass(frozen=True)
class PlanRequest:
    """What the user asks for; defaults match the engine's."""
    n_ctx: int = 4096
    kv_type: str = "f16"  # K and V cache type of the target
    n_batch: int = 512
    n_ubatch: int = 0  # 0: n_batch, as the engine sets it
    margin: int = GiB  # kept free on every GPU (CUDA pools, cuBLAS, other processes)
    split: tuple[float, ...] | None = None  # user override: share per GPU, in inventory order
    n_gpu_layers: int | None = None  # force partial offload (llama.cpp's meaning: the output layer counts)
    allow_partial: bool = True
    use_drafter: bool = True
    n_rs_seq: int | None = None  # recurrent rollback snapshots; None: the longest draft's (max_draft) where needed
    drafter_device: str | None = None  # pin the drafter to this GPU (default: the output device)
    # the engine's (0: unbounded; None: the drafter's own, drafter_window_for): its cache is sized to it
    drafter_window: int | None = None
    advise: bool = True
