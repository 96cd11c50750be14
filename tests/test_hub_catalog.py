"""The catalog, the VRAM estimate, installing a pair (a safetensors drafter
converted on arrival) and `flashdesk models`, against the loopback hub stand-in."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hub_standin import HubStandIn  # tests/ is on sys.path (pytest rootdir conftest)

from app.cli import main as flashdesk
from app.hub import vram
from app.hub.catalog import CatalogError, find_entry, load_catalog
from app.hub.download import Downloader, OfflineError
from app.hub.install import InstallResult, NotAvailable, install_pair, pair_status
from app.hub.paths import UnsafeFilename
from app.hub.vram import estimate_from_catalog, estimate_vram
from gguf_tools.synth import write_tiny_target

pytest.importorskip("safetensors")


def test_shipped_catalog_is_valid_and_honest_about_sizes() -> None:
    entries = load_catalog()
    ids = [e.id for e in entries]
    assert {"gemma3-270m", "qwen3-8b", "llama3.1-8b-instruct", "qwen3.6-27b"} <= set(ids)
    q8 = find_entry(entries, "qwen3-8b")
    assert q8.drafter.repo == "z-lab/Qwen3-8B-DFlash-b16" and q8.drafter.needs_conversion
    assert "config.json" in q8.drafter.files
    for e in entries:
        for mf in (e.target, e.drafter):
            if mf.size_bytes and not mf.size_verified:
                assert mf.size_text().startswith("~")  # approximate sizes say so
            if mf.source == "huggingface":
                assert mf.repo
    g = find_entry(entries, "gemma3-270m")
    assert g.target.size_verified and g.target.sha256 and g.target.size_text() == "253 MB"
    assert "target" in find_entry(entries, "qwen3.6-27b").notes  # unverified repo is flagged
    with pytest.raises(CatalogError, match="no catalog entry 'nope'"):
        find_entry(entries, "nope")


def _write_catalog(path: Path, pairs: list[dict]) -> Path:
    path.write_text(json.dumps({"version": 1, "pairs": pairs}))
    return path


def _tiny_entry(**over) -> dict:
    e = {"id": "tiny", "title": "Tiny qwen3 + tiny z-lab drafter", "description": "test pair",
         "target": {"source": "huggingface", "repo": "test/Tiny-GGUF", "file": "tiny-qwen3.gguf", "format": "gguf",
                    "size_bytes": None, "size_verified": False, "sha256": None},
         "drafter": {"source": "huggingface", "repo": "z-lab/Tiny-DFlash-b8", "files": ["config.json",
                                                                                       "model.safetensors"],
                     "format": "safetensors", "file": "tiny-dflash.gguf", "size_bytes": None,
                     "size_verified": False, "sha256": None},
         "arch": {"architecture": "qwen3", "n_layer": 4, "n_embd": 64, "n_head_kv": 2, "head_dim": 16, "n_ff": 128,
                  "n_vocab": 64, "n_ctx_train": 1024},
         "drafter_arch": {"n_layer": 2, "n_head_kv": 2, "head_dim": 16, "block_size": 8}}
    for k, v in over.items():
        e[k] = v
    return e


@pytest.mark.parametrize("change, error, words", [
    ({"target": {"source": "huggingface", "repo": "a/b", "file": "../../evil.gguf"}}, UnsafeFilename,
     "path traversal"),
    ({"target": {"source": "ftp", "repo": "a/b", "file": "x.gguf"}}, CatalogError, "source 'ftp'"),
    ({"target": {"source": "huggingface", "file": "x.gguf"}}, CatalogError, "needs a repo"),
    ({"target": {"source": "huggingface", "repo": "a/b", "file": "x.gguf", "sha256": "abc"}}, CatalogError,
     "64 lowercase hex"),
    ({"arch": {"n_layer": 4}}, CatalogError, "bad arch"),
])
def test_bad_catalog_entries_are_rejected(tmp_path: Path, change: dict, error: type, words: str) -> None:
    cat = _write_catalog(tmp_path / "c.json", [_tiny_entry(**change)])
    with pytest.raises(error, match=words):
        load_catalog(cat)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(CatalogError, match="bad.json: not valid JSON"):
        load_catalog(tmp_path / "bad.json")


def test_vram_estimate_grows_with_context_and_respects_sliding_windows() -> None:
    entries = load_catalog()
    q8 = find_entry(entries, "qwen3-8b")
    small, big = estimate_from_catalog(q8, 4096), estimate_from_catalog(q8, 32768)
    assert big.kv == 8 * small.kv and big.total > small.total and small.approximate
    # Qwen3-8B f16 KV: 36 layers x 8 kv heads x 128 x 2 (K,V) x 2 bytes = 144 KiB per token
    assert small.kv == 4096 * 36 * 8 * 128 * 2 * 2
    g = find_entry(entries, "gemma3-270m")
    g_small, g_big = estimate_from_catalog(g, 4096), estimate_from_catalog(g, 32768)
    # only 3 of Gemma's 18 layers are global; the 15 sliding ones stop at window (512) + ubatch (512)
    per_cell = 1 * 256 * 2 * 2  # 1 kv head x 256 x (K, V) x f16
    assert g_small.kv == (3 * 4096 + 15 * 1024) * per_cell
    assert g_big.kv == (3 * 32768 + 15 * 1024) * per_cell
    assert estimate_from_catalog(g, 10 ** 6).n_ctx == 32768  # clamped to the training context


@pytest.mark.gemma
def test_vram_from_the_scheduler_when_the_files_are_here(gemma_target: Path, gemma_random_drafter: Path) -> None:
    g = find_entry(load_catalog(), "gemma3-270m")
    est = estimate_vram(g, 8192, gemma_target, gemma_random_drafter)
    assert est.source == "scheduler" and not est.approximate and est.kv > 0 and est.drafter > 0
    # the catalog formula lands near the scheduler's figure (the drafter's size added to it)
    approx = estimate_from_catalog(g, 8192)
    approx_total = approx.total + gemma_random_drafter.stat().st_size
    assert abs(approx_total - est.total) / est.total < 0.15


def test_vram_falls_back_to_the_catalog_only_for_files_the_planner_cannot_size(
        tiny_pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = find_entry(load_catalog(), "gemma3-270m")
    target, drafter = tiny_pair
    assert estimate_vram(entry, 512, target, drafter).source == "scheduler"
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF but not really")
    missing = tmp_path / "missing.gguf"
    for t in (bad, missing):  # a file it cannot read: the catalog's formula
        est = estimate_vram(entry, 512, t, drafter)
        assert est.source == "catalog" and est == estimate_from_catalog(entry, 512)

    def broken_planner(*_a, **_kw):  # noqa: ANN002, ANN003, ANN202
        raise ZeroDivisionError("a planner bug")

    # a bug in the planner is not a file problem: it surfaces instead of becoming an estimate
    monkeypatch.setattr(vram, "plan_split", broken_planner)
    with pytest.raises(ZeroDivisionError, match="a planner bug"):
        estimate_vram(entry, 512, target, drafter)


@pytest.fixture
def tiny_hub(tmp_path: Path):
    """The stand-in publishing a tiny qwen3 target GGUF and a z-lab checkpoint for it."""
    from gguf_tools.synth_hf import write_zlab_checkpoint

    hub = HubStandIn().start()
    target = write_tiny_target(tmp_path / "src" / "tiny-qwen3.gguf", "qwen3")
    hub.add("test/Tiny-GGUF", "tiny-qwen3.gguf", target.read_bytes())
    ckpt = write_zlab_checkpoint(tmp_path / "src" / "ckpt", vocab_size=64, mask_token_id=3, target_layer_ids=[0, 2],
                                 block_size=8)
    for name in ("config.json", "model.safetensors"):
        hub.add("z-lab/Tiny-DFlash-b8", name, (ckpt / name).read_bytes())
    cat = _write_catalog(tmp_path / "catalog.json", [_tiny_entry()])
    yield hub, cat, tmp_path / "data" / "models"
    hub.stop()


def test_install_pair_converts_the_safetensors_drafter_on_arrival(tiny_hub) -> None:  # noqa: ANN001
    hub, cat, models = tiny_hub
    entry = find_entry(load_catalog(cat), "tiny")
    dl = Downloader(models, endpoint=hub.endpoint)
    assert pair_status(entry, dl).text() == "not downloaded"
    stages: list[str] = []
    res = install_pair(entry, dl, progress=lambda p: stages.append(p.stage))
    assert isinstance(res, InstallResult)
    assert res.report.ok, res.report.problems
    assert sorted(p.name for p in models.iterdir()) == ["tiny-dflash.gguf", "tiny-qwen3.gguf"]
    assert "convert" in stages
    assert not (dl.staging / "checkpoints" / "z-lab--Tiny-DFlash-b8").exists()  # checkpoint cleaned up
    assert pair_status(entry, dl).text() == "installed"
    # the converted drafter really drafts for the downloaded target
    from app.engine.dflash import Engine, EngineConfig
    from app.engine.params import GenerationParams

    e = Engine(res.target, res.drafter, EngineConfig(n_ctx=256))
    try:
        evs = list(e.generate(e.tokenize("the cat"), GenerationParams(max_tokens=5, draft_max=3)))
        assert evs[-1].stats.drafted > 0
    finally:
        e.close()
    # installed: offline mode finds everything without the network
    n = len(hub.log)
    again = install_pair(entry, Downloader(models, endpoint=hub.endpoint, offline=True))
    assert again.drafter == res.drafter and len(hub.log) == n


def test_install_offline_and_not_available(tiny_hub, tmp_path: Path) -> None:  # noqa: ANN001
    hub, cat, models = tiny_hub
    entry = find_entry(load_catalog(cat), "tiny")
    with pytest.raises(OfflineError):
        install_pair(entry, Downloader(models, endpoint=hub.endpoint, offline=True))
    assert hub.log == []
    bundled = _tiny_entry(drafter={"source": "bundled", "file": "not-shipped-yet.gguf"})
    entry2 = find_entry(load_catalog(_write_catalog(tmp_path / "c2.json", [bundled])), "tiny")
    with pytest.raises(NotAvailable, match="not-shipped-yet.gguf"):
        install_pair(entry2, Downloader(models, endpoint=hub.endpoint))


def test_models_cli_list_and_download(tiny_hub, capsys: pytest.CaptureFixture) -> None:  # noqa: ANN001
    hub, cat, models = tiny_hub
    common = ["--models-dir", str(models), "--catalog", str(cat), "--endpoint", hub.endpoint]
    assert flashdesk(["models", "list", "--json", "--ctx", "512", *common]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["pairs"][0]["status"] == "not downloaded" and listed["pairs"][0]["vram"]["source"] == "catalog"
    assert flashdesk(["models", "download", "tiny", *common]) == 0
    out = capsys.readouterr().out
    assert "[ok] tokenizer" in out and str(models / "tiny-dflash.gguf") in out
    assert flashdesk(["models", "list", "--json", "--ctx", "512", "--offline", *common]) == 0
    row = json.loads(capsys.readouterr().out)["pairs"][0]
    assert row["status"] == "installed"
    assert row["vram"]["total"] > 0
    assert flashdesk(["models", "path", "--models-dir", str(models)]) == 0
    assert capsys.readouterr().out.strip() == str(models)
    assert flashdesk(["models", "download", "nope", *common]) == 2
