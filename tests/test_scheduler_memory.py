"""The memory model against llama.cpp on the CPU: a CPU-only plan's bytes are
what llama.cpp allocates (memory_breakdown after decoding), KV exactly.

The plans here are made on an inventory without GPUs, whatever this machine has, and load
with main_gpu -1 and no split (llama.cpp then uses no GPU even on a CUDA build with a card),
so they hold with or without a GPU; the plan for this machine's own devices is checked either
way in test_the_plan_for_this_machine_loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine.dflash import Engine
from app.engine.params import GenerationParams
from app.scheduler import Inventory, PlanRequest, plan_split
from app.scheduler.apply import engine_config
from app.scheduler.inventory import detect_inventory, host_spec
from app.scheduler.verify import actual_bytes, predicted_bytes
from gguf_tools.synth import TinyShape, write_tiny_pair


@pytest.fixture(scope="module")
def medium_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    shape = TinyShape(n_embd=256, n_layer=8, n_head=4, n_head_kv=2, head_dim=64, n_ff=768)
    return write_tiny_pair(tmp_path_factory.mktemp("medium-mem"), "qwen3", shape=shape)


def load_and_measure(target: Path, drafter: Path | None, n_ctx: int, kv: str = "f16") -> tuple[dict, dict, list]:
    plan = plan_split(target, drafter, Inventory((), host_spec()), PlanRequest(n_ctx=n_ctx, kv_type=kv))
    assert plan.strategy == "cpu" and plan.fits
    e = Engine(target, drafter, engine_config(plan, n_threads=1))  # one thread: the CI box is shared
    try:
        toks = e.tokenize("the cat sat on the mat")
        for _ in e.generate(toks, GenerationParams(max_tokens=4)):
            pass
        rows = e.ctx.memory_breakdown() + (e.dctx.memory_breakdown() if e.dctx is not None else [])
    finally:
        e.close()
    return predicted_bytes(plan), actual_bytes(rows, plan), [plan, rows]


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_cpu_plan_matches_llama_cpp(medium_pair: tuple[Path, Path], kv: str) -> None:
    predicted, actual, (plan, rows) = load_and_measure(*medium_pair, n_ctx=1024, kv=kv)
    assert abs(actual["CPU"] - predicted["CPU"]) <= 0.10 * actual["CPU"], (predicted, actual, rows)
    h = plan.host.bytes
    assert sum(r[2] for r in rows) == h.kv + h.drafter_kv  # cache bytes: exact
    assert sum(r[1] for r in rows) == h.weights + h.drafter_weights  # weights: the file's tensor bytes


@pytest.mark.gemma
def test_gemma_cpu_plan_matches_llama_cpp(gemma_target: Path, gemma_random_drafter: Path) -> None:
    predicted, actual, (plan, rows) = load_and_measure(gemma_target, gemma_random_drafter, n_ctx=4096)
    assert abs(actual["CPU"] - predicted["CPU"]) <= 0.10 * actual["CPU"], (predicted, actual, rows)
    assert sum(r[2] for r in rows) == plan.host.bytes.kv + plan.host.bytes.drafter_kv  # sliding-window cells too


def test_the_plan_for_this_machine_loads(tiny_pair: tuple[Path, Path]) -> None:
    """Plan on the devices this machine has (CPU only, or its GPUs), turn the plan into load
    parameters and load: the path the app takes when the Model tab says GPU."""
    plan = plan_split(*tiny_pair, detect_inventory(), PlanRequest(n_ctx=512))
    cfg = engine_config(plan, n_threads=1)
    assert cfg.n_threads == 1 and cfg.n_ctx == 512
    e = Engine(*tiny_pair, cfg)
    try:
        assert e.n_ctx == 512
        if plan.strategy == "cpu":
            assert cfg.target_placement.main_gpu == -1 and e.target.device_names() == []
        else:  # a GPU machine: the layers are on the devices the plan chose
            assert e.target.device_names()
            assert set(e.target.device_names()) <= {d.name for d in plan.devices}
    finally:
        e.close()
