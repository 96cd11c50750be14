"""Pieces of the window on their own: Markdown rendering, the charts, the stats panel."""

from __future__ import annotations

from PySide6.QtGui import QColor, QImage

from app.engine.draft_policy import PLAIN, SOURCES
from app.session.baseline import Baseline
from app.session.summary import ReplySummary
from app.ui.charts import BAR, SOURCE_COLOURS, AcceptanceChart, Sparkline
from app.ui.chat_view import message_stats_line
from app.ui.markdown_view import render_drafted, render_markdown
from app.ui.stats_panel import SOURCE_NAMES, StatsPanel


def test_markdown_escapes_html_and_highlights_code_with_a_copy_link():
    r = render_markdown("**bold** <script>alert(1)</script>\n\n```python\ndef f():\n    return 1\n```\n")
    assert "<strong>bold</strong>" in r.html and "<script>" not in r.html and "&lt;script&gt;" in r.html
    assert r.code_blocks == ["def f():\n    return 1\n"]
    assert 'href="copy:0"' in r.html and "font-weight: bold" in r.html  # `def` as a keyword


def test_drafted_view_marks_exactly_the_drafted_spans():
    r = render_drafted("ab<c>de", [[1, 3], [5, 7]])
    assert r.html.count("background-color") == 2
    assert ">b&lt;</span>" in r.html and ">de</span>" in r.html


def _render(widget) -> QImage:  # noqa: ANN001
    widget.resize(300, widget.sizeHint().height())
    return widget.grab().toImage()


def _count(img: QImage, colour: QColor) -> int:
    return sum(1 for x in range(img.width()) for y in range(img.height()) if img.pixelColor(x, y) == colour)


def test_acceptance_chart_bar_heights_follow_the_rates(qtbot):
    c = AcceptanceChart()
    qtbot.addWidget(c)
    c.set_data([1.0] + [0.0] * 14, [5] + [0] * 14)
    full = _count(_render(c), BAR)
    c.set_data([0.5] + [0.0] * 14, [5] + [0] * 14)
    half = _count(_render(c), BAR)
    assert full > 0 and abs(half / full - 0.5) < 0.1


def _row_of(img: QImage, green: bool) -> float:
    """The mean row of the drawn pixels, weighted by how dark they are: the green series line
    (green=True) or the grey dashed baseline (green=False; the bottom rule excluded)."""
    bg = img.pixelColor(0, 0)
    rows = weights = 0.0
    for y in range(img.height() - 2):
        for x in range(img.width()):
            c = img.pixelColor(x, y)
            if c == bg or (c.green() > max(c.red(), c.blue())) != green:  # the grey has more blue
                continue
            w = (bg.red() + bg.green() + bg.blue()) - (c.red() + c.green() + c.blue())
            rows, weights = rows + y * w, weights + w
    assert weights > 0, "nothing drawn"
    return rows / weights


def test_sparkline_draws_the_series_against_the_baseline(qtbot):
    s = Sparkline()
    qtbot.addWidget(s)
    for value, baseline in ((30, 10.0), (5, 20.0)):  # flat series above, then below the baseline
        s.set_data([value] * 3, baseline=baseline)
        img = _render(s)
        h, top = img.height(), max(value, baseline) * 1.1  # the scale leaves 10% above the highest value
        assert abs(_row_of(img, True) - ((h - 2) - (h - 6) * value / top)) <= 1.0
        assert abs(_row_of(img, False) - ((h - 2) - (h - 6) * baseline / top)) <= 1.0
    s.set_data([10, 20, 30], baseline=None)  # a rising series: its right end is higher (a smaller row)
    img = _render(s)
    w = img.width()
    left = [y for y in range(img.height()) if img.pixelColor(2, y).green() - img.pixelColor(2, y).red() > 15]
    right = [y for y in range(img.height()) if img.pixelColor(w - 3, y).green() - img.pixelColor(w - 3, y).red() > 15]
    assert left and right and min(right) < min(left)


def test_stats_panel_shows_the_numbers_it_is_given(qtbot):
    p = StatsPanel()
    qtbot.addWidget(p)
    p.set_baseline(Baseline(40.0, "plain run"))
    s = ReplySummary(tau=3.25, tokens_per_s=80.0, speedup=2.0, tau_running=3.0, tokens_per_s_running=70.0,
                     speedup_running=1.75, baseline_tokens_per_s=40.0, baseline_source="plain run",
                     t_draft_s=0.1, t_verify_s=0.3, t_inject_s=0.05, t_other_s=0.05, drafted=100, accepted=60,
                     n_generated=90, acceptance_by_pos=[0.9, 0.7], drafts_by_pos=[40, 40],
                     drafted_by_source={"lookup": 30, "dflash": 70}, accepted_by_source={"lookup": 24, "dflash": 36},
                     tau_by_source={"lookup": 4.0, "dflash": 2.2}, token_share={"target": 0.4, "lookup": 0.24,
                                                                               "dflash": 0.36})
    p.show_summary(s, [50.0, 80.0], "Streaming…")
    assert p.tau_label.text() == "3.25" and p.tau_running_label.text() == "3.00"
    assert p.speedup_label.text().startswith("2.00× measured") and "1.75×" in p.speedup_label.text()
    assert "40.0 tok/s" in p.baseline_label.text() and "plain run" in p.baseline_label.text()
    assert p.counts_label.text().startswith("100 / 60 (60%)")
    assert "verify 300 ms (60%)" in p.time_label.text()
    assert p.acceptance_chart.rates == [0.9, 0.7]
    # per source: the stacked bar of token shares and a row each
    assert p.source_bar.parts == {"target": 0.4, "lookup": 0.24, "dflash": 0.36}
    rows = p.source_label.text().split("<br>")
    assert "target 40% of tokens" in rows[0]
    assert "context lookup 24% of tokens · 24/30 drafts accepted (80%) · τ 4.00" in rows[1]
    assert "DFlash drafter 36% of tokens · 36/70 drafts accepted (51%) · τ 2.20" in rows[2]
    assert "drafted by lookup + DFlash" in message_stats_line({"summary": s.to_dict()})


def test_every_draft_source_has_its_name_and_its_own_colour(qtbot):
    """Each source the engine can draft from (draft_policy.SOURCES) is named in the stats panel and drawn
    in a colour of its own; a summary that names a source by its file (a DFlash2 drafter) is shown so."""
    drafting = [s for s in SOURCES if s != PLAIN]  # plain decoding's token is the target's row
    assert not set(drafting) - set(SOURCE_NAMES) and not set(drafting) - set(SOURCE_COLOURS)
    colours = [SOURCE_COLOURS[s].name() for s in ["target", *drafting]]
    assert len(set(colours)) == len(colours)
    p = StatsPanel()
    qtbot.addWidget(p)
    s = ReplySummary(tau=2.0, drafted=12, accepted=8, n_generated=20, drafted_by_source={"eagle3": 6, "dflash": 6},
                     accepted_by_source={"eagle3": 4, "dflash": 4}, tau_by_source={"eagle3": 3.0, "dflash": 3.0},
                     token_share={"target": 0.6, "dflash": 0.2, "eagle3": 0.2},
                     source_labels={"dflash": "DFlash2 drafter"})
    p.show_summary(s, [], "Finished")
    rows = p.source_label.text().split("<br>")
    assert "DFlash2 drafter 20% of tokens · 4/6 drafts accepted (67%)" in rows[1]
    assert f'color:{SOURCE_COLOURS["eagle3"].name()};' in rows[2]
    assert "EAGLE-3 drafter 20% of tokens · 4/6 drafts accepted (67%) · τ 3.00" in rows[2]
    assert "drafted by DFlash + EAGLE-3" in message_stats_line({"summary": s.to_dict()})
    # a reply stored before summaries named their sources reads with the panel's own names
    old = s.to_dict()
    del old["source_labels"]
    p.show_record({"summary": old}, "Finished")
    assert "DFlash drafter 20% of tokens" in p.source_label.text().split("<br>")[1]


def test_input_box_enter_sends_and_shift_enter_adds_a_line(qtbot):
    from PySide6.QtCore import Qt

    from app.ui.input_box import InputBox

    box = InputBox()
    qtbot.addWidget(box)
    sent = []
    box.submitted.connect(lambda: sent.append(box.toPlainText()))
    qtbot.keyClicks(box, "one")
    qtbot.keyClick(box, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(box, "two")
    assert sent == [] and box.toPlainText() == "one\ntwo"
    qtbot.keyClick(box, Qt.Key.Key_Return)
    assert sent == ["one\ntwo"]
