"""Turning a conversation into the prompt text a model expects.

A model's own chat template (Jinja, from its GGUF) is untrusted input: it is
rendered in Jinja's immutable sandbox. Models without a template (the
bundled Gemma 3 270M is a base model) get a plain, visible format:

    <system prompt, if any>

    User: <message>
    Assistant: <reply>
    User: <message>
    Assistant:

with "\\nUser:" as a stop string. Gemma's <start_of_turn> markup was tried on
the base model and makes it echo the question or ramble; the plain format
gives short answers. The drafter is distilled on text in this format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from typing import TYPE_CHECKING

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from app.errors import FlashDeskError

if TYPE_CHECKING:
    from app.engine.llama_objects import LlamaModel

PLAIN_FORMAT_NAME = "plain (User:/Assistant:)"


class TemplateRenderError(FlashDeskError):
    pass


@dataclass
class ChatMessage:
    role: str  # "system" | "user" | "assistant"
    content: str


@dataclass
class PromptFormat:
    """How a conversation becomes text; `stop` ends a reply."""
    name: str
    template: str | None = None  # a Jinja chat template, or None for the plain format
    bos_token: str = ""
    eos_token: str = ""
    stop: list[str] = field(default_factory=list)

    @property
    def is_plain(self) -> bool:
        return self.template is None

    def render(self, messages: list[ChatMessage], add_generation_prompt: bool = True) -> str:
        if self.template is None:
            return render_plain(messages, add_generation_prompt)
        return render_template(self.template, messages, add_generation_prompt, self.bos_token, self.eos_token)


def render_plain(messages: list[ChatMessage], add_generation_prompt: bool = True) -> str:
    parts: list[str] = []
    for m in messages:
        if m.role == "system":
            if m.content.strip():
                parts.append(m.content.strip() + "\n\n")
        elif m.role == "user":
            parts.append(f"User: {m.content.strip()}\n")
        else:
            parts.append(f"Assistant: {m.content.strip()}\n")
    if add_generation_prompt:
        parts.append("Assistant:")
    return "".join(parts)


PLAIN_STOP = ["\nUser:"]


def render_template(template: str, messages: list[ChatMessage], add_generation_prompt: bool,
                    bos_token: str = "", eos_token: str = "") -> str:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(msg: str) -> None:
        raise TemplateRenderError(f"the model's chat template refused the conversation: {msg}")

    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: date.today().strftime(fmt)
    try:
        tpl = env.from_string(template)
        return tpl.render(messages=[{"role": m.role, "content": m.content} for m in messages],
                          add_generation_prompt=add_generation_prompt, bos_token=bos_token, eos_token=eos_token)
    except TemplateRenderError:
        raise
    except (TemplateError, Exception) as e:  # a sandbox violation or a broken template
        raise TemplateRenderError(f"the model's chat template could not be rendered: {e}") from e


def format_for_model(template: str | None, bos_token: str = "", eos_token: str = "") -> PromptFormat:
    """The prompt format for a chat template (or the plain fallback for None)."""
    if template:
        return PromptFormat("model template", template, bos_token, eos_token, stop=[])
    return PromptFormat(PLAIN_FORMAT_NAME, None, stop=list(PLAIN_STOP))


def prompt_format_of(model: LlamaModel) -> PromptFormat:
    """The prompt format of a loaded target: its GGUF's chat template (with its EOS token),
    or the plain fallback. The one place the app, the CLI, the bench and the documents
    choose how a conversation becomes text."""
    template = model.chat_template()
    eos = ""
    eos_id = model.meta("tokenizer.ggml.eos_token_id")
    if template and eos_id is not None:
        try:
            eos = model.token_to_piece(int(eos_id), special=True).decode("utf-8", "replace")
        except (ValueError, FlashDeskError):
            eos = ""
    # BOS comes from tokenization (add_special), so the template gets an empty bos_token: no double BOS
    return format_for_model(template, bos_token="", eos_token=eos)
