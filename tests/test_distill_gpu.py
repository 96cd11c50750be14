"""`flashdesk distill --gpu`: generation with every target layer on a GPU. Here an rpc-server on
loopback stands in for the GPU (ggml lists its device as one): the replies and features it makes
equal the CPU's, and where the build sees no GPU at all, --gpu says so instead of decoding on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from app.distill.corpus import CorpusPrompt  # noqa: E402
from app.distill.dataset import DistillData, pack  # noqa: E402
from app.distill.generate import GenConfig, generate_dataset  # noqa: E402
from app.distill.pipeline import gpu_placement, main  # noqa: E402
from app.distill.shards import from_bf16  # noqa: E402
from gguf_tools.synth import TinyShape, write_tiny_target  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TAPS = [1, 2, 3]
PROMPTS = [CorpusPrompt(f"p{i}", "code", text, "raw")
           for i, text in enumerate(["the cat sat on", "one of the", "he was in the", "they have this"])]
CFG = GenConfig(tap_layers=TAPS, n_parallel=2, max_new_tokens=12, greedy_fraction=1.0, n_threads=1, replies=1)

# in a child process: registered RPC devices cannot be unregistered and would leak into later loads
ON_RPC = """
import json, sys
from pathlib import Path
from app.distill.corpus import CorpusPrompt
from app.distill.generate import GenConfig, generate_dataset
from app.distill.pipeline import gpu_placement
from app.scheduler.rpc import RpcServer
target, out, cfg, prompts = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
server = RpcServer().start()
try:
    server.register()
    res = generate_dataset(target, [CorpusPrompt(*p) for p in prompts], out, GenConfig(**cfg),
                           placement=gpu_placement())
    print(json.dumps(res))
finally:
    server.stop()
"""


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_target(tmp_path_factory.mktemp("tiny") / "target.gguf", "gemma3", TinyShape(n_layer=4), seed=2)


def test_generation_on_a_gpu_device_equals_the_cpus(target: Path, tmp_path: Path) -> None:
    cpu = generate_dataset(target, PROMPTS, tmp_path / "cpu", CFG)
    assert cpu["sequences"] == len(PROMPTS)
    cfg = {k: getattr(CFG, k) for k in ("tap_layers", "n_parallel", "max_new_tokens", "greedy_fraction",
                                        "n_threads", "replies")}
    prompts = [[p.id, p.kind, p.text, p.format] for p in PROMPTS]
    r = subprocess.run([sys.executable, "-c", ON_RPC, str(target), str(tmp_path / "gpu"), json.dumps(cfg),
                        json.dumps(prompts)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["sequences"] == len(PROMPTS)
    # llama.cpp's buffers say where the weights went: the layers on the (RPC) device, the CPU's run none there
    on_device = sum(b for name, b in res["weight_bytes_by_buffer"].items() if name.startswith("RPC"))
    assert on_device > 0.5 * sum(res["weight_bytes_by_buffer"].values()), res
    assert not any(name.startswith("RPC") for name in cpu["weight_bytes_by_buffer"]), cpu
    a = DistillData(pack(tmp_path / "cpu", tmp_path / "packed-cpu", TAPS))
    b = DistillData(pack(tmp_path / "gpu", tmp_path / "packed-gpu", TAPS))
    by_id = {str(b.prompt_ids[i]): b[i] for i in range(len(b))}
    for i in range(len(a)):
        x, y = a[i], by_id[str(a.prompt_ids[i])]
        assert np.array_equal(x.tokens, y.tokens)
        np.testing.assert_allclose(from_bf16(np.asarray(y.features)), from_bf16(np.asarray(x.features)),
                                   rtol=1 / 64, atol=1e-3)


def test_gpu_without_a_gpu_is_a_clear_error(target: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(RuntimeError, match="sees no GPU"):
        gpu_placement()
    with pytest.raises(SystemExit):
        main(["--target", str(target), "--out", str(tmp_path / "d.gguf"), "--stage", "generate", "--gpu"])
    assert "--gpu: this build of llama.cpp sees no GPU" in capsys.readouterr().err
