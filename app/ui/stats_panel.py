"""The live acceptance stats panel. It draws numbers the session computed; it computes none."""

from __future__ import annotations

from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QVBoxLayout, QWidget

from app.session.baseline import Baseline
from app.session.summary import ReplySummary
from app.ui.charts import SOURCE_COLOURS, SPLIT_COLOURS, AcceptanceChart, Sparkline, StackedBar

# every draft source of app.engine.draft_policy.SOURCES ("plain" is the target's own token); a reply's summary
# may name one by its loaded file (ReplySummary.source_labels: the dflash source running a DFlash2 drafter)
SOURCE_NAMES = {"target": "target", "lookup": "context lookup", "dflash": "DFlash drafter",
                "draft-model": "draft model", "mtp": "target's MTP head", "eagle3": "EAGLE-3 drafter"}


def _fmt_speedup(x: float | None) -> str:
    return f"{x:.2f}×" if x is not None else "–"


def _ms(s: float) -> str:
    return f"{s * 1000:.0f} ms" if s < 10 else f"{s:.1f} s"


def source_rows(s: ReplySummary) -> str:
    """One row for the target and one per source that drafted: its share of the tokens, and for a
    draft source what it drafted, how much of it passed and its tau."""
    if not s.token_share:
        return "–"
    rows = []
    for name in ["target", *s.sources_used]:
        colour = SOURCE_COLOURS.get(name, SOURCE_COLOURS["target"]).name()
        label = s.source_labels.get(name) or SOURCE_NAMES.get(name, name)
        row = (f'<span style="color:{colour};">■</span> {label} '
               f"{s.token_share.get(name, 0.0):.0%} of tokens")
        drafted = s.drafted_by_source.get(name, 0)
        if drafted:
            acc = s.accepted_by_source.get(name, 0)
            row += f" · {acc}/{drafted} drafts accepted ({acc / drafted:.0%}) · τ {s.tau_by_source.get(name, 0):.2f}"
        rows.append(row)
    return "<br>".join(rows)


class StatsPanel(QWidget):
    """tau, where the tokens came from, acceptance by block position, tokens/s sparkline, measured
    speedup, time split, counts."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        self.state_label = QLabel("No reply yet")
        self.state_label.setObjectName("statsState")
        lay.addWidget(self.state_label)

        nums = QGroupBox("DFlash")
        form = QFormLayout(nums)
        self.tau_label = QLabel("–")
        self.tau_label.setToolTip("mean acceptance length: tokens produced per target verify pass")
        self.tau_running_label = QLabel("–")
        self.tps_label = QLabel("–")
        self.speedup_label = QLabel("–")
        self.baseline_label = QLabel("plain baseline: not measured yet")
        self.baseline_label.setWordWrap(True)
        self.counts_label = QLabel("–")
        form.addRow("τ this reply", self.tau_label)
        form.addRow("τ running", self.tau_running_label)
        form.addRow("tokens/s", self.tps_label)
        form.addRow("speedup", self.speedup_label)
        form.addRow("", self.baseline_label)
        form.addRow("drafted / accepted", self.counts_label)
        lay.addWidget(nums)

        src = QGroupBox("Where the tokens came from")
        sl = QVBoxLayout(src)
        self.source_bar = StackedBar(SOURCE_COLOURS)
        self.source_bar.setToolTip("the share of this reply's tokens each produced: the target's own token "
                                   "of each step, and the accepted drafts of each source")
        self.source_label = QLabel("–")
        self.source_label.setWordWrap(True)
        sl.addWidget(self.source_bar)
        sl.addWidget(self.source_label)
        lay.addWidget(src)

        acc = QGroupBox("Acceptance rate by draft position")
        al = QVBoxLayout(acc)
        self.acceptance_chart = AcceptanceChart()
        al.addWidget(self.acceptance_chart)
        lay.addWidget(acc)

        spark = QGroupBox("Tokens/s over this reply (dashed: measured plain)")
        spl = QVBoxLayout(spark)
        self.sparkline = Sparkline()
        spl.addWidget(self.sparkline)
        lay.addWidget(spark)

        split = QGroupBox("Decode time")
        tl = QVBoxLayout(split)
        self.time_bar = StackedBar(SPLIT_COLOURS)
        self.time_label = QLabel("–")
        self.time_label.setWordWrap(True)
        tl.addWidget(self.time_bar)
        tl.addWidget(self.time_label)
        lay.addWidget(split)
        lay.addStretch(1)
        self._baseline: Baseline | None = None

    def set_baseline(self, b: Baseline | None) -> None:
        self._baseline = b
        if b is None:
            self.baseline_label.setText("plain baseline: not measured yet")
        else:
            self.baseline_label.setText(f"vs plain decoding measured here: {b.tokens_per_s:.1f} tok/s ({b.source})")

    def show_summary(self, s: ReplySummary, series: list[float], state: str) -> None:
        """Show one reply's numbers (live while it streams, or a stored reply's)."""
        self.state_label.setText(state)
        self.tau_label.setText(f"{s.tau:.2f}")
        self.tau_running_label.setText(f"{s.tau_running:.2f}")
        self.tps_label.setText(f"{s.tokens_per_s:.1f} (running {s.tokens_per_s_running:.1f})")
        measured = " measured" if s.speedup is not None else ""
        self.speedup_label.setText(f"{_fmt_speedup(s.speedup)}{measured} "
                                   f"(running {_fmt_speedup(s.speedup_running)})")
        if s.baseline_tokens_per_s:
            self.baseline_label.setText(f"vs plain decoding measured here: {s.baseline_tokens_per_s:.1f} tok/s "
                                        f"({s.baseline_source})")
        rate = f" ({s.accepted / s.drafted:.0%})" if s.drafted else ""
        self.counts_label.setText(f"{s.drafted} / {s.accepted}{rate} · {s.n_generated} tokens")
        self.source_bar.set_data(s.token_share)
        self.source_label.setText(source_rows(s))
        self.acceptance_chart.set_data(s.acceptance_by_pos, s.drafts_by_pos)
        self.sparkline.set_data(series, s.baseline_tokens_per_s)
        parts = {"draft": s.t_draft_s, "verify": s.t_verify_s, "inject": s.t_inject_s, "other": s.t_other_s}
        self.time_bar.set_data(parts)
        total = sum(parts.values())
        self.time_label.setText(" · ".join(
            f'<span style="color:{SPLIT_COLOURS[k].name()};">■</span> {k} {_ms(v)}'
            + (f" ({v / total:.0%})" if total > 0 else "") for k, v in parts.items()))

    def show_record(self, record: dict | None, state: str) -> None:
        """A stored message's stats record (as ChatSession wrote it)."""
        if not record or "summary" not in record:
            self.clear(state)
            return
        self.show_summary(ReplySummary.from_dict(record["summary"]), record.get("tps_series", []), state)

    def clear(self, state: str = "No reply yet") -> None:
        self.show_summary(ReplySummary(), [], state)
        for lab in (self.tau_label, self.tau_running_label, self.tps_label, self.speedup_label, self.counts_label,
                    self.source_label):
            lab.setText("–")
        self.set_baseline(self._baseline)
