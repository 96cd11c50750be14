"""Errors a user can see. Each names the file(s) and the problem in plain words."""

from __future__ import annotations


class FlashDeskError(Exception):
    """Base class: the message is meant for the user as is."""


class ModelLoadError(FlashDeskError):
    """A GGUF file could not be loaded (missing, truncated, corrupt, unsupported)."""


class PairMismatch(FlashDeskError):
    """A drafter does not fit its target; `problems` lists every reason."""

    def __init__(self, target: str, drafter: str, problems: list[str]):
        self.target = target
        self.drafter = drafter
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"drafter {drafter} does not match target {target}:\n{lines}")


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
