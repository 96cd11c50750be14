"""A plan as the engine's load parameters (ModelPlacement, EngineConfig)."""

from __future__ import annotations

from app.engine.dflash import EngineConfig
from app.engine.llama_objects import ModelPlacement
from app.scheduler import memory as mem
from app.scheduler.errors import PlanInputError
from app.scheduler.plan import SplitPlan


def placements(plan: SplitPlan, allow_unfit: bool = False) -> tuple[ModelPlacement, ModelPlacement | None]:
    """(target placement, drafter placement) for llama.cpp; refuses hypothetical cards,
    a plan that does not fit (unless allow_unfit) and a drafter that cannot reach a head."""
    if not plan.fits and not allow_unfit:
        raise PlanInputError("the plan does not fit: " + "; ".join(plan.problems))
    ghosts = [d.name for d in plan.devices if d.spec is None or d.spec.handle is None]
    if ghosts:
        raise PlanInputError(f"the plan is for hypothetical cards ({', '.join(ghosts)}): plan on detected devices "
                             f"to load a model")
    dp = plan.drafter_plan
    if dp is not None and dp.needs_own_head and plan.drafter is not None and not plan.drafter.has_own_head:
        raise PlanInputError(f"{plan.drafter.path}: the plan puts the drafter on {dp.device}, away from the target's "
                             f"output head, but this drafter has no token_embd/output of its own")
    if not plan.devices:
        # main_gpu -1 with split_mode none: llama.cpp drops every GPU, the model stays on the CPU
        cpu = ModelPlacement(n_gpu_layers=0, split_mode=0, main_gpu=-1)
        return cpu, (ModelPlacement(n_gpu_layers=0, split_mode=0, main_gpu=-1) if plan.drafter else None)
    handles = [d.spec.handle for d in plan.devices]  # type: ignore[union-attr]
    target = ModelPlacement(n_gpu_layers=plan.n_gpu_layers, split_mode=plan.split_mode_id, main_gpu=plan.main_gpu,
                            tensor_split=list(plan.tensor_split), devices=handles)
    drafter = None
    if plan.drafter is not None and dp is not None:
        where = plan.device(dp.device)
        if where.kind == "cpu":
            drafter = ModelPlacement(n_gpu_layers=0, split_mode=0, main_gpu=-1)
        else:
            # one device, every layer and its output layer: LAYER mode on a one-element device list
            drafter = ModelPlacement(n_gpu_layers=plan.drafter.n_layer + 1, split_mode=1, main_gpu=0,
                                     devices=[where.spec.handle])  # type: ignore[union-attr]
    return target, drafter


def engine_config(plan: SplitPlan, allow_unfit: bool = False, **overrides: object) -> EngineConfig:
    """An EngineConfig that loads the plan: context, batch, KV type and both placements."""
    target, drafter = placements(plan, allow_unfit)
    kv = mem.ggml_type(plan.kv_type).value  # ggml_type ids match gguf-py's GGMLQuantizationType
    cfg = EngineConfig(n_ctx=plan.n_ctx, n_batch=plan.n_batch, type_k=kv, type_v=kv,
                       target_placement=target, drafter_placement=drafter)
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg
