"""A real multi-device run on CPU: two llama.cpp rpc-servers on loopback act as
two GPUs; the target is split across them as planned, the drafter sits with
the output head, and DFlash greedy output must equal the single-device run.
The bytes llama.cpp allocates per device must match the plan within 10%.

The split runs in a subprocess (python -m app.scheduler.verify): registered
RPC devices cannot be unregistered, and they would leak into every later
model load of this test process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from app.engine.dflash import Engine, EngineConfig
from app.engine.params import GenerationParams
from gguf_tools.synth import TinyShape, write_tiny_pair

REPO = Path(__file__).resolve().parents[1]
PROMPT = "the cat sat on"
MAX_TOKENS = 24


def run_verify(*args: str, max_tokens: int = MAX_TOKENS) -> dict:
    cmd = [sys.executable, "-m", "app.scheduler.verify", *args, "--prompt", PROMPT, "--max-tokens", str(max_tokens),
           "--json"]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def single_device_tokens(target: Path, drafter: Path, n_ctx: int) -> list[int]:
    """The reference: the same pair on the CPU alone, DFlash greedy."""
    e = Engine(target, drafter, EngineConfig(n_ctx=n_ctx, n_threads=1))
    try:
        out: list[int] = []
        for ev in e.generate(e.tokenize(PROMPT), GenerationParams(max_tokens=MAX_TOKENS)):
            out += ev.tokens
        return out
    finally:
        e.close()


@pytest.fixture(scope="module")
def medium_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An F32 qwen3 pair whose 8 layers (25 MB) outweigh its buffers, so a split is about layers."""
    shape = TinyShape(n_embd=256, n_layer=8, n_head=4, n_head_kv=2, head_dim=64, n_ff=768)
    return write_tiny_pair(tmp_path_factory.mktemp("medium"), "qwen3", shape=shape)


def assert_bytes_within(result: dict, tolerance: float = 0.10) -> None:
    for dev, predicted in result["predicted"].items():
        actual = result["actual"][dev]
        assert actual > 0, dev
        assert abs(actual - predicted) <= tolerance * actual, (dev, predicted, actual, result["breakdown"])


def test_split_over_two_rpc_devices_gives_the_single_device_output(tiny_pair: tuple[Path, Path]) -> None:
    target, drafter = tiny_pair
    ref = single_device_tokens(target, drafter, 512)
    assert len(ref) == MAX_TOKENS
    res = run_verify("--target", str(target), "--drafter", str(drafter), "--ctx", "512", "--split", "1,1")
    plan = res["plan"]
    names = plan["llama"]["devices"]
    assert len(names) == 2 and plan["llama"]["tensor_split"] == [2.0, 3.0]  # 4 layers + the output layer
    assert res["target_devices"] == names
    assert res["drafter_devices"] == [names[-1]] == [plan["drafter_placement"]["device"]]
    assert res["tokens"] == ref
    assert res["drafted"] > 0
    # drafts forced to the right answer: multi-token acceptance across the split, same output
    forced = run_verify("--target", str(target), "--drafter", str(drafter), "--ctx", "512", "--split", "1,1",
                        "--oracle", ",".join(map(str, ref)))
    assert forced["tokens"] == ref
    assert forced["accepted"] >= MAX_TOKENS // 2
    assert_bytes_within(res)


def test_planned_split_runs_identically_and_bytes_match_the_plan(medium_pair: tuple[Path, Path]) -> None:
    target, drafter = medium_pair
    ref = single_device_tokens(target, drafter, 1024)
    # 40 MiB per device: the pair (~41 MB with its buffers) does not fit one, so the planner splits
    res = run_verify("--target", str(target), "--drafter", str(drafter), "--ctx", "1024", "--budget", "40MiB")
    plan = res["plan"]
    assert plan["fits"] and plan["offload"] == "full" and plan["strategy"] == "proportional"
    assert all(d["n_layers"] > 0 for d in plan["devices"]) and len(plan["devices"]) == 2
    assert plan["llama"]["pipeline_copies"] == 4
    assert res["target_devices"] == plan["llama"]["devices"]
    assert res["drafter_devices"] == [plan["devices"][-1]["name"]]
    assert res["tokens"] == ref
    assert_bytes_within(res)


@pytest.mark.gemma
def test_gemma_split_bytes_match_the_plan(gemma_target: Path, gemma_random_drafter: Path) -> None:
    """Real Q4_K_M weights, a 262k vocabulary (half a GB of logits buffers, twice that with the argmax in the
    graph, as on a GPU: the output device's fixed cost then leaves no budget where the planner's own split
    uses both devices, so the split is set) and sliding-window layers."""
    res = run_verify("--target", str(gemma_target), "--drafter", str(gemma_random_drafter), "--ctx", "4096",
                     "--budget", "1600MiB", "--split", "1,1", max_tokens=4)
    plan = res["plan"]
    assert plan["fits"] and len(plan["devices"]) == 2 and all(d["n_layers"] > 0 for d in plan["devices"])
    assert plan["devices"][-1]["has_output"] and plan["devices"][-1]["holds_drafter"]
    assert res["target_devices"] == plan["llama"]["devices"]
    assert len(res["tokens"]) > 0
    assert_bytes_within(res)
