"""PlanView draws a plan's bytes per device and emits the user's split override."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.scheduler import HostSpec, Inventory, PlanRequest, parse_gpu_spec, plan_split
from app.scheduler.inventory import GiB, unique_names
from app.ui.plan_view import SEGMENTS, DeviceBar, PlanView
from gguf_tools.shapes import write_preset


@pytest.fixture(scope="module")
def plan_70b(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    d = tmp_path_factory.mktemp("view-shapes")
    inv = Inventory(unique_names([parse_gpu_spec("RTX3090:24GiB"), parse_gpu_spec("RTX3090:24GiB")]),
                    HostSpec(64 * GiB, 60 * GiB))
    return plan_split(write_preset(d, "llama3.3-70b"), write_preset(d, "llama3.3-70b-dflash"), inv,
                      PlanRequest(n_ctx=8192))


def test_one_bar_per_device_filled_by_kind(qtbot, plan_70b) -> None:  # noqa: ANN001
    view = PlanView()
    qtbot.addWidget(view)
    view.set_plan(plan_70b)
    assert list(view.bars) == ["RTX3090#0", "RTX3090#1", "CPU"]
    for dev in [*plan_70b.devices, plan_70b.host]:
        bar = view.bars[dev.name]
        seg = dict(bar.segments())
        b = dev.bytes
        assert seg["weights"] == b.weights and seg["KV"] == b.kv and seg["drafter"] == b.drafter
        assert seg["compute"] == b.compute + b.host_buffers and seg["margin"] == b.margin
        assert bar.capacity == dev.memory_free and not bar.overflows
    assert "drafter" in view.captions["RTX3090#1"].text() and "output head" in view.captions["RTX3090#1"].text()
    assert view.verdict.text().startswith("<b>fits</b>")
    assert view.ratio_edit.text() == ",".join(f"{x:g}" for x in plan_70b.tensor_split)


def _run_lengths(bar: DeviceBar, width: int = 402) -> dict[str, int]:
    """Pixels of each colour along the bar's middle row, as it paints itself."""
    bar.resize(width, 22)
    img = bar.grab().toImage()
    out: dict[str, int] = {}
    for x in range(img.width()):
        c = img.pixelColor(x, img.height() // 2).name().upper()
        out[c] = out.get(c, 0) + 1
    return out


def test_a_device_bar_paints_each_kind_in_proportion(qtbot) -> None:  # noqa: ANN001
    bar = DeviceBar()
    qtbot.addWidget(bar)
    colours = {label: colour for label, colour, _ in SEGMENTS}
    bar.set_bytes(10 * GiB, {"weights": 5 * GiB, "kv": 2 * GiB, "compute": GiB, "margin": GiB})
    px = _run_lengths(bar)
    # 400 px of inner width for 10 GiB: 200, 80, 40, 40 px, and a tenth left free
    for label, want in (("weights", 200), ("KV", 80), ("compute", 40), ("margin", 40)):
        assert abs(px.get(colours[label], 0) - want) <= 2, (label, px)
    assert colours["drafter"] not in px and abs(px.get("#F2F2F2", 0) - 40) <= 2 and not bar.overflows
    # an overflow runs past the free-memory mark, drawn in red
    bar.set_bytes(5 * GiB, {"weights": 10 * GiB})
    px = _run_lengths(bar)
    assert bar.overflows and px.get("#D62728", 0) >= 1 and px.get("#F2F2F2", 0) == 0


def test_override_emits_shares_and_automatic(qtbot, plan_70b) -> None:  # noqa: ANN001
    view = PlanView()
    qtbot.addWidget(view)
    view.set_plan(plan_70b, gpu_names=["RTX3090#0", "RTX3090#1"])
    got: list[list] = []
    view.splitOverride.connect(got.append)
    assert not view.apply_button.isEnabled()
    view.override_box.setChecked(True)
    view.slider.setValue(30)
    view.apply_button.click()
    assert got == [[30.0, 70.0]]
    view.ratio_edit.setText("1,x")
    view.apply_button.click()
    assert len(got) == 1 and "numbers" in view.override_error.text()
    view.ratio_edit.setText("1")
    view.apply_button.click()
    assert len(got) == 1 and "2 non-negative shares" in view.override_error.text()
    view.override_box.setChecked(False)
    assert got[-1] == []  # back to the automatic split


def test_an_overflowing_plan_shows_the_overflow(qtbot, tmp_path: Path) -> None:  # noqa: ANN001
    inv = Inventory((parse_gpu_spec("RTX3090:24GiB"),), HostSpec(16 * GiB, 12 * GiB))
    plan = plan_split(write_preset(tmp_path, "llama3.3-70b"), None, inv, PlanRequest(n_ctx=8192))
    view = PlanView()
    qtbot.addWidget(view)
    view.set_plan(plan.to_dict())  # the dict form works too
    assert not plan.fits and view.bars["RTX3090"].overflows
    assert "does NOT fit" in view.verdict.text() and "GiB short" in view.notes.text()
    assert not view.override_box.isEnabled()  # one card: nothing to split
