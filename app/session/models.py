"""Which models to load and how: the user's choice, and loading it into an Engine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from app.errors import ModelLoadError

DEVICE_CPU = "cpu"
DEVICE_GPU = "gpu"


@dataclass
class ModelSpec:
    target: str
    drafter: str | None = None
    n_ctx: int = 4096
    device: str = DEVICE_CPU  # "gpu": every layer on the default GPU(s)
    n_threads: int = 0

    @classmethod
    def from_dict(cls, d: dict) -> ModelSpec:
        return cls(target=str(d["target"]), drafter=d.get("drafter") or None, n_ctx=int(d.get("n_ctx", 4096)),
                   device=d.get("device", DEVICE_CPU), n_threads=int(d.get("n_threads", 0)))

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def label(self) -> str:
        name = Path(self.target).name
        return f"{name} + {Path(self.drafter).name}" if self.drafter else name


def bundled_spec() -> ModelSpec:
    """The bundled default pair (the drafter is absent until one ships in assets/)."""
    from app.bundled import default_drafter, default_target

    drafter = default_drafter()
    return ModelSpec(str(default_target()), str(drafter) if drafter else None)


def load_engine(spec: ModelSpec, progress: Callable[[str, float], bool] | None = None):  # noqa: ANN201
    """Open the pair; errors (missing file, PairMismatch, ...) name the file and the problem."""
    from app.engine.dflash import Engine, EngineConfig
    from app.engine.llama_objects import ModelPlacement

    for label, path in (("target", spec.target), ("drafter", spec.drafter)):
        if path is not None and not Path(path).expanduser().is_file():
            raise ModelLoadError(f"{path}: the {label} model file does not exist")
    if spec.n_ctx < 64:
        raise ModelLoadError(f"{spec.target}: context length {spec.n_ctx} is too small (at least 64)")
    placement = ModelPlacement(n_gpu_layers=999) if spec.device == DEVICE_GPU else None
    cfg = EngineConfig(n_ctx=spec.n_ctx, n_threads=spec.n_threads, target_placement=placement,
                       drafter_placement=placement)
    return Engine(spec.target, spec.drafter, cfg, progress=progress)


def gpu_available() -> bool:
    """True when the native build sees a GPU (loads the native libraries: call off the UI thread)."""
    from native import lib

    lib.load()
    from native.ggml_devices import list_devices

    return any(d.type in ("gpu", "igpu") for d in list_devices())
