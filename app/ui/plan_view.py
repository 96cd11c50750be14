"""The placement plan, drawn: one bar per device filled by weights / KV /
compute / drafter (and the kept margin), the plan's verdict, problems and
advice, and a split-ratio override the user can apply.

It shows a plan the scheduler made (SplitPlan or its to_dict()); it plans
nothing itself. Overrides go out through `splitOverride(list)`: one share per
GPU in `gpu_names` order (the inventory order the planner expects), or an
empty list for "automatic".
"""

from __future__ import annotations

from PySide6.QtCore import QRectF, QSize, Qt, Signal
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import (
    QCheckBox,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSizePolicy,
    QSlider,
    QVBoxLayout,
    QWidget,
)

# what each bar segment is, its colour, and the DeviceBytes keys it sums
SEGMENTS: list[tuple[str, str, tuple[str, ...]]] = [
    ("weights", "#4C78A8", ("weights",)),
    ("KV", "#F58518", ("kv",)),
    ("compute", "#54A24B", ("compute", "host_buffers")),
    ("drafter", "#B279A2", ("drafter_weights", "drafter_kv", "drafter_compute")),
    ("margin", "#BAB0AC", ("margin",)),
]
GiB = 1024 ** 3


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB / 10 else f"{n / 1024 ** 2:.1f} MiB"


class DeviceBar(QWidget):
    """A horizontal bar: the device's free memory, filled segment by segment."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.capacity = 0
        self._segments: list[tuple[str, int, str]] = []
        self.setMinimumHeight(22)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def set_bytes(self, capacity: int, byte_kinds: dict[str, int]) -> None:
        self.capacity = max(0, int(capacity))
        self._segments = [(label, sum(int(byte_kinds.get(k, 0)) for k in keys), colour)
                          for label, colour, keys in SEGMENTS]
        self.setToolTip("\n".join(f"{label}: {_gib(n)}" for label, n, _ in self._segments if n)
                        + f"\nfree: {_gib(self.capacity)}")
        self.update()

    def segments(self) -> list[tuple[str, int]]:
        """(kind, bytes) in drawing order."""
        return [(label, n) for label, n, _ in self._segments]

    def used(self) -> int:
        return sum(n for _, n, _ in self._segments)

    @property
    def overflows(self) -> bool:
        return self.used() > self.capacity

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(320, 22)

    def paintEvent(self, _event: object) -> None:  # noqa: N802 - Qt override
        p = QPainter(self)
        r = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        p.fillRect(r, QColor("#F2F2F2"))
        scale = max(self.capacity, self.used(), 1)  # an overflowing plan runs past the free-memory mark
        x = r.left()
        for _, n, colour in self._segments:
            w = r.width() * n / scale
            p.fillRect(QRectF(x, r.top(), w, r.height()), QColor(colour))
            x += w
        if self.overflows:
            edge = r.left() + r.width() * self.capacity / scale
            p.setPen(QPen(QColor("#D62728"), 2))
            p.drawLine(int(edge), int(r.top()), int(edge), int(r.bottom()))
        p.setPen(QPen(QColor("#606060"), 1))
        p.drawRect(r)
        p.end()


class PlanView(QWidget):
    """Shows a placement plan and lets the user override the split ratio."""

    splitOverride = Signal(list)  # noqa: N815 - Qt signal naming

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.gpu_names: list[str] = []
        self.bars: dict[str, DeviceBar] = {}
        self.captions: dict[str, QLabel] = {}
        lay = QVBoxLayout(self)
        self.verdict = QLabel("No plan yet")
        self.verdict.setObjectName("planVerdict")
        self.verdict.setWordWrap(True)
        lay.addWidget(self.verdict)
        self.llama_label = QLabel("")
        self.llama_label.setWordWrap(True)
        self.llama_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        lay.addWidget(self.llama_label)
        self.grid = QGridLayout()
        lay.addLayout(self.grid)
        legend = QHBoxLayout()
        for label, colour, _ in SEGMENTS:
            sw = QLabel("  ")
            sw.setStyleSheet(f"background: {colour}; border: 1px solid #606060;")
            legend.addWidget(sw)
            legend.addWidget(QLabel(label))
        legend.addStretch(1)
        lay.addLayout(legend)
        self.traffic_label = QLabel("")
        self.traffic_label.setWordWrap(True)
        lay.addWidget(self.traffic_label)
        self.notes = QLabel("")
        self.notes.setWordWrap(True)
        lay.addWidget(self.notes)

        # the override: a slider for two cards, a text field of shares for any number
        row = QHBoxLayout()
        self.override_box = QCheckBox("Override split ratio")
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setRange(1, 99)
        self.slider.setValue(50)
        self.ratio_edit = QLineEdit()
        self.ratio_edit.setPlaceholderText("shares per GPU, e.g. 3,1")
        self.apply_button = QPushButton("Apply")
        row.addWidget(self.override_box)
        row.addWidget(self.slider, 1)
        row.addWidget(self.ratio_edit)
        row.addWidget(self.apply_button)
        lay.addLayout(row)
        self.override_error = QLabel("")
        self.override_error.setStyleSheet("color: #D62728;")
        lay.addWidget(self.override_error)
        lay.addStretch(1)
        self.slider.valueChanged.connect(self._slider_moved)
        self.override_box.toggled.connect(self._override_toggled)
        self.apply_button.clicked.connect(self.apply_override)
        self._override_toggled(False)

    # --- showing a plan ---------------------------------------------------------
    def set_plan(self, plan: object, gpu_names: list[str] | None = None) -> None:
        """Show `plan` (a SplitPlan or its to_dict()); `gpu_names` is the inventory order
        the override shares refer to (default: the plan's device order)."""
        d = dict(plan) if isinstance(plan, dict) else plan.to_dict()  # type: ignore[attr-defined]
        while self.grid.count():
            w = self.grid.takeAt(0).widget()
            if w is not None:
                w.deleteLater()
        self.bars, self.captions = {}, {}
        devices = [*d.get("devices", []), d["host"]]
        for i, dev in enumerate(devices):
            name = dev["name"] if dev["kind"] == "gpu" else "CPU / RAM"
            bar = DeviceBar()
            bar.set_bytes(dev["memory_free"], dev["bytes"])
            caption = QLabel(self._caption(dev))
            caption.setWordWrap(True)
            self.grid.addWidget(QLabel(name), 2 * i, 0)
            self.grid.addWidget(bar, 2 * i, 1)
            self.grid.addWidget(caption, 2 * i + 1, 1)
            self.bars[dev["name"]] = bar
            self.captions[dev["name"]] = caption
        llama = d.get("llama", {})
        verdict = "fits" if d.get("fits") else "does NOT fit"
        self.verdict.setText(f"<b>{verdict}</b> — {d.get('offload')} offload, {d.get('strategy')} split, "
                             f"context {d.get('n_ctx')}, KV {d.get('kv_type')}")
        self.llama_label.setText(f"n_gpu_layers {llama.get('n_gpu_layers')}, split {llama.get('split_mode')}, "
                                 f"tensor_split {llama.get('tensor_split') or '-'}, main_gpu {llama.get('main_gpu')}")
        tr = d.get("traffic") or {}
        self.traffic_label.setText(
            f"PCIe at the split: {tr.get('boundary_bytes_per_token', 0) / 1024:.1f} KiB per token, "
            f"{tr.get('boundary_bytes_per_block', 0) / 1024:.1f} KiB per verify block; host link "
            f"{tr.get('host_bytes_per_block', 0) / 1024 ** 2:.1f} MiB per block" if d.get("devices") else "")
        notes = [f"⚠ {p}" for p in d.get("problems", [])] + [f"→ {a['message']}" for a in d.get("advice", [])]
        notes += [f"idle: {x}" for x in d.get("idle", [])]
        self.notes.setText("\n".join(notes))
        gpus = [dev["name"] for dev in d.get("devices", [])]
        self.gpu_names = list(gpu_names) if gpu_names else gpus
        self.override_box.setEnabled(len(self.gpu_names) > 1)
        self.slider.setVisible(len(self.gpu_names) == 2)
        if len(gpus) > 1 and llama.get("tensor_split"):
            shares = dict(zip(gpus, llama["tensor_split"], strict=False))
            self.ratio_edit.setText(",".join(f"{shares.get(n, 0):g}" for n in self.gpu_names))

    def show_note(self, text: str) -> None:
        """A line in the verdict's place: a plan being made, or why there is none."""
        self.verdict.setText(text)

    @staticmethod
    def _caption(dev: dict) -> str:
        parts = []
        if dev.get("n_layers"):
            a, b = dev["layers"]
            parts.append(f"layers {a}-{b}")
        if dev.get("has_output"):
            parts.append("output head")
        if dev.get("holds_drafter"):
            parts.append("drafter")
        used = dev["bytes"]["total"]
        over = "" if dev.get("fits", True) else "  (over!)"
        return f"{' + '.join(parts) or 'input embeddings, buffers'}: {_gib(used)} of {_gib(dev['memory_free'])}{over}"

    # --- the override -------------------------------------------------------------
    def _override_toggled(self, on: bool) -> None:
        for w in (self.slider, self.ratio_edit, self.apply_button):
            w.setEnabled(on)
        if not on and self.gpu_names:
            self.override_error.setText("")
            self.splitOverride.emit([])  # back to automatic

    def _slider_moved(self, value: int) -> None:
        if len(self.gpu_names) == 2:
            self.ratio_edit.setText(f"{value},{100 - value}")

    def shares(self) -> list[float]:
        """The shares typed or slid, validated: one non-negative number per GPU, not all zero."""
        try:
            vals = [float(x) for x in self.ratio_edit.text().split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"{self.ratio_edit.text()!r}: type numbers separated by commas") from None
        if len(vals) != len(self.gpu_names) or any(v < 0 for v in vals) or sum(vals) <= 0:
            raise ValueError(f"give {len(self.gpu_names)} non-negative shares ({', '.join(self.gpu_names)})")
        return vals

    def apply_override(self) -> None:
        try:
            vals = self.shares()
        except ValueError as e:
            self.override_error.setText(str(e))
            return
        self.override_error.setText("")
        self.splitOverride.emit(vals)
