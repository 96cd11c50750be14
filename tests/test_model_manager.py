"""The model manager dialog (offscreen Qt) against the loopback hub stand-in:
listing, a download with progress, cancel, a failure shown, offline mode, files with no checksum
waiting for the user to accept them, a connection that keeps dropping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hub_standin import HubStandIn  # tests/ is on sys.path (pytest rootdir conftest)
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from app.hub.download import Downloader
from app.ui.model_manager import COLUMNS, ModelManagerDialog
from gguf_tools.synth import write_tiny_target

MiB = 1 << 20


@pytest.fixture
def tiny_hub(tmp_path: Path):
    """A catalog with one pair: a tiny target (GGUF) and a z-lab checkpoint converted on arrival."""
    pytest.importorskip("safetensors")
    from gguf_tools.synth_hf import write_zlab_checkpoint

    hub = HubStandIn().start()
    target = write_tiny_target(tmp_path / "src" / "tiny-qwen3.gguf", "qwen3")
    hub.add("test/Tiny-GGUF", "tiny-qwen3.gguf", target.read_bytes())
    ckpt = write_zlab_checkpoint(tmp_path / "src" / "ckpt", vocab_size=64, mask_token_id=3, target_layer_ids=[0, 2],
                                 block_size=8)
    for name in ("config.json", "model.safetensors"):
        hub.add("z-lab/Tiny-DFlash-b8", name, (ckpt / name).read_bytes())
    entry = {"id": "tiny", "title": "Tiny pair", "description": "a test pair",
             "target": {"source": "huggingface", "repo": "test/Tiny-GGUF", "file": "tiny-qwen3.gguf"},
             "drafter": {"source": "huggingface", "repo": "z-lab/Tiny-DFlash-b8", "format": "safetensors",
                         "files": ["config.json", "model.safetensors"], "file": "tiny-dflash.gguf"},
             "arch": {"architecture": "qwen3", "n_layer": 4, "n_embd": 64, "n_head_kv": 2, "head_dim": 16,
                      "n_ff": 128, "n_vocab": 64, "n_ctx_train": 1024},
             "drafter_arch": {"n_layer": 2, "n_head_kv": 2, "head_dim": 16, "block_size": 8}}
    cat = tmp_path / "catalog.json"
    cat.write_text(json.dumps({"version": 1, "pairs": [entry]}))
    yield hub, cat, tmp_path / "data" / "models"
    hub.stop()


def _dialog(qtbot, cat: Path, models: Path, hub: HubStandIn, offline: bool = False) -> ModelManagerDialog:  # noqa: ANN001
    dlg = ModelManagerDialog(catalog_path=cat, downloader=Downloader(models, endpoint=hub.endpoint, offline=offline))
    qtbot.addWidget(dlg)
    return dlg


def test_lists_the_shipped_catalog(qtbot, tmp_path: Path) -> None:  # noqa: ANN001
    dlg = ModelManagerDialog(downloader=Downloader(tmp_path / "models", offline=True))
    qtbot.addWidget(dlg)
    t = dlg.table
    assert [t.horizontalHeaderItem(i).text() for i in range(t.columnCount())] == list(COLUMNS)
    rows = {t.item(r, 0).text(): [t.item(r, c).text() for c in range(t.columnCount())] for r in range(t.rowCount())}
    q8 = rows["Qwen3 8B Q4_K_M + z-lab DFlash b16"]
    assert q8[1].startswith("~") and "converted" in q8[2] and q8[3].endswith("GiB") and q8[4] == "not downloaded"
    before = q8[3]
    dlg.ctx_combo.setCurrentIndex(dlg.ctx_combo.count() - 1)  # 32k context: more KV
    row = next(r for r in range(t.rowCount()) if t.item(r, 0).text() == q8[0])
    assert float(t.item(row, 3).text().strip("~ GiB")) > float(before.strip("~ GiB"))


def test_download_shows_progress_and_installs(qtbot, tiny_hub) -> None:  # noqa: ANN001
    hub, cat, models = tiny_hub
    dlg = _dialog(qtbot, cat, models, hub)
    assert dlg.status_of("tiny") == "not downloaded"
    values: list[int] = []
    dlg.progress.valueChanged.connect(values.append)
    with qtbot.waitSignal(dlg.installed, timeout=60_000) as sig:
        qtbot.mouseClick(dlg.download_button, Qt.MouseButton.LeftButton)
        assert dlg.busy and not dlg.download_button.isEnabled() and dlg.cancel_button.isEnabled()
    entry_id, target, drafter = sig.args
    assert entry_id == "tiny" and Path(drafter) == models / "tiny-dflash.gguf" and Path(target).is_file()
    qtbot.waitUntil(lambda: not dlg.cancel_button.isEnabled(), timeout=10_000)
    assert dlg.status_of("tiny") == "installed"
    assert "pair check passed" in dlg.status.text()
    assert values and values[-1] == 1000
    assert sorted(p.name for p in models.iterdir()) == ["tiny-dflash.gguf", "tiny-qwen3.gguf"]


def test_cancel_stops_the_download_and_keeps_the_models_folder_clean(qtbot, tiny_hub) -> None:  # noqa: ANN001
    hub, cat, models = tiny_hub
    big = bytes(range(256)) * (12 * 1024)  # 3 MiB
    hub.add("test/Tiny-GGUF", "tiny-qwen3.gguf", big)  # the target, now big enough to pause in
    hub.pause_after = MiB
    dlg = _dialog(qtbot, cat, models, hub)
    qtbot.mouseClick(dlg.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(hub.paused.is_set, timeout=20_000)
    qtbot.mouseClick(dlg.cancel_button, Qt.MouseButton.LeftButton)
    hub.release.set()
    qtbot.waitUntil(lambda: not dlg.busy, timeout=20_000)
    assert "Cancelled" in dlg.status.text()
    assert dlg.status_of("tiny") == "not downloaded"
    assert not models.exists() or list(models.iterdir()) == []
    # the partial keeps what had reached the disk when the cancel landed (for a later resume):
    # up to the MiB the hub sent before pausing, depending on where the reader was
    assert 0 <= dlg.downloader.partial_bytes("test/Tiny-GGUF", "tiny-qwen3.gguf") <= MiB
    qtbot.waitUntil(lambda: dlg.download_button.isEnabled(), timeout=10_000)


def test_failure_is_shown_and_nothing_is_installed(qtbot, tiny_hub) -> None:  # noqa: ANN001
    hub, cat, models = tiny_hub
    hub.corrupt.add(("test/Tiny-GGUF", "tiny-qwen3.gguf"))
    dlg = _dialog(qtbot, cat, models, hub)
    qtbot.mouseClick(dlg.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not dlg.busy, timeout=20_000)
    assert "sha256 mismatch" in dlg.status.text() and "tiny-qwen3.gguf" in dlg.status.text()
    assert not models.exists() or list(models.iterdir()) == []


def test_offline_checkbox_blocks_the_network(qtbot, tiny_hub) -> None:  # noqa: ANN001
    hub, cat, models = tiny_hub
    dlg = _dialog(qtbot, cat, models, hub)
    dlg.offline_box.setChecked(True)
    qtbot.mouseClick(dlg.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not dlg.busy, timeout=20_000)
    assert "offline mode is on" in dlg.status.text()
    assert hub.log == []


def test_closing_during_a_download_cancels_it(qtbot, tiny_hub) -> None:  # noqa: ANN001
    hub, cat, models = tiny_hub
    hub.add("test/Tiny-GGUF", "tiny-qwen3.gguf", bytes(range(256)) * (12 * 1024))
    hub.pause_after = MiB
    dlg = _dialog(qtbot, cat, models, hub)
    qtbot.mouseClick(dlg.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(hub.paused.is_set, timeout=20_000)
    hub.release.set()
    dlg.close()
    assert not models.exists() or list(models.iterdir()) == []


def test_a_target_with_no_checksum_waits_until_the_user_accepts_it(qtbot, tiny_hub) -> None:  # noqa: ANN001
    hub, cat, models = tiny_hub
    hub.opaque_etag.add(("test/Tiny-GGUF", "tiny-qwen3.gguf"))
    hub.no_api = True  # a mirror without the API: no sha256 anywhere for the target
    dlg = _dialog(qtbot, cat, models, hub)
    assert not dlg.accept_button.isEnabled()
    qtbot.mouseClick(dlg.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not dlg.busy, timeout=20_000)
    assert "test/Tiny-GGUF/tiny-qwen3.gguf: neither the catalog nor the hub gives a checksum" in dlg.status.text()
    assert "Accept unverified" in dlg.status.text()
    assert dlg.status_of("tiny") == "unverified: accept or leave"
    assert not models.exists() or list(models.iterdir()) == []
    qtbot.waitUntil(dlg.accept_button.isEnabled, timeout=10_000)
    # asked, and the user says no: nothing moves
    qtbot.mouseClick(dlg.accept_button, Qt.MouseButton.LeftButton)
    assert dlg.confirm is not None and dlg.confirm.isVisible()
    assert "test/Tiny-GGUF/tiny-qwen3.gguf" in dlg.confirm.text()
    dlg.confirm.button(QMessageBox.StandardButton.No).click()
    assert "Left unverified" in dlg.status.text() and (not models.exists() or list(models.iterdir()) == [])
    # asked again, and yes: the target moves in and the rest of the pair installs
    qtbot.mouseClick(dlg.accept_button, Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(dlg.installed, timeout=60_000) as sig:
        dlg.confirm.button(QMessageBox.StandardButton.Yes).click()
    assert Path(sig.args[1]) == models / "tiny-qwen3.gguf" and (models / "tiny-qwen3.gguf").is_file()
    qtbot.waitUntil(lambda: not dlg.cancel_button.isEnabled(), timeout=10_000)
    assert dlg.status_of("tiny") == "installed" and not dlg.accept_button.isEnabled()


def test_a_connection_that_keeps_dropping_ends_in_an_error_the_panel_shows(qtbot, tiny_hub) -> None:  # noqa: ANN001
    hub, cat, models = tiny_hub
    hub.drop_after = 1000  # every GET is cut after 1000 bytes
    dlg = ModelManagerDialog(catalog_path=cat, downloader=Downloader(models, endpoint=hub.endpoint, retries=2,
                                                                     retry_wait_s=0.05))
    qtbot.addWidget(dlg)
    qtbot.mouseClick(dlg.download_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not dlg.busy, timeout=20_000)
    assert dlg.status.text().startswith("Download failed: test/Tiny-GGUF/tiny-qwen3.gguf: the connection kept "
                                        "failing (RemoteProtocolError); gave up after 2 attempts")
    assert len(hub.gets()) == 2 and (not models.exists() or list(models.iterdir()) == [])
