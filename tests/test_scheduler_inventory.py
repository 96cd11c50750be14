"""Device inventory: hypothetical cards from text, the real devices of this build."""

from __future__ import annotations

import pytest

from app.scheduler.errors import PlanInputError
from app.scheduler.inventory import (
    GiB,
    detect_inventory,
    hypothetical_inventory,
    known_bandwidth,
    parse_gpu_spec,
    parse_size,
)
from native.ggml_devices import list_devices


def test_sizes_read_like_people_write_them() -> None:
    assert parse_size("24GiB") == 24 * GiB
    assert parse_size("24 GB") == 24 * 10 ** 9
    assert parse_size("12000MiB") == 12000 * 1024 ** 2
    assert parse_size("24") == 24 * GiB  # a bare number is GiB
    assert parse_size("1.5GiB") == int(1.5 * GiB)
    with pytest.raises(PlanInputError, match="memory size"):
        parse_size("lots")


def test_gpu_specs_with_options() -> None:
    g = parse_gpu_spec("RTX3090:24GiB")
    assert (g.name, g.memory_total, g.memory_free, g.bandwidth_gbs, g.hypothetical) == \
        ("RTX3090", 24 * GiB, 24 * GiB, 936.0, True)
    assert g.pcie_gbs() == pytest.approx(1.969 * 16)
    g = parse_gpu_spec("mycard:16GiB:bw=600:free=14GiB:pcie=3x8:nvlink")
    assert (g.bandwidth_gbs, g.memory_free, g.pcie_gen, g.pcie_width, g.nvlink) == (600.0, 14 * GiB, 3, 8, True)
    assert parse_gpu_spec("mystery:8GiB").bandwidth_gbs is None
    for bad, msg in (("RTX3090", "expected NAME:SIZE"), (":24GiB", "expected NAME:SIZE"),
                     ("x:24GiB:speed=9", "cannot read option"), ("x:0GiB", "must be positive")):
        with pytest.raises(PlanInputError, match=msg):
            parse_gpu_spec(bad)


def test_known_bandwidth_reads_marketing_names() -> None:
    assert known_bandwidth("NVIDIA GeForce RTX 3090") == 936
    assert known_bandwidth("NVIDIA GeForce RTX 3060 Ti") == 448
    assert known_bandwidth("rtx4090") == 1008
    assert known_bandwidth("127.0.0.1:50052") is None


def test_two_cards_of_one_model_get_distinct_names() -> None:
    inv = hypothetical_inventory(["RTX3090:24GiB", "RTX3090:24GiB", "RTX3060:12GiB"])
    assert [g.name for g in inv.gpus] == ["RTX3090#0", "RTX3090#1", "RTX3060"]
    assert inv.sources == ("hypothetical",) and inv.host.ram_total > 0


def test_the_inventory_holds_this_builds_gpu_devices() -> None:
    """The real ggml devices of the loaded build: every GPU-like one (a CUDA card, an RPC server)
    and nothing else, with the memory ggml reports; none on the CPU build or a machine without a
    card (then everything is planned on the CPU). Holds with or without a GPU; the GPU side is
    also tested on synthetic devices (tests/test_gpu_load_path.py)."""
    devices = [d for d in list_devices() if d.type in ("gpu", "igpu")]
    inv = detect_inventory()
    assert [g.handle for g in inv.gpus] == [d.handle for d in devices]
    assert [(g.memory_total, g.description) for g in inv.gpus] == [(d.memory_total, d.description) for d in devices]
    assert all(not g.hypothetical and 0 < g.memory_free <= g.memory_total for g in inv.gpus)
    if not devices:
        assert inv.gpus == ()
    assert inv.host.ram_total >= inv.host.ram_free > 0
    assert "ggml" in inv.sources
