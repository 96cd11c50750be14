"""Errors a user can see. Each names the file(s) and the problem in plain words."""

from __future__ import annotations

from gguf_tools.errors import FlashDeskError, ModelLoadError, PairMismatch

# the base and the GGUF file errors live with the GGUF reader, the lowest layer that raises them
__all__ = ["ContextOverflow", "DraftFormatMismatch", "FlashDeskError", "GenerationError", "ModelLoadError",
           "PairMismatch"]


class ContextOverflow(FlashDeskError):
    """The prompt plus the requested tokens do not fit in the context window."""

    def __init__(self, n_prompt: int, n_max_tokens: int, n_ctx: int):
        self.n_prompt = n_prompt
        self.n_max_tokens = n_max_tokens
        self.n_ctx = n_ctx
        super().__init__(
            f"the prompt is {n_prompt} tokens and up to {n_max_tokens} more were requested, "
            f"but the context holds {n_ctx} tokens: shorten the prompt or the conversation, "
            f"lower max tokens, or load the model with a larger context")


class GenerationError(FlashDeskError):
    """llama.cpp refused a decode (e.g. out of memory)."""


class DraftFormatMismatch(FlashDeskError, ValueError):
    """A draft mode or a bench peer named after one drafter format (dflash2, dspark, upstream-dspark,
    ...) was asked of a drafter file of another format; the message names the file and both formats."""
