"""Shared fixtures: tiny random pairs (written once per session), the bundled
Gemma 3 270M target, a random drafter that fits it and the shipped drafter."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# the session's own calibrations (engine processes inherit it): a cost model cached on this machine has
# learned from its benches and chats, and a controller that read it declined to draft where a test
# needs drafts (tests/test_server.py's penalties, after a day of 32k benches)
# (app.engine.calibration.CALIBRATION_DIR_ENV, spelled out: importing the engine here would load it before any test)
os.environ.setdefault("FLASHDESK_CALIBRATION_DIR", tempfile.mkdtemp(prefix="flashdesk-test-calibration-"))


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny_pair(tiny_dir: Path) -> tuple[Path, Path]:
    """A qwen3-shaped F32 target (4 layers) and a 2-layer DFlash drafter, block size 8."""
    from gguf_tools.synth import write_tiny_pair

    return write_tiny_pair(tiny_dir / "qwen3", "qwen3")


@pytest.fixture(scope="session")
def tiny_gemma_pair(tiny_dir: Path) -> tuple[Path, Path]:
    from gguf_tools.synth import write_tiny_pair

    return write_tiny_pair(tiny_dir / "gemma3", "gemma3")


@pytest.fixture(scope="session")
def tiny_lfm2_pair(tiny_dir: Path) -> tuple[Path, Path]:
    """A hybrid recurrent target (LFM2: short-convolution layers between attention layers, as Qwen3.5's
    gated-delta-net layers are) and a DFlash drafter tapping it."""
    from gguf_tools.synth import write_tiny_pair

    return write_tiny_pair(tiny_dir / "lfm2", "lfm2")


@pytest.fixture(scope="session")
def tiny_qwen35_pair(tiny_dir: Path) -> tuple[Path, Path]:
    """A Qwen3.5-shaped hybrid target (gated delta nets, full attention every 4th layer) and a DFlash
    drafter tapping it."""
    from gguf_tools.synth import write_tiny_pair

    return write_tiny_pair(tiny_dir / "qwen35", "qwen35")


@pytest.fixture(scope="session")
def tiny_dflash2_pair(tiny_pair: tuple[Path, Path]) -> tuple[Path, Path]:
    """The tiny qwen3 target and a random DFlash2 drafter for it (selector over the top 4, block 8)."""
    from gguf_tools.synth import DFlash2Shape, write_drafter

    target = tiny_pair[0]
    return target, write_drafter(target.parent / "tiny-qwen3-dflash2.gguf", target, n_layer=2,
                                 target_layers=[1, 3], block_size=8, seed=2, dflash2=DFlash2Shape())


@pytest.fixture(scope="session")
def tiny_dspark_pair(tiny_pair: tuple[Path, Path]) -> tuple[Path, Path]:
    """The tiny qwen3 target and a random DSpark drafter for it (Markov and confidence heads, block 8)."""
    from gguf_tools.synth import DSparkShape, write_drafter

    target = tiny_pair[0]
    return target, write_drafter(target.parent / "tiny-qwen3-dspark.gguf", target, n_layer=2,
                                 target_layers=[1, 3], block_size=8, seed=3, dspark=DSparkShape())


@pytest.fixture(scope="session")
def tiny_mtp_target(tiny_dir: Path) -> Path:
    """The tiny Qwen3.5-shaped target carrying one MTP head (`gguf_tools synth --mtp 1`): the `mtp` source."""
    from gguf_tools.synth import write_tiny_target

    return write_tiny_target(tiny_dir / "tiny-qwen35-mtp.gguf", "qwen35", mtp_layers=1)


@pytest.fixture(scope="session")
def tiny_eagle3_pair(tiny_pair: tuple[Path, Path]) -> tuple[Path, Path]:
    """The tiny qwen3 target and a random EAGLE-3 drafter for it (gguf_tools.synth.write_eagle3)."""
    from gguf_tools.synth import write_eagle3

    target = tiny_pair[0]
    return target, write_eagle3(target.parent / "tiny-eagle3.gguf", target)


@pytest.fixture(scope="session")
def tiny_draft_model(tiny_pair: tuple[Path, Path]) -> Path:
    """Another random qwen3 model with the tiny vocabulary (seed 1): a classic draft model for the tiny
    target, and a poor one (its drafts pass now and then)."""
    from gguf_tools.synth import write_tiny_target

    return write_tiny_target(tiny_pair[0].parent / "tiny-qwen3-other.gguf", "qwen3", seed=1)


@pytest.fixture(scope="session")
def gemma_target() -> Path:
    from app.bundled import default_target

    return default_target()


@pytest.fixture(scope="session")
def gemma_random_drafter(gemma_target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer F16 drafter for the Gemma target (full shared head)."""
    import numpy as np

    from gguf_tools.synth import write_drafter

    return write_drafter(tmp_path_factory.mktemp("gemma") / "gemma-random-dflash.gguf", gemma_target,
                         n_layer=2, dtype=np.float16)


@pytest.fixture(scope="session")
def gemma_engine(gemma_target: Path, gemma_random_drafter: Path):
    from app.engine.dflash import Engine, EngineConfig

    e = Engine(gemma_target, gemma_random_drafter, EngineConfig(n_ctx=2048))
    yield e
    e.close()


@pytest.fixture(scope="session")
def shipped_drafter() -> Path:
    """The drafter FlashDesk ships (assets/drafters/gemma3-270m-dflash.gguf, Q8_0)."""
    from app.bundled import DEFAULT_DRAFTER, default_drafter

    d = default_drafter()
    assert d is not None, f"{DEFAULT_DRAFTER} is missing: it is committed with the repository"
    return d


@pytest.fixture(scope="session")
def gemma_shipped_engine(gemma_target: Path, shipped_drafter: Path):
    """The bundled pair as the app loads it: Gemma 3 270M Q4_K_M + the shipped drafter."""
    from app.engine.dflash import Engine, EngineConfig

    e = Engine(gemma_target, shipped_drafter, EngineConfig(n_ctx=2048))
    yield e
    e.close()


@pytest.fixture
def tiny_engine(tiny_pair: tuple[Path, Path]):
    from app.engine.dflash import Engine, EngineConfig

    e = Engine(*tiny_pair, EngineConfig(n_ctx=512))
    yield e
    e.close()
