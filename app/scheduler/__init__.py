"""Placement of a target (+ DFlash drafter) on 0, 1 or 2+ GPUs.

    inventory  what devices there are (ggml devices, NVML, host RAM) or could be (--gpu NAME:24GiB)
    profile    what a GGUF needs: per-layer weights, KV/state geometry, head, from its header
    memory     what llama.cpp allocates for it: KV, recurrent state, compute buffers (measured rules)
    planner    the split: layers per device, output head + drafter placement, fit, advice
    traffic    PCIe bytes per token and per verify block at the split boundaries
    explain    the plan in words
    apply      the plan as ModelPlacement / EngineConfig for the engine
    rpc        llama.cpp rpc-server processes as extra devices (tests, remote boxes)
"""

from app.scheduler.inventory import DeviceSpec, HostSpec, Inventory, detect_inventory, parse_gpu_spec
from app.scheduler.plan import DevicePlan, DrafterPlan, SplitPlan
from app.scheduler.planner import PlanRequest, plan_split
from app.scheduler.profile import ModelProfile, read_profile

__all__ = ["DeviceSpec", "HostSpec", "Inventory", "detect_inventory", "parse_gpu_spec", "DevicePlan", "DrafterPlan",
           "SplitPlan", "PlanRequest", "plan_split", "ModelProfile", "read_profile"]
