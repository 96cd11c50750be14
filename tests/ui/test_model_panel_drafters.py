"""The Model panel offers the drafters on disk for the chosen target (no file dialog) and, after a
load, shows which draft source is in use and why, as the engine process says it; the Model manager
lists every drafter the catalog knows per target."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt

from app.bundled import DEFAULT_DRAFTER
from app.hub.download import Downloader
from app.session.models import ModelSpec
from app.ui.model_manager import ModelManagerDialog
from app.ui.model_panel import ModelPanel
from gguf_tools.edit import copy_gguf
from gguf_tools.synth import TinyShape, write_eagle3, write_tiny_target
from tests.ui.conftest import LOAD_TIMEOUT_MS, TINY_TEMPLATE


@pytest.fixture(autouse=True)
def empty_models_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The user's real models folder stays out of these tests."""
    d = tmp_path / "models"
    d.mkdir()
    monkeypatch.setenv("FLASHDESK_MODELS_DIR", str(d))
    return d


def _items(panel: ModelPanel) -> list[tuple[str, bool]]:
    c = panel.found_combo
    return [(c.itemText(i), c.model().item(i).isEnabled()) for i in range(c.count())]


def _pick(qtbot, panel: ModelPanel, words: str) -> None:  # noqa: ANN001
    """Choose the found drafter whose line has `words`, as a user does in the list."""
    c = panel.found_combo
    i = next(i for i in range(c.count()) if words in c.itemText(i))
    c.setCurrentIndex(i)
    c.activated.emit(i)


def test_the_bundled_drafter_is_offered_for_the_bundled_target(qtbot, gemma_target: Path) -> None:  # noqa: ANN001
    panel = ModelPanel()
    qtbot.addWidget(panel)
    panel.fill_pair(str(gemma_target), None)
    line = f"{DEFAULT_DRAFTER.name} — DFlash v1 (drafter) · Gemma 3 270M (bundled): drafter"
    assert (line, True) in _items(panel)
    assert panel.found_combo.itemText(0).endswith("found for this target")
    _pick(qtbot, panel, DEFAULT_DRAFTER.name)
    assert panel.spec().drafter == str(DEFAULT_DRAFTER.resolve()) and panel.spec().draft_model is None
    _pick(qtbot, panel, "none: plain decoding")
    assert panel.spec().drafter is None


def test_a_draft_model_and_an_eagle3_file_are_offered_by_format(qtbot, tiny_pair, tmp_path: Path) -> None:  # noqa
    target, _ = tiny_pair
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    t = Path(copy_gguf(target, shelf / target.name))
    small = write_tiny_target(shelf / "tiny-small.gguf", "qwen3", TinyShape(n_layer=1), seed=3)
    write_eagle3(shelf / "tiny-eagle3.gguf", t)
    panel = ModelPanel()
    qtbot.addWidget(panel)
    panel.target_edit.setText(str(t))
    panel.target_edit.editingFinished.emit()
    assert _items(panel)[1:] == [
        ("none: plain decoding with the context lookup", True),
        ("tiny-eagle3.gguf — EAGLE-3 (drafter)", True),
        ("tiny-small.gguf — classic draft model (draft model)", True),
    ]
    assert "the pair check passed" in panel.found_combo.model().item(2).toolTip()
    _pick(qtbot, panel, "tiny-small.gguf")
    spec = panel.spec()
    assert spec.draft_model == str(small.resolve()) and spec.drafter is None
    panel.target_edit.setText(str(tmp_path / "missing.gguf"))
    panel.scan_drafters()
    assert _items(panel) == [(panel.found_combo.itemText(0), True)]
    assert "cannot read the target" in panel.found_combo.itemText(0) and "no such file" in panel.found_combo.itemText(0)


def test_the_panel_shows_which_source_is_in_use_and_why(qtbot, open_window, tiny_spec: ModelSpec,  # noqa: ANN001
                                                         tmp_path: Path) -> None:
    e3 = write_eagle3(tmp_path / "tiny-eagle3.gguf", tiny_spec.target)
    chosen = ModelSpec(tiny_spec.target, str(e3), n_ctx=tiny_spec.n_ctx, n_threads=1)
    w = open_window(tmp_path / "db.sqlite3", chosen)
    panel = w.model_panel
    # an EAGLE-3 drafter is its own source (no DFlash graph), and the panel says so (the engine process's words)
    assert not w.model_info.has_drafter
    assert ("EAGLE-3 drafter tiny-eagle3.gguf in use: fed 3 of the target's hidden states (layers [1, 2, 3]), "
            "up to 8 drafts a step, one pass each\ncontext lookup: on beside them") in panel.status_label.text()
    assert panel.drafter_edit.text() == str(e3)
    # the compatible DFlash drafter next to the target is offered: pick it, load, and the panel says so
    _pick(qtbot, panel, Path(tiny_spec.drafter).name)
    qtbot.mouseClick(panel.load_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.model_info is not None and w.model_info.has_drafter and not w.loading,
                    timeout=LOAD_TIMEOUT_MS)
    assert (f"DFlash drafter {Path(tiny_spec.drafter).name} in use: blocks of 8" in panel.status_label.text())
    assert "context lookup: on beside them" in panel.status_label.text()


def test_the_targets_mtp_head_is_a_switch_in_the_panel(qtbot, open_window, tiny_chat_pair,  # noqa: ANN001
                                                        tmp_path: Path) -> None:
    """"Use the target's MTP head": on by default, offered only for a target carrying a head the loop
    drives; turned off, the next load (in the engine process) leaves the head unused and the panel says why."""
    mtp = write_tiny_target(tmp_path / "tiny-qwen35-mtp.gguf", "qwen35", chat_template=TINY_TEMPLATE, mtp_layers=1)
    w = open_window(tmp_path / "db.sqlite3", ModelSpec(str(mtp), n_ctx=512, n_threads=1))
    panel = w.model_panel
    box = panel.mtp_check
    assert box.isEnabled() and box.isChecked() and w.model_info.spec.mtp
    assert "the target's own MTP head in use" in panel.status_label.text()
    qtbot.mouseClick(box, Qt.MouseButton.LeftButton, pos=QPoint(box.iconSize().width() // 2 + 2, box.height() // 2))
    assert not box.isChecked() and panel.spec().mtp is False
    qtbot.mouseClick(panel.load_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: w.model_info is not None and not w.model_info.spec.mtp and not w.loading,
                    timeout=LOAD_TIMEOUT_MS)
    status = panel.status_label.text()
    assert "the target's own MTP head in use" not in status
    assert "the target carries MTP heads" in status and "not used: turned off for this load" in status
    assert w.store.get_setting("model")["mtp"] is False  # the next start loads it the same way
    # a target without a head: nothing to switch
    panel.fill_pair(str(tiny_chat_pair[0]), None)
    assert not box.isEnabled() and "no MTP head" in box.toolTip()
    panel.fill_pair(str(mtp), None)
    assert box.isEnabled()


def test_the_model_manager_lists_every_drafter_per_target(qtbot, tmp_path: Path) -> None:  # noqa: ANN001
    dlg = ModelManagerDialog(downloader=Downloader(tmp_path / "models", offline=True))
    qtbot.addWidget(dlg)
    dlg.select("qwen3-8b")
    text = dlg.description.text()
    assert "Drafters for this target:" in text
    assert "qwen3-8b-dflash-b16.gguf (z-lab/Qwen3-8B-DFlash-b16): DFlash v1, ~2.10 GB" in text
    assert "Qwen3 0.6B Q8_0 (classic draft model) (Qwen/Qwen3-0.6B-GGUF): classic draft model" in text
    dlg.select("qwen3.6-27b")
    assert "the target's own MTP heads, no second file [unverified:" in dlg.description.text()
