"""A push button that may shrink to its text, so a row of buttons fits a narrow window."""

from __future__ import annotations

from PySide6.QtCore import QSize
from PySide6.QtWidgets import QPushButton, QSizePolicy, QStyle, QWidget


class CompactButton(QPushButton):
    """Styles give push buttons an 80-pixel floor; this one keeps that as its preferred width but
    can be laid out down to its text and margins."""

    def __init__(self, text: str, parent: QWidget | None = None):
        super().__init__(text, parent)
        # Preferred, not QPushButton's Minimum: a layout may then go below sizeHint, to minimumSizeHint
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt override
        hint = super().minimumSizeHint()
        margins = 2 * (self.style().pixelMetric(QStyle.PixelMetric.PM_ButtonMargin, None, self)
                       + self.style().pixelMetric(QStyle.PixelMetric.PM_DefaultFrameWidth, None, self))
        return QSize(min(hint.width(), self.fontMetrics().horizontalAdvance(self.text()) + margins), hint.height())
