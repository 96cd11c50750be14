"""The GPU load path without a GPU: ggml devices and NVML as the inventory reads them
(synthetic devices, a stand-in pynvml), and a spec with device "gpu" turned into the
llama.cpp load parameters the engine gets (app.session.models.engine_config_for, load_engine)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.engine.llama_objects import ModelPlacement
from app.errors import ModelLoadError
from app.scheduler import inventory as inventory_mod
from app.scheduler.inventory import GiB, HostSpec, Inventory, parse_gpu_spec
from app.session import models
from app.session.models import DEVICE_GPU, ModelSpec, engine_config_for, load_engine, plan_for
from gguf_tools.shapes import write_preset
from native.ggml_devices import Device

HOST = HostSpec(ram_total=64 * GiB, ram_free=60 * GiB, cpu="test host", n_cores=16)
H0, H1 = 0x7F0010, 0x7F0020  # stand-ins for ggml_backend_dev_t handles
LAYER = 1  # LLAMA_SPLIT_MODE_LAYER
F16 = 1  # ggml_type F16


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("gpu-load-shapes")
    return {k: write_preset(d, k) for k in ("llama3.3-70b", "llama3.3-70b-dflash", "qwen3.6-27b",
                                            "qwen3.6-27b-dflash")}


def two_3090s() -> Inventory:
    """What detect_inventory gives on a machine with two RTX 3090s: real devices carry handles."""
    cards = [replace(parse_gpu_spec("RTX3090:24GiB"), name=f"CUDA{i}", handle=h, description="NVIDIA GeForce RTX 3090")
             for i, h in enumerate((H0, H1))]
    return Inventory(tuple(cards), HOST, ("ggml",))


class FakeNvml(SimpleNamespace):
    """The pynvml calls inventory._nvml_cards makes, for two boards: one reports everything (and
    NVLink on 4 links), the other only its name and fails the optional queries."""
    NVML_CLOCK_MEM = 2
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 18

    def __init__(self) -> None:
        super().__init__(shut=False)

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        pass

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:  # noqa: N802
        return i

    def nvmlDeviceGetPciInfo(self, h: int) -> SimpleNamespace:  # noqa: N802
        return SimpleNamespace(busId=[b"00000000:01:00.0", b"00000000:02:00.0"][h])

    def nvmlDeviceGetName(self, h: int) -> str:  # noqa: N802
        return "NVIDIA GeForce RTX 3090"

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:  # noqa: N802
        if h:
            raise RuntimeError("not supported")
        return 4

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:  # noqa: N802
        if h:
            raise RuntimeError("not supported")
        return 8

    def nvmlDeviceGetMaxClockInfo(self, h: int, kind: int) -> int:  # noqa: N802
        if h:
            raise RuntimeError("not supported")
        return 9751  # MHz

    def nvmlDeviceGetMemoryBusWidth(self, h: int) -> int:  # noqa: N802
        return 384

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:  # noqa: N802
        if h or link >= 4:
            raise RuntimeError("no such link")
        return 1


def test_ggml_devices_and_nvml_make_the_inventory(monkeypatch: pytest.MonkeyPatch) -> None:
    devs = [Device(0, 1, "CPU", "AMD EPYC", "cpu", 60 * GiB, 64 * GiB),
            Device(1, H0, "CUDA0", "NVIDIA GeForce RTX 3090", "gpu", 23 * GiB, 24 * GiB),
            Device(2, H1, "CUDA1", "NVIDIA GeForce RTX 3090", "gpu", 22 * GiB, 24 * GiB),
            Device(3, 0x99, "RPC0", "127.0.0.1:50052", "gpu", 2 * GiB, 2 * GiB)]
    props = {H0: (b"0000:01:00.0", True), H1: (b"0000:02:00.0", True), 0x99: (None, False)}
    monkeypatch.setattr(inventory_mod, "list_devices", lambda: devs)
    monkeypatch.setattr(inventory_mod, "device_props", lambda h: SimpleNamespace(
        device_id=props[h][0], caps=SimpleNamespace(async_=props[h][1], events=props[h][1])))
    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    inv = inventory_mod.detect_inventory()
    assert inv.sources == ("ggml", "nvml") and nvml.shut
    assert [g.name for g in inv.gpus] == ["CUDA0", "CUDA1", "RPC0"]  # the CPU device is the host, not a GPU
    a, b, rpc = inv.gpus
    assert (a.handle, a.memory_free, a.memory_total, a.device_id) == (H0, 23 * GiB, 24 * GiB, "0000:01:00.0")
    # NVML's link and memory clock win over the name's specification; what it cannot tell stays unknown
    assert (a.pcie_gen, a.pcie_width, a.nvlink) == (4, 8, True) and a.pcie_gbs() == pytest.approx(1.969 * 8)
    assert a.bandwidth_gbs == pytest.approx(936.1, abs=0.1)  # 9751 MHz x 2 x 384 bit / 8
    assert (b.pcie_gen, b.pcie_width, b.nvlink, b.bandwidth_gbs) == (None, None, False, 936.0)
    assert not rpc.pipeline_capable and rpc.bandwidth_gbs is None and not rpc.hypothetical

    # without pynvml (or without a driver) the ggml devices alone
    monkeypatch.setitem(sys.modules, "pynvml", None)
    bare = inventory_mod.detect_inventory()
    assert bare.sources == ("ggml",) and bare.gpus[0].pcie_gen is None and bare.gpus[0].bandwidth_gbs == 936.0

    class NoDriver(FakeNvml):
        def nvmlInit(self) -> None:  # noqa: N802
            raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", NoDriver())
    assert inventory_mod.detect_inventory().sources == ("ggml",)


def test_a_gpu_spec_becomes_llama_cpp_layer_split_parameters(shapes: dict[str, Path]) -> None:
    """70B Q4_K_M (42 GB) and its drafter on two 24 GiB cards: every layer offloaded, split by
    layers across both cards in the plan's proportions, the drafter on the card that holds the
    target's output head (it shares it), the context and thread count as asked."""
    spec = ModelSpec(str(shapes["llama3.3-70b"]), str(shapes["llama3.3-70b-dflash"]), n_ctx=8192,
                     device=DEVICE_GPU, n_threads=3)
    cfg = engine_config_for(spec, two_3090s())
    t, d = cfg.target_placement, cfg.drafter_placement
    assert (cfg.n_ctx, cfg.n_threads, cfg.n_batch, cfg.type_k, cfg.type_v) == (8192, 3, 512, F16, F16)
    assert t.n_gpu_layers == 81 and t.split_mode == LAYER and t.devices == [H0, H1]  # 80 layers + output
    assert len(t.tensor_split) == 2 and sum(t.tensor_split) == 81 and min(t.tensor_split) >= 30
    plan = plan_for(spec, two_3090s())
    assert plan.fits and t.tensor_split == list(plan.tensor_split) and plan.drafter_plan.device == "CUDA1"
    assert d == ModelPlacement(n_gpu_layers=plan.drafter.n_layer + 1, split_mode=LAYER, main_gpu=0, devices=[H1])


def test_the_users_split_override_is_what_llama_cpp_gets(shapes: dict[str, Path]) -> None:
    spec = ModelSpec(str(shapes["qwen3.6-27b"]), str(shapes["qwen3.6-27b-dflash"]), n_ctx=4096, device=DEVICE_GPU,
                     split=[1.0, 3.0])
    t = engine_config_for(spec, two_3090s()).target_placement
    assert t.devices == [H0, H1] and t.split_mode == LAYER and t.n_gpu_layers == 65
    assert abs(t.tensor_split[0] / sum(t.tensor_split) - 0.25) < 0.03


def test_one_card_that_holds_everything(shapes: dict[str, Path]) -> None:
    spec = ModelSpec(str(shapes["qwen3.6-27b"]), str(shapes["qwen3.6-27b-dflash"]), n_ctx=4096, device=DEVICE_GPU)
    one = Inventory(two_3090s().gpus[:1], HOST, ("ggml",))
    cfg = engine_config_for(spec, one)
    assert cfg.target_placement.n_gpu_layers == 65 and cfg.target_placement.devices == [H0]
    assert cfg.drafter_placement.devices == [H0] and cfg.n_ctx == 4096


def test_plans_that_cannot_be_loaded_are_load_errors(shapes: dict[str, Path]) -> None:
    spec = ModelSpec(str(shapes["llama3.3-70b"]), str(shapes["llama3.3-70b-dflash"]), n_ctx=8192, device=DEVICE_GPU)
    ghosts = Inventory((parse_gpu_spec("RTX3090:24GiB"), parse_gpu_spec("RTX4090:24GiB")), HOST, ("hypothetical",))
    with pytest.raises(ModelLoadError, match="no GPU placement: the plan is for hypothetical cards"):
        engine_config_for(spec, ghosts)
    small = Inventory((replace(parse_gpu_spec("RTX3060:8GiB"), handle=H0),), HostSpec(16 * GiB, 12 * GiB), ("ggml",))
    with pytest.raises(ModelLoadError, match=r"llama3.3-70b[^ ]*\.gguf: no GPU placement: the plan does not fit"):
        engine_config_for(spec, small)


def test_a_cpu_spec_keeps_every_layer_on_the_cpu(shapes: dict[str, Path]) -> None:
    cfg = engine_config_for(ModelSpec(str(shapes["qwen3.6-27b"]), None, n_ctx=2048, n_threads=2))
    assert cfg.target_placement.n_gpu_layers == 0 and cfg.drafter_placement.n_gpu_layers == 0
    assert (cfg.n_ctx, cfg.n_threads) == (2048, 2)


def test_load_engine_on_gpu_loads_what_the_plan_says(shapes: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """load_engine plans on the detected devices and hands those parameters to the engine."""
    loaded = []
    monkeypatch.setattr(models, "detect_inventory", two_3090s)
    monkeypatch.setattr(models, "Engine", lambda target, drafter, cfg, progress=None, pair=None, draft_model=None:
                        loaded.append((target, drafter, cfg, pair)) or "engine")
    spec = ModelSpec(str(shapes["llama3.3-70b"]), str(shapes["llama3.3-70b-dflash"]), n_ctx=8192, device=DEVICE_GPU)
    checked = object()  # the pair check's report (header-only shape files carry no tokenizer to check)
    assert load_engine(spec, checked=checked) == "engine"
    (target, drafter, cfg, pair), = loaded
    assert (target, drafter, pair) == (spec.target, spec.drafter, checked)
    assert cfg == engine_config_for(spec, two_3090s()) and cfg.target_placement.devices == [H0, H1]
