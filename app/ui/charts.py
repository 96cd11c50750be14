"""Small QPainter charts for the stats panel (no QtCharts: PySide6-Essentials lacks it)."""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QSizePolicy, QWidget

BAR = QColor("#3d7bd9")
ACCENT = QColor("#2e9e5b")
GRID = QColor("#d0d4da")
MUTED = QColor("#8a9099")
SPLIT_COLOURS = {"draft": QColor("#e0a526"), "verify": QColor("#3d7bd9"), "inject": QColor("#8e5bd6"),
                 "other": QColor("#a0a6ad")}
# who produced the reply's tokens: the target itself (one per step) and each draft source (one colour each)
SOURCE_COLOURS = {"target": QColor("#3d7bd9"), "lookup": QColor("#2e9e5b"), "dflash": QColor("#e0a526"),
                  "draft-model": QColor("#9b59b6"), "mtp": QColor("#d9534f"), "eagle3": QColor("#8c564b")}


class _Chart(QWidget):
    def __init__(self, parent: QWidget | None = None, height: int = 90):
        super().__init__(parent)
        self.setMinimumHeight(height)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self._height = height

    def sizeHint(self) -> QSize:  # noqa: N802
        return QSize(240, self._height)


class AcceptanceChart(_Chart):
    """Acceptance rate (0..1) per block position 1..n; positions never drafted are drawn hollow."""

    def __init__(self, parent: QWidget | None = None, positions: int = 15):
        super().__init__(parent, 110)
        self.positions = positions
        self.rates: list[float] = []
        self.drafted: list[int] = []

    def set_data(self, rates: list[float], drafted: list[int]) -> None:
        self.rates, self.drafted = list(rates), list(drafted)
        self.update()

    def paintEvent(self, _event) -> None:  # noqa: N802, ANN001
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        w, h = self.width(), self.height()
        left, bottom, top = 26, 16, 6
        plot_h = h - bottom - top
        fm = p.fontMetrics()
        p.setPen(QPen(GRID, 1))
        for frac in (0.0, 0.5, 1.0):
            y = top + plot_h * (1 - frac)
            p.drawLine(left, int(y), w - 2, int(y))
            p.setPen(MUTED)
            p.drawText(QRectF(0, y - 7, left - 4, 14), Qt.AlignmentFlag.AlignRight, f"{frac:.1f}".rstrip("0")
                       .rstrip(".") if frac not in (0.0, 1.0) else str(int(frac)))
            p.setPen(QPen(GRID, 1))
        n = self.positions
        slot = (w - left - 2) / n
        for i in range(n):
            x = left + i * slot + slot * 0.15
            bw = slot * 0.7
            drafted = self.drafted[i] if i < len(self.drafted) else 0
            rate = self.rates[i] if i < len(self.rates) else 0.0
            if drafted:
                bh = max(1.0, plot_h * rate)
                p.fillRect(QRectF(x, top + plot_h - bh, bw, bh), BAR)
            else:
                p.setPen(QPen(GRID, 1, Qt.PenStyle.DashLine))
                p.drawRect(QRectF(x, top + plot_h - 3, bw, 3))
            if n <= 16 and (i % 2 == 0 or slot > fm.horizontalAdvance("15") + 2):
                p.setPen(MUTED)
                p.drawText(QRectF(left + i * slot, h - bottom + 2, slot, bottom - 2),
                           Qt.AlignmentFlag.AlignHCenter, str(i + 1))
        p.end()


class Sparkline(_Chart):
    """Tokens/s over the reply, with the measured plain baseline as a dashed line."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent, 60)
        self.points: list[float] = []
        self.baseline: float | None = None

    def set_data(self, points: list[float], baseline: float | None) -> None:
        self.points, self.baseline = list(points), baseline
        self.update()

    def paintEvent(self, _event) -> None:  # noqa: N802, ANN001
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        w, h = self.width(), self.height()
        p.setPen(QPen(GRID, 1))
        p.drawLine(0, h - 1, w, h - 1)
        top = max(self.points + ([self.baseline] if self.baseline else []) + [1e-9]) * 1.1
        y_of = lambda v: (h - 2) - (h - 6) * (v / top)
        if self.baseline:
            p.setPen(QPen(MUTED, 1, Qt.PenStyle.DashLine))
            y = y_of(self.baseline)
            p.drawLine(QPointF(0, y), QPointF(w, y))
        if len(self.points) >= 2:
            path = QPainterPath()
            step = w / (len(self.points) - 1)
            for i, v in enumerate(self.points):
                pt = QPointF(i * step, y_of(v))
                path.lineTo(pt) if i else path.moveTo(pt)
            p.setPen(QPen(ACCENT, 1.6))
            p.drawPath(path)
        p.end()


class StackedBar(_Chart):
    """One stacked bar of named parts (where the decode time went; who produced the tokens)."""

    def __init__(self, colours: dict[str, QColor], parent: QWidget | None = None):
        super().__init__(parent, 18)
        self.colours = colours
        self.parts: dict[str, float] = {}

    def set_data(self, parts: dict[str, float]) -> None:
        self.parts = dict(parts)
        self.update()

    def paintEvent(self, _event) -> None:  # noqa: N802, ANN001
        p = QPainter(self)
        w, h = self.width(), self.height()
        total = sum(v for v in self.parts.values() if v > 0)
        if total <= 0:
            p.setPen(QPen(GRID, 1, Qt.PenStyle.DashLine))
            p.drawRect(0, 0, w - 1, h - 1)
            p.end()
            return
        x = 0.0
        for name, v in self.parts.items():
            if v <= 0:
                continue
            bw = w * v / total
            p.fillRect(QRectF(x, 0, bw, h), self.colours.get(name, MUTED))
            x += bw
        p.end()
