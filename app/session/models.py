"""Which models to load and how: the user's choice, and loading it into an Engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from app.bundled import default_drafter, default_target
from app.engine.dflash import Engine, EngineConfig
from app.engine.llama_objects import ModelPlacement
from app.errors import ModelLoadError
from app.scheduler.apply import engine_config
from app.scheduler.errors import PlanInputError
from app.scheduler.inventory import Inventory, detect_inventory
from app.scheduler.plan import SplitPlan
from app.scheduler.planner import PlanRequest, plan_split
from gguf_tools.pair import PairReport, check_draft_model, check_pair
from gguf_tools.validate import check_model
from native.ggml_devices import list_devices

DEVICE_CPU = "cpu"
# the context lengths a spec may ask for (llama.cpp clamps to the model's own; past 1M tokens is a typo)
MIN_CTX, MAX_CTX = 64, 1 << 20
DEVICE_GPU = "gpu"


@dataclass
class ModelSpec:
    target: str
    drafter: str | None = None
    n_ctx: int = 4096
    device: str = DEVICE_CPU  # "gpu": placed by the layer-split planner on the detected GPUs
    n_threads: int = 0
    split: list[float] | None = None  # the user's override of the planned split ratio (per GPU)
    draft_model: str | None = None  # a classic draft model (same vocabulary), on the CPU
    mtp: bool = True  # draft with the target's own MTP head where it carries one (EngineConfig.mtp)

    @classmethod
    def from_dict(cls, d: dict) -> ModelSpec:
        split = d.get("split")
        return cls(target=str(d["target"]), drafter=d.get("drafter") or None, n_ctx=int(d.get("n_ctx", 4096)),
                   device=d.get("device", DEVICE_CPU), n_threads=int(d.get("n_threads", 0)),
                   split=[float(x) for x in split] if split else None, draft_model=d.get("draft_model") or None,
                   mtp=bool(d.get("mtp", True)))

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def label(self) -> str:
        name = Path(self.target).name
        return f"{name} + {Path(self.drafter).name}" if self.drafter else name


def bundled_spec() -> ModelSpec:
    """The bundled default pair (the drafter is absent until one ships in assets/)."""
    return resolve_spec()


def resolve_spec(target: str | None = None, drafter: str | None = None, no_drafter: bool = False,
                 **kw) -> ModelSpec:  # noqa: ANN003 - the other ModelSpec fields
    """The one rule for which pair to open: no target means the bundled target with the bundled
    drafter; a target given opens with the drafter given (none if none); no_drafter opens the
    target alone."""
    if target is None:
        bundled = default_drafter()
        drafter = drafter or (str(bundled) if bundled else None)
        target = str(default_target())
    return ModelSpec(target, None if no_drafter else drafter, **kw)


def check_spec(spec: ModelSpec) -> PairReport | None:
    """What can be checked before a loaded pair is given up for this one: the files exist, the
    context is usable, the drafter fits the target (from the headers). Raises a ModelLoadError or
    PairMismatch naming the file; returns the pair report (None without a drafter)."""
    for label, path in (("target", spec.target), ("drafter", spec.drafter)):
        if path is not None and not Path(path).expanduser().is_file():
            raise ModelLoadError(f"{path}: the {label} model file does not exist")
    if isinstance(spec.n_ctx, bool) or not isinstance(spec.n_ctx, int) or not MIN_CTX <= spec.n_ctx <= MAX_CTX:
        raise ModelLoadError(f"{spec.target}: context length {spec.n_ctx!r:.40} is not usable "
                             f"(allowed: {MIN_CTX}..{MAX_CTX:,} tokens)")
    if isinstance(spec.n_threads, bool) or not isinstance(spec.n_threads, int) or not 0 <= spec.n_threads <= 1024:
        raise ModelLoadError(f"{spec.target}: {spec.n_threads!r:.40} CPU threads is not usable "
                             f"(allowed: 0..1024; 0: all cores)")
    if spec.drafter is None:
        check_model(spec.target)  # values llama.cpp would assert on (the pair check makes it for both)
        return None
    report = check_pair(spec.target, spec.drafter)
    report.raise_if_bad()
    return report


def check_draft_model_spec(spec: ModelSpec) -> None:
    """The spec's classic draft model exists and shares the target's vocabulary (PairMismatch if not)."""
    if spec.draft_model is None:
        return
    if not Path(spec.draft_model).expanduser().is_file():
        raise ModelLoadError(f"{spec.draft_model}: the draft model file does not exist")
    check_draft_model(spec.target, spec.draft_model).raise_if_bad()


def load_engine(spec: ModelSpec, progress: Callable[[str, float], bool] | None = None,
                checked: PairReport | None = None) -> Engine:
    """Open the pair; errors (missing file, PairMismatch, ...) name the file and the problem.
    `checked`: check_spec's report, when the caller checked before giving up another pair."""
    pair = checked if checked is not None else check_spec(spec)
    check_draft_model_spec(spec)
    return Engine(spec.target, spec.drafter, engine_config_for(spec), progress=progress, pair=pair,
                  draft_model=spec.draft_model)


def engine_config_for(spec: ModelSpec, inventory: Inventory | None = None) -> EngineConfig:
    """The load parameters of a spec: on the CPU, or (device "gpu") the layer-split plan's on
    `inventory` (default: the devices this machine has). A plan that cannot be loaded (it does
    not fit, it is for hypothetical cards, its drafter cannot reach the output head) is a
    ModelLoadError naming the target."""
    if spec.device == DEVICE_GPU:
        plan = plan_for(spec, inventory)
        try:
            cfg = engine_config(plan, n_threads=spec.n_threads)
        except PlanInputError as e:
            raise ModelLoadError(f"{spec.target}: no GPU placement: {e}") from None
        # a classic draft model goes whole onto the first GPU: its passes run one after another, so on
        # the CPU they would cost more than they save (the split planner does not count its memory yet)
        cfg.draft_model_placement = ModelPlacement(n_gpu_layers=999)
        cfg.mtp = spec.mtp
        return cfg
    cpu = ModelPlacement(n_gpu_layers=0)
    return EngineConfig(n_ctx=spec.n_ctx, n_threads=spec.n_threads, target_placement=cpu, drafter_placement=cpu,
                        draft_model_placement=cpu, mtp=spec.mtp)


def plan_for(spec: ModelSpec, inventory: Inventory | None = None) -> SplitPlan:
    """The layer-split plan for this pair on `inventory` (default: the devices this machine has;
    the GPU split plan panel shows it; loading on the GPU applies it)."""
    return plan_split(spec.target, spec.drafter, detect_inventory() if inventory is None else inventory,
                      PlanRequest(n_ctx=spec.n_ctx, split=tuple(spec.split) if spec.split else None))


def gpu_available() -> bool:
    """True when the native build sees a GPU (loads the native libraries: call off the UI thread)."""
    return any(d.type in ("gpu", "igpu") for d in list_devices())
