"""The layer-split planner on header-only GGUF files shaped like the published
models (sizes come from their tensor infos), on hypothetical cards."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from app.engine.dflash import DRAFTER_SLACK, DRAFTER_WINDOW
from app.scheduler import HostSpec, Inventory, PlanRequest, parse_gpu_spec, plan_split, read_profile
from app.scheduler.apply import placements
from app.scheduler.errors import PlanInputError
from app.scheduler.inventory import GiB, unique_names
from gguf_tools.reader import read_gguf
from gguf_tools.shapes import write_preset

HOST = HostSpec(ram_total=64 * GiB, ram_free=60 * GiB, cpu="test host", n_cores=16)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("shapes")
    keys = ["qwen3.6-27b", "qwen3.6-27b-dflash", "llama3.3-70b", "llama3.3-70b-dflash", "qwen3-32b",
            "qwen3-32b-dflash", "gemma3-27b"]
    return {k: write_preset(d, k) for k in keys}


def inv(*specs: str, host: HostSpec = HOST) -> Inventory:
    return Inventory(unique_names([parse_gpu_spec(s) for s in specs]), host)


def gb(n: int) -> float:
    return n / 1e9


def llama_cpp_layer_devices(n_layer: int, n_gpu_layers: int, tensor_split: list[float], n_dev: int) -> list[int]:
    """llama.cpp's own assignment (llama-model.cpp load_tensors): device index per layer
    0..n_layer (the last entry is the output layer), -1 for the CPU. float32 like the C++."""
    splits = np.array(tensor_split if tensor_split else [1.0] * n_dev, dtype=np.float32)
    splits = np.cumsum(splits, dtype=np.float32) / np.float32(splits.sum(dtype=np.float32))
    i_gpu_start = max(n_layer + 1 - n_gpu_layers, 0)
    act = min(n_gpu_layers, n_layer + 1)
    out = []
    for il in range(n_layer + 1):
        if il < i_gpu_start or il - i_gpu_start >= act:
            out.append(-1)
        else:
            x = np.float32(il - i_gpu_start) / np.float32(act)
            out.append(int(np.searchsorted(splits, x, side="right")))
    return out


def assert_llama_cpp_agrees(plan) -> None:  # noqa: ANN001
    """The plan's per-device layer ranges are exactly what llama.cpp makes of its parameters."""
    n = plan.target.n_layer
    got = llama_cpp_layer_devices(n, plan.n_gpu_layers, plan.tensor_split, len(plan.devices))
    want = [-1] * plan.n_cpu_layers
    for j, d in enumerate(plan.devices):
        want += [j] * d.n_layers
    want.append(len(plan.devices) - 1 if plan.devices else -1)  # the output layer
    assert got == want


def test_shape_files_are_sparse_and_sized_like_the_published_quants(shapes: dict[str, Path]) -> None:
    published_gb = {"llama3.3-70b": 42.5, "qwen3-32b": 19.8, "qwen3.6-27b": 16.8, "gemma3-27b": 16.5,
                    "qwen3.6-27b-dflash": 1.03}
    for key, size in published_gb.items():
        info = read_gguf(shapes[key])  # the length check passes on the sparse data section
        assert abs(gb(info.tensor_bytes) - size) / size < 0.05, (key, gb(info.tensor_bytes))
        assert os.stat(shapes[key]).st_blocks * 512 < 4 * 1024 * 1024  # only the header is on disk
    prof = read_profile(shapes["qwen3.6-27b"])
    assert sum(ly.kind == "full" for ly in prof.layers) == 16 and prof.n_embd_s == 128 * 6144
    g = read_profile(shapes["gemma3-27b"])
    assert [i for i, ly in enumerate(g.layers) if ly.kind == "full"] == list(range(5, 62, 6))
    assert g.tied_output and g.output_bytes > g.head_bytes > 0


def test_27b_with_1gb_drafter_at_32k_fits_one_24gb_card(shapes: dict[str, Path]) -> None:
    t, d = shapes["qwen3.6-27b"], shapes["qwen3.6-27b-dflash"]
    plan = plan_split(t, d, inv("RTX3090:24GiB"), PlanRequest(n_ctx=32768))
    assert plan.fits and plan.offload == "full" and plan.strategy == "single"
    assert plan.n_gpu_layers == 65 and plan.tensor_split == [] and plan.split_mode == "layer"
    (card,) = plan.devices
    assert card.has_output and card.holds_drafter
    assert plan.drafter_plan is not None and plan.drafter_plan.shares_head and not plan.drafter_plan.needs_own_head
    tp = read_profile(t)
    assert card.bytes.weights == tp.layer_bytes + tp.output_bytes  # token_embd stays on the CPU
    assert plan.host.bytes.weights == tp.input_bytes
    assert card.bytes.drafter_weights == read_gguf(d).tensor_bytes
    # 16 attention layers x 32768 cells x (4 KV heads x 256) x K,V x f16, plus 48 recurrent states with
    # 15 rollback snapshots (conv (4-1) x (6144 + 2 x 16 x 128) + ssm 128 x 6144 floats, f32)
    kv = 16 * 32768 * 4 * 256 * 2 * 2
    rs = 48 * (3 * (6144 + 2 * 16 * 128) + 128 * 6144) * 4 * 16
    assert card.bytes.kv == kv + rs
    # the drafter's cache: its window and a slack (2,304 cells), not the 32k context
    assert plan.drafter_plan.n_ctx == DRAFTER_WINDOW + DRAFTER_SLACK
    assert card.bytes.drafter_kv == 5 * (DRAFTER_WINDOW + DRAFTER_SLACK) * 8 * 128 * 2 * 2
    # published setups (Q4_K_M target + ~1 GB drafter, 32k, f16 KV) report about 22.3 GB in all
    assert abs(gb(card.bytes.used) - 22.3) / 22.3 < 0.08, gb(card.bytes.used)
    assert card.headroom > 0
    assert_llama_cpp_agrees(plan)


def test_70b_splits_evenly_over_two_24gb_cards(shapes: dict[str, Path]) -> None:
    plan = plan_split(shapes["llama3.3-70b"], None, inv("RTX3090:24GiB", "RTX3090:24GiB"), PlanRequest(n_ctx=8192))
    assert plan.fits and plan.offload == "full" and plan.strategy == "proportional"
    a, b = plan.devices
    assert b.has_output and not a.has_output
    assert a.n_layers + b.n_layers == 80 and sum(plan.tensor_split) == 81
    # equal cards: the card without the head takes the extra layers, headrooms end up close
    assert a.n_layers >= b.n_layers and abs(a.headroom - b.headroom) < 1.0 * GiB
    assert plan.pipeline_copies == 4
    assert plan.traffic["boundary_bytes_per_token"] == 8192 * 4  # one f32 residual row crosses
    assert_llama_cpp_agrees(plan)

    with_drafter = plan_split(shapes["llama3.3-70b"], shapes["llama3.3-70b-dflash"],
                              inv("RTX3090:24GiB", "RTX3090:24GiB"), PlanRequest(n_ctx=8192))
    assert with_drafter.fits and with_drafter.devices[-1].holds_drafter
    assert with_drafter.devices[-1].n_layers < b.n_layers  # the drafter's bytes push layers to the other card
    assert with_drafter.traffic["boundary_bytes_per_block"] == 16 * 8192 * 4
    assert_llama_cpp_agrees(with_drafter)


def test_mixed_24_and_12gb_cards_put_the_larger_share_on_the_faster_card(shapes: dict[str, Path]) -> None:
    t, d = shapes["qwen3-32b"], shapes["qwen3-32b-dflash"]
    for order in (("RTX3060:12GiB", "RTX3090:24GiB"), ("RTX3090:24GiB", "RTX3060:12GiB")):
        plan = plan_split(t, d, inv(*order), PlanRequest(n_ctx=32768))
        assert plan.fits and plan.strategy == "speed"
        slow, fast = plan.devices
        assert fast.name == "RTX3090" and fast.has_output and fast.holds_drafter
        assert fast.n_layers > slow.n_layers > 0
        assert_llama_cpp_agrees(plan)
    # the same cards at the same speed: shares follow the room left after fixed costs instead
    even = plan_split(t, d, inv("RTX3060:12GiB:bw=900", "RTX3090:24GiB:bw=900"), PlanRequest(n_ctx=32768))
    assert even.fits and even.strategy == "proportional"
    assert even.devices[-1].n_layers < plan.devices[-1].n_layers


def test_what_fits_on_one_card_stays_on_one_card(shapes: dict[str, Path]) -> None:
    plan = plan_split(shapes["gemma3-27b"], None, inv("RTX3090:24GiB", "RTX3090:24GiB"), PlanRequest(n_ctx=8192))
    assert plan.fits and plan.strategy == "single" and len(plan.devices) == 1
    assert plan.idle and "PCIe" in plan.idle[0]
    assert plan.traffic["boundary_bytes_per_token"] == 0


def apply_change(req: PlanRequest, change: dict) -> PlanRequest:
    return replace(req, **{k: v for k, v in change.items() if k in ("n_ctx", "kv_type", "n_gpu_layers",
                                                                   "use_drafter")})


def test_70b_at_32k_on_two_cards_does_not_fit_and_every_advice_is_checked(shapes: dict[str, Path]) -> None:
    cards = inv("RTX3090:24GiB", "RTX3090:24GiB")
    t, d = shapes["llama3.3-70b"], shapes["llama3.3-70b-dflash"]
    req = PlanRequest(n_ctx=32768, allow_partial=False)
    plan = plan_split(t, d, cards, req)
    assert not plan.fits
    assert any("GiB short" in p and "RTX3090" in p for p in plan.problems)
    kinds = {a.kind for a in plan.advice}
    assert {"context", "kv_type", "partial_offload", "more_memory", "add_gpu"} <= kinds
    for a in plan.advice:
        if a.kind in ("context", "kv_type", "no_drafter"):
            p = plan_split(t, d, cards, apply_change(req, a.change))
            assert a.fits and p.fits and p.offload == "full", a
        elif a.kind == "partial_offload":
            p = plan_split(t, d, cards, apply_change(replace(req, allow_partial=True), a.change))
            assert p.fits and p.offload == "partial" and p.n_gpu_layers == a.change["n_gpu_layers"]
        elif a.kind == "add_gpu":
            p = plan_split(t, d, inv("RTX3090:24GiB", "RTX3090:24GiB", a.change["gpu"]), req)
            assert p.fits
    ctx = next(a for a in plan.advice if a.kind == "context")
    assert 0 < ctx.change["n_ctx"] < 32768 and ctx.change["n_ctx"] % 256 == 0
    # the longest context really is the longest: one step more does not fit
    longer = plan_split(t, d, cards, replace(req, n_ctx=ctx.change["n_ctx"] + 256, advise=False))
    assert not longer.fits


def test_70b_on_one_card_offloads_partially_and_says_what_full_offload_needs(shapes: dict[str, Path]) -> None:
    plan = plan_split(shapes["llama3.3-70b"], None, inv("RTX3090:24GiB"), PlanRequest(n_ctx=8192))
    assert plan.fits and plan.offload == "partial"
    assert 0 < plan.n_gpu_layers < 81 and plan.n_cpu_layers == 81 - plan.n_gpu_layers
    assert plan.host.bytes.weights > plan.n_cpu_layers * 0.4 * GiB  # the CPU layers' weights sit in RAM
    assert_llama_cpp_agrees(plan)
    more = next(a for a in plan.advice if a.kind == "more_memory")
    assert more.fits and more.change["extra_bytes"]["RTX3090"] > 15 * GiB
    # one layer more on the card does not fit: the search found the boundary
    tighter = plan_split(shapes["llama3.3-70b"], None, inv("RTX3090:24GiB"),
                         PlanRequest(n_ctx=8192, n_gpu_layers=plan.n_gpu_layers + 1, advise=False))
    assert not tighter.fits


def test_nothing_fits_when_ram_is_short_too(shapes: dict[str, Path]) -> None:
    small = inv("RTX3060:8GiB", host=HostSpec(16 * GiB, 12 * GiB))
    plan = plan_split(shapes["llama3.3-70b"], None, small, PlanRequest(n_ctx=8192))
    assert not plan.fits and plan.offload == "full"  # partial offload would need ~34 GiB of RAM: not offered
    assert any(p.startswith("RTX3060: needs") and "GiB short" in p for p in plan.problems)
    # no context, KV type or partial offload makes 42 GB fit in 8 GB + 12 GB: only more memory does
    assert [a.kind for a in plan.advice] == ["more_memory"]
    assert plan.advice[0].change["extra_bytes"]["RTX3060"] == -plan.devices[0].headroom


def test_no_gpu_plans_everything_on_the_cpu(shapes: dict[str, Path]) -> None:
    plan = plan_split(shapes["qwen3.6-27b"], shapes["qwen3.6-27b-dflash"], inv(), PlanRequest(n_ctx=4096))
    assert plan.strategy == "cpu" and plan.offload == "none" and plan.n_gpu_layers == 0
    assert plan.host.n_layers == 64 and plan.host.has_output and plan.host.holds_drafter
    assert plan.fits  # 60 GiB of RAM hold it
    target, drafter = placements(plan)
    assert target.n_gpu_layers == 0 and target.main_gpu == -1 and drafter is not None


def test_split_override_follows_the_users_ratio(shapes: dict[str, Path]) -> None:
    cards = inv("RTX3090:24GiB", "RTX3090:24GiB")
    plan = plan_split(shapes["llama3.3-70b"], None, cards, PlanRequest(n_ctx=4096, split=(1.0, 3.0)))
    assert plan.strategy == "override"
    a, b = plan.devices
    assert abs(a.n_layers / 80 - 0.25) < 0.03
    assert not b.fits and not plan.fits  # three quarters of 42 GB is more than a card: said, not hidden
    assert_llama_cpp_agrees(plan)
    with pytest.raises(PlanInputError, match="one non-negative share per GPU"):
        plan_split(shapes["llama3.3-70b"], None, cards, PlanRequest(split=(1.0,)))


def test_drafter_away_from_the_head_needs_its_own_copy(shapes: dict[str, Path]) -> None:
    cards = inv("RTX3090:24GiB", "RTX3090:24GiB")
    t = shapes["llama3.3-70b"]
    plan = plan_split(t, shapes["llama3.3-70b-dflash"], cards,
                      PlanRequest(n_ctx=4096, drafter_device="RTX3090#0"))
    dp = plan.drafter_plan
    assert dp is not None and dp.device == "RTX3090#0" and dp.needs_own_head and not dp.shares_head
    assert dp.own_head_bytes == read_profile(t).head_bytes
    assert "self-contained" in dp.reason
    with pytest.raises(PlanInputError):
        placements(plan)


def test_kv_quantization_shrinks_the_cache_by_the_type_size(shapes: dict[str, Path]) -> None:
    cards = inv("RTX3090:24GiB", "RTX3090:24GiB")
    f16 = plan_split(shapes["llama3.3-70b"], None, cards, PlanRequest(n_ctx=8192, split=(1, 1)))
    q8 = plan_split(shapes["llama3.3-70b"], None, cards, PlanRequest(n_ctx=8192, kv_type="q8_0", split=(1, 1)))
    q4 = plan_split(shapes["llama3.3-70b"], None, cards, PlanRequest(n_ctx=8192, kv_type="q4_0", split=(1, 1)))
    kv = [sum(d.bytes.kv for d in p.devices) for p in (f16, q8, q4)]
    assert kv[0] == 80 * 8192 * 1024 * 2 * 2
    assert kv[1] * 64 == kv[0] * 34 and kv[2] * 64 == kv[0] * 18


def test_unusable_inputs_name_the_file_and_the_problem(shapes: dict[str, Path], tmp_path: Path) -> None:
    cards = inv("RTX3090:24GiB")
    with pytest.raises(PlanInputError, match="drafter; pass it as the drafter"):
        plan_split(shapes["qwen3.6-27b-dflash"], None, cards)
    with pytest.raises(PlanInputError, match="does not match the target"):
        plan_split(shapes["llama3.3-70b"], shapes["qwen3.6-27b-dflash"], cards)
    with pytest.raises(PlanInputError, match="unknown KV cache type"):
        plan_split(shapes["llama3.3-70b"], None, cards, PlanRequest(kv_type="q3"))
    with pytest.raises(PlanInputError, match="positive"):
        plan_split(shapes["llama3.3-70b"], None, cards, PlanRequest(n_ctx=0))
    missing = tmp_path / "missing.gguf"
    with pytest.raises(PlanInputError, match="missing.gguf: no such file"):
        plan_split(missing, None, cards)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all, just text")
    with pytest.raises(PlanInputError, match="bad.gguf: not a GGUF file"):
        plan_split(bad, None, cards)


def test_an_eagle3_drafter_is_placed_as_a_drafter(tiny_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """An EAGLE-3 file is a drafter to the plan too: one layer, a pass per token (one output row), the
    target's head shared, its three taps' features on the host."""
    from gguf_tools.synth import write_eagle3

    e3 = write_eagle3(tmp_path / "e3.gguf", tiny_pair[0])
    plan = plan_split(tiny_pair[0], e3, inv(), PlanRequest(n_ctx=1024))
    assert plan.fits and plan.host.holds_drafter
    d = read_profile(e3)
    assert d.is_drafter and d.block_size == 1 and d.target_layers == (1, 2, 3) and not d.has_own_head
