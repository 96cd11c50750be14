"""The draft modes named after a drafter format, `dflash2` and `dspark` (app.engine.controller.FORMAT_MODES):
the fixed policy of the one DFlash source, on the tiny qwen3 target with a random DFlash2 or DSpark drafter
(conftest), through `flashdesk bench` and `flashdesk generate`; on a drafter of another format they refuse
with the file's name and format before anything runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main

PROMPT = "the cat sat on the mat"


def _bench(tmp_path: Path, target: Path, drafter: Path, modes: str) -> dict:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "t", "prompt": PROMPT, "format": "raw", "category": "tiny"}) + "\n")
    out = tmp_path / f"bench-{drafter.stem}.json"
    assert main(["bench", "--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts),
                 "--max-tokens", "16", "--threads", "1", "--draft-max", "3", "--mode", modes,
                 "--json", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("fmt", ["dflash2", "dspark"])
def test_a_format_mode_is_fixed_on_its_drafter(fmt: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Identical to plain, drafting from the dflash source, and step for step the fixed mode's
    run (the same loop and policy: only the name and the format check differ); the JSON's per-source
    stats name the drafter's format."""
    target, drafter = request.getfixturevalue(f"tiny_{fmt}_pair")
    res = _bench(tmp_path, target, drafter, f"plain,fixed,{fmt}")
    modes = res["prompts"][0]["modes"]
    e, fixed = modes[fmt], modes["fixed"]
    assert e["identical"] is True and e["lossless"] is True and e["tokens"] == modes["plain"]["tokens"]
    assert e["drafted"] > 0 and set(e["source_history"]) <= {"dflash", "plain"}  # plain: no room left at the end
    for key in ("tokens", "source_history", "k_history", "accepted_history"):
        assert e[key] == fixed[key], key
    assert res["source_formats"] == {"dflash": fmt} and res["drafter_format"] == fmt
    assert res["summary"]["overall"][fmt]["format_by_source"] == {"dflash": fmt}
    assert res["summary"]["overall"]["plain"].get("format_by_source") is None  # plain drafted from nothing


def test_a_format_mode_refuses_a_drafter_of_another_format(tiny_pair: tuple[Path, Path],
                                                           tiny_dflash2_pair: tuple[Path, Path],
                                                           tiny_dspark_pair: tuple[Path, Path], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    target, v1 = tiny_pair
    dflash2, dspark = tiny_dflash2_pair[1], tiny_dspark_pair[1]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "t", "prompt": PROMPT, "format": "raw"}) + "\n")
    cases = [
        (["bench", "--drafter", str(dflash2), "--prompts", str(prompts), "--mode", "plain,dspark"],
         f"the mode dspark needs a DSpark drafter; {dflash2.name} is a DFlash2 file"),
        (["bench", "--drafter", str(dspark), "--prompts", str(prompts), "--mode", "dflash2"],
         f"the mode dflash2 needs a DFlash2 drafter; {dspark.name} is a DSpark file"),
        (["generate", "--drafter", str(v1), "--prompt", PROMPT, "--draft-mode", "dflash2"],
         f"the mode dflash2 needs a DFlash2 drafter; {v1.name} is a DFlash v1 file"),
        (["generate", "--no-drafter", "--prompt", PROMPT, "--draft-mode", "dspark"],
         "the mode dspark drafts from a DSpark drafter; none is loaded (--drafter)"),
    ]
    for argv, msg in cases:
        capsys.readouterr()
        assert main([*argv[:1], "--target", str(target), "--threads", "1", *argv[1:]]) == 2, argv
        out = capsys.readouterr()
        assert out.err.strip() == f"error: {msg}", argv
        assert out.out == ""  # nothing generated or measured


@pytest.mark.parametrize("fmt", ["dflash2", "dspark"])
def test_generate_in_a_format_mode_equals_plain(fmt: str, request: pytest.FixtureRequest,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    target, drafter = request.getfixturevalue(f"tiny_{fmt}_pair")
    runs = {}
    for name, flags in (("plain", ["--no-spec"]), (fmt, ["--draft-mode", fmt, "--draft-max", "3"])):
        assert main(["generate", "--target", str(target), "--drafter", str(drafter), "--threads", "1",
                     "--prompt", PROMPT, "--max-tokens", "24", "--json", *flags]) == 0
        runs[name] = json.loads(capsys.readouterr().out)
    assert runs[fmt]["tokens"] == runs["plain"]["tokens"] and runs[fmt]["draft_mode"] == fmt
    assert runs[fmt]["stats"]["drafted"] > 0
