"""The drafters a target has on this machine (app.hub.local_drafters), the catalog's drafters per
target, and `pair`/`inspect` on a target carrying MTP heads: real tiny GGUFs from gguf_tools.synth,
header-level copies for the formats synth cannot write as a model (EAGLE-3, MTP)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.cli import main as flashdesk
from app.hub.catalog import DEFAULT_CATALOG, CatalogError, find_entry, load_catalog
from app.hub.local_drafters import ROLE_DRAFT_MODEL, ROLE_DRAFTER, ROLE_MTP, find_drafters
from gguf_tools.edit import copy_gguf
from gguf_tools.inspect import format_report, inspect_gguf
from gguf_tools.pair import check_pair
from gguf_tools.synth import (
    DFlash2Shape,
    TinyShape,
    write_drafter,
    write_eagle3,
    write_tiny_pair,
    write_tiny_target,
)

TAPS = ("qwen3", "gemma3")


@pytest.fixture(scope="module")
def shelf(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A folder as a user has it: a target, its DFlash drafter, a DFlash2 drafter, an EAGLE-3 drafter, a
    smaller model of the same family (named as the catalog's classic draft
    model), and files that do not fit."""
    d = tmp_path_factory.mktemp("shelf")
    target, v1 = write_tiny_pair(d, "qwen3")
    files = {"target": target, "v1": v1}
    files["v2"] = write_drafter(d / "tiny-dflash2.gguf", target, target_layers=[1, 3], block_size=8,
                                dflash2=DFlash2Shape())
    files["e3"] = write_eagle3(d / "tiny-eagle3.gguf", target)
    files["small"] = write_tiny_target(d / "Qwen3-0.6B-Q8_0.gguf", "qwen3", TinyShape(n_layer=1), seed=3)
    # a drafter reading a layer this target does not have: its pair check fails
    files["bad"] = copy_gguf(v1, d / "tiny-other-target-dflash.gguf", meta={"dflash.target_layers": [1, 9]})
    # a bigger model of the family is no draft model for it
    files["big"] = write_tiny_target(d / "tiny-bigger.gguf", "qwen3", TinyShape(n_layer=6), seed=4)
    (d / "notes.gguf").write_text("not a model")
    return files


def test_finds_the_drafters_of_a_target_by_format(shelf: dict[str, Path]) -> None:
    found = find_drafters(shelf["target"], folders=[shelf["target"].parent], catalog=load_catalog(), tap_archs=TAPS)
    got = [(Path(o.path).name, o.role, o.format_label, o.usable) for o in found]
    assert got == [
        ("tiny-dflash2.gguf", ROLE_DRAFTER, "DFlash2", True),
        ("tiny-eagle3.gguf", ROLE_DRAFTER, "EAGLE-3", True),
        (shelf["v1"].name, ROLE_DRAFTER, "DFlash v1", True),
        ("Qwen3-0.6B-Q8_0.gguf", ROLE_DRAFT_MODEL, "classic draft model", True),
    ]
    v2, e3, v1, small = found
    assert small.why == "shares the target's token list"
    assert small.catalog_title == "Qwen3 0.6B Q8_0 (classic draft model)"
    assert v2.why == "the pair check passed"
    assert e3.why == "the pair check passed" and e3.text == "tiny-eagle3.gguf — EAGLE-3 (drafter)"
    assert v1.text == f"{shelf['v1'].name} — DFlash v1 (drafter)"


def test_a_target_with_mtp_heads_offers_them_and_its_folder_once(shelf: dict[str, Path], tmp_path: Path) -> None:
    mtp = copy_gguf(shelf["target"], tmp_path / "tiny-mtp-target.gguf", meta={"qwen3.nextn_predict_layers": 1})
    shutil.copy(shelf["v1"], tmp_path / shelf["v1"].name)
    # the same folder twice (its own folder and the models folder): each file once
    found = find_drafters(mtp, folders=[tmp_path, tmp_path], tap_archs=TAPS)
    assert [(o.role, o.format_label, o.usable, o.path) for o in found] == [
        (ROLE_DRAFTER, "DFlash v1", True, str((tmp_path / shelf["v1"].name).resolve())),
        (ROLE_MTP, "target with MTP heads", True, ""),
    ]
    assert "1 MTP (nextn) head" in found[1].why and found[1].text.startswith("the target's own MTP heads")
    assert found[1].why.endswith("a load of this target drafts with it unless turned off (--no-mtp)")
    # pair and inspect say it too
    rep = check_pair(mtp, shelf["v1"], tap_archs=TAPS)
    assert rep.ok and "carries its own draft heads" in rep.check("target_mtp").detail
    assert "draft format   target with MTP heads (llama.cpp draft-mtp)" in format_report(inspect_gguf(mtp))


def test_the_catalog_lists_drafters_per_target_with_format_and_size(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    entries = load_catalog()
    q8 = find_entry(entries, "qwen3-8b")
    assert [d.draft_format for d in q8.drafters] == ["plain"]
    lines = q8.drafter_lines()
    assert lines[0].startswith("qwen3-8b-dflash-b16.gguf (z-lab/Qwen3-8B-DFlash-b16): DFlash v1, ~2.10 GB")
    assert lines[1].startswith("Qwen3 0.6B Q8_0 (classic draft model) (Qwen/Qwen3-0.6B-GGUF): classic draft model "
                               "(same vocabulary), ~640 MB [unverified:")
    q36 = find_entry(entries, "qwen3.6-27b")
    mtp = next(d for d in q36.drafters if d.draft_format == "mtp")
    assert mtp.file is None and "no second file" in mtp.text() and mtp.unverified
    for e in entries:  # sizes nobody measured say so, and nothing carries an invented checksum
        for d in e.drafters:
            if d.file is not None:
                assert d.file.sha256 is None and not d.file.size_verified and d.unverified
    # `flashdesk models list` says them too
    assert flashdesk(["models", "list", "--offline", "--models-dir", str(tmp_path / "models")]) == 0
    out = capsys.readouterr().out
    assert f"also: {lines[1]}" in out and "also: Qwen3.6 27B's own MTP heads: the target's own MTP heads" in out
    raw = json.loads(DEFAULT_CATALOG.read_text())
    pair = next(p for p in raw["pairs"] if p["id"] == "qwen3-8b")
    for bad, words in (({"draft_format": "medusa"}, "draft_format 'medusa'"),
                       ({"draft_format": "mtp", "file": "x.gguf"}, "name no file")):
        (tmp_path / "c.json").write_text(json.dumps({"pairs": [{**pair, "drafters": [bad]}]}))
        with pytest.raises(CatalogError, match=words):
            load_catalog(tmp_path / "c.json")
