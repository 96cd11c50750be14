"""PlanView draws a plan's bytes per device and emits the user's split override."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.scheduler import HostSpec, Inventory, PlanRequest, parse_gpu_spec, plan_split
from app.scheduler.inventory import GiB, unique_names
from app.ui.plan_view import PlanView
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
    view.show()
    assert not view.grab().isNull()  # paints without error


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
