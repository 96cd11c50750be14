"""Generation settings (global, or overridden for one chat) and the chat's system prompt."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.session.settings import AUTO, MAX_DRAFT, ChatSettings


class SettingsPanel(QWidget):
    """Edits a ChatSettings; `override` says whether edits belong to the open chat only."""

    settingsEdited = Signal(object, bool)  # ChatSettings, for this chat only
    systemPromptEdited = Signal(str)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self._loading = False
        lay = QVBoxLayout(self)
        box = QGroupBox("Generation")
        form = QFormLayout(box)
        self.temperature = QDoubleSpinBox(minimum=0.0, maximum=2.0, singleStep=0.05, decimals=2)
        self.temperature.setToolTip("0 = greedy (the target's argmax every token)")
        self.top_k = QSpinBox(minimum=0, maximum=100000)
        self.top_p = QDoubleSpinBox(minimum=0.01, maximum=1.0, singleStep=0.05, decimals=2)
        self.min_p = QDoubleSpinBox(minimum=0.0, maximum=0.99, singleStep=0.01, decimals=2)
        self.seed = QSpinBox(minimum=0, maximum=2**31 - 1)
        self.max_tokens = QSpinBox(minimum=1, maximum=131072)
        self.speculative = QCheckBox("DFlash speculation")
        self.draft_length = QComboBox()
        self.draft_length.addItem("auto (measured)", AUTO)
        for k in range(1, MAX_DRAFT + 1):
            self.draft_length.addItem(str(k), k)
        self.draft_length.setToolTip("auto: the draft length that maximises measured tokens/s, down to plain "
                                     "decoding; a number: always draft that many tokens")
        form.addRow("Temperature", self.temperature)
        form.addRow("Top-k", self.top_k)
        form.addRow("Top-p", self.top_p)
        form.addRow("Min-p", self.min_p)
        form.addRow("Seed", self.seed)
        form.addRow("Max tokens", self.max_tokens)
        form.addRow("", self.speculative)
        form.addRow("Draft length", self.draft_length)
        self.override = QCheckBox("Use these settings for this chat only")
        form.addRow("", self.override)
        lay.addWidget(box)

        sp = QGroupBox("System prompt (this chat)")
        sl = QVBoxLayout(sp)
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setPlaceholderText("optional instructions sent before the conversation")
        self.system_prompt.setMaximumHeight(110)
        sl.addWidget(self.system_prompt)
        self.format_label = QLabel("prompt format: –")
        self.format_label.setWordWrap(True)
        sl.addWidget(self.format_label)
        lay.addWidget(sp)
        lay.addStretch(1)

        for w in (self.temperature, self.top_p, self.min_p):
            w.valueChanged.connect(self._edited)
        for w in (self.top_k, self.seed, self.max_tokens):
            w.valueChanged.connect(self._edited)
        self.speculative.toggled.connect(self._edited)
        self.draft_length.currentIndexChanged.connect(self._edited)
        self.override.toggled.connect(self._edited)
        self.system_prompt.textChanged.connect(self._prompt_edited)

    def show_settings(self, s: ChatSettings, override: bool, system_prompt: str | None) -> None:
        """Fill the form without echoing edits back."""
        self._loading = True
        try:
            self.temperature.setValue(s.temperature)
            self.top_k.setValue(s.top_k)
            self.top_p.setValue(s.top_p)
            self.min_p.setValue(s.min_p)
            self.seed.setValue(s.seed)
            self.max_tokens.setValue(s.max_tokens)
            self.speculative.setChecked(s.speculative)
            self.draft_length.setCurrentIndex(max(0, self.draft_length.findData(s.draft_length)))
            self.override.setChecked(override)
            self.override.setEnabled(system_prompt is not None)
            self.system_prompt.setEnabled(system_prompt is not None)
            if self.system_prompt.toPlainText() != (system_prompt or ""):
                self.system_prompt.setPlainText(system_prompt or "")
        finally:
            self._loading = False

    def show_prompt_format(self, name: str) -> None:
        """The loaded model's prompt format, under the system prompt it goes into."""
        self.format_label.setText(f"prompt format: {name}")

    def current(self) -> ChatSettings:
        return ChatSettings(temperature=self.temperature.value(), top_k=self.top_k.value(),
                            top_p=self.top_p.value(), min_p=self.min_p.value(), seed=self.seed.value(),
                            max_tokens=self.max_tokens.value(), speculative=self.speculative.isChecked(),
                            draft_length=self.draft_length.currentData())

    def _edited(self) -> None:
        if not self._loading:
            self.settingsEdited.emit(self.current(), self.override.isChecked())

    def _prompt_edited(self) -> None:
        if not self._loading:
            self.systemPromptEdited.emit(self.system_prompt.toPlainText())
