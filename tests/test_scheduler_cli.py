"""`flashdesk plan`: JSON and text out, hypothetical cards, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from app.scheduler import Inventory, PlanRequest, plan_split
from app.scheduler.inventory import detect_inventory, host_spec
from gguf_tools.shapes import write_preset


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cli-shapes")
    return {k: write_preset(d, k) for k in ("qwen3.6-27b", "qwen3.6-27b-dflash", "llama3.3-70b")}


def test_plan_json_for_a_hypothetical_card(shapes: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    rc = main(["plan", "--target", str(shapes["qwen3.6-27b"]), "--drafter", str(shapes["qwen3.6-27b-dflash"]),
               "--ctx", "32768", "--gpu", "RTX3090:24GiB", "--ram", "64GiB", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["fits"]
    assert out["llama"] == {"n_gpu_layers": 65, "split_mode": "layer", "tensor_split": [], "main_gpu": 0,
                            "devices": ["RTX3090"], "pipeline_copies": 1}
    assert out["drafter_placement"]["device"] == "RTX3090" and out["drafter_placement"]["shares_head"]
    assert out["inventory"]["sources"] == ["hypothetical"] and out["inventory"]["host"]["ram_total"] == 64 * 2 ** 30
    b = out["devices"][0]["bytes"]
    assert b["used"] == b["weights"] + b["kv"] + b["compute"] + b["drafter_weights"] + b["drafter_kv"] \
        + b["drafter_compute"]
    assert any(line.startswith("plan: everything on RTX3090") for line in out["explanation"])


def test_plan_text_says_why_it_does_not_fit_and_what_would(shapes: dict[str, Path],
                                                           capsys: pytest.CaptureFixture) -> None:
    rc = main(["plan", "--target", str(shapes["llama3.3-70b"]), "--ctx", "32768", "--kv", "f16",
               "--gpu", "RTX3090:24GiB", "--gpu", "RTX3090:24GiB", "--no-partial"])
    text = capsys.readouterr().out
    assert rc == 1
    assert "does NOT fit" in text and "GiB short" in text
    assert "advice: --kv q8_0" in text and "advice: a context of" in text


def test_plan_rejects_bad_input_with_exit_code_2(shapes: dict[str, Path], capsys: pytest.CaptureFixture,
                                                 tmp_path: Path) -> None:
    assert main(["plan", "--target", str(tmp_path / "nope.gguf")]) == 2
    assert "nope.gguf: no such file" in capsys.readouterr().err
    assert main(["plan", "--target", str(shapes["llama3.3-70b"]), "--gpu", "RTX3090"]) == 2
    assert "expected NAME:SIZE" in capsys.readouterr().err
    assert main(["plan", "--target", str(shapes["llama3.3-70b"]), "--gpu", "a:24GiB", "--split", "x"]) == 2
    assert "--split" in capsys.readouterr().err


def test_plan_on_this_machine(tiny_pair: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    """Without --gpu the plan is for the devices this machine has: everything on the CPU when it
    has no GPU (or runs the CPU build), on its cards otherwise."""
    target, drafter = tiny_pair
    rc = main(["plan", "--target", str(target), "--drafter", str(drafter), "--ctx", "512", "--json"])
    out = json.loads(capsys.readouterr().out)
    gpus = detect_inventory().gpus
    assert rc == 0 and out["inventory"]["sources"][0] == "ggml"
    assert [g["name"] for g in out["inventory"]["gpus"]] == [g.name for g in gpus]
    if not gpus:
        assert out["strategy"] == "cpu" and out["llama"]["n_gpu_layers"] == 0
        assert out["host"]["holds_drafter"] and out["host"]["n_layers"] == 4
    else:  # a 1 MB pair fits any card: every layer and the output on the GPU
        assert out["strategy"] != "cpu" and out["llama"]["n_gpu_layers"] == 5 and out["host"]["n_layers"] == 0
        assert out["llama"]["devices"] and set(out["llama"]["devices"]) <= {g.name for g in gpus}


def test_plan_with_no_gpu_plans_everything_on_the_cpu(tiny_pair: tuple[Path, Path]) -> None:
    """The CPU plan on any machine: an inventory without cards (the command line cannot ask for
    one on a machine with a GPU, so the planner is asked directly)."""
    plan = plan_split(*tiny_pair, Inventory((), host_spec()), PlanRequest(n_ctx=512))
    d = plan.to_dict()
    assert d["strategy"] == "cpu" and d["llama"]["n_gpu_layers"] == 0
    assert plan.host.holds_drafter and plan.host.n_layers == 4
