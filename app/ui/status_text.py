"""What the window says about the model: the line next to Send and the Model tab's status."""

from __future__ import annotations

from app.session.models import ModelSpec
from app.ui.worker import ModelInfo

NO_MODEL = "no model loaded"
_STAGES = {"baseline": "measuring plain baseline", "calibrating": "calibrating draft costs"}


def loading_line(spec: ModelSpec | None) -> str:
    """`spec` None: the bundled pair."""
    return "loading " + (spec.label if spec else "the bundled pair") + "…"


def load_stage_text(stage: str) -> str:
    """A load stage from the worker ("target", "drafter", "baseline", "calibrating"), for the progress bar."""
    return _STAGES.get(stage, f"loading {stage}")


def drafter_text(info: ModelInfo) -> str:
    return f"drafter block {info.block_size}" if info.has_drafter else "no drafter: plain decoding"


def loaded_line(info: ModelInfo) -> str:
    return f"{info.label} · {drafter_text(info)} · ctx {info.n_ctx}"


def loaded_details(info: ModelInfo) -> str:
    """The Model tab's status: the draft sources in use and why, as the engine process said them."""
    sources = "\n".join(info.draft_sources) if info.draft_sources else drafter_text(info)
    return f"loaded: {info.label}\n{sources}\nprompt format: {info.prompt_format}"


def line_after_failed_load(still_loaded: ModelInfo | None) -> str:
    """A failed load leaves the pair loaded before it (if any) working."""
    return f"loaded: {still_loaded.label}" if still_loaded else NO_MODEL


def split_override_text(split: list[float]) -> str:
    ratio = ":".join(f"{x:g}" for x in split) if split else "automatic"
    return f"split ratio {ratio}: applies when the model is next loaded on the GPU"


def installed_text(entry_id: str) -> str:
    return f"downloaded {entry_id}: press Load to use it"
