"""Turning a conversation into the prompt text a model expects.

A model's own chat template (Jinja, from its GGUF) is untrusted input: it is
rendered in Jinja's immutable sandbox under a time limit, a size limit and
the reply's Stop (app.chat.sandbox). Models without a template (the
bundled Gemma 3 270M is a base model) get a plain, visible format:

    <system prompt, or a one-line description of the conversation>

    <three example turns>
    User: <message>
    Assistant: <reply>
    User: <message>
    Assistant:

with "\\nUser:" and "\\nAssistant:" as stop strings. Gemma's <start_of_turn>
markup was tried on the base model and makes it echo the question or ramble.
With the bare format (no examples) the base model's first answers repeated
the question, or looped on "Assistant: ..." lines; the example turns (an
answer, code in a Markdown block with one line after it, a list) show it
what an answer looks like, and a new turn's prefix ends the reply. The
drafter is distilled on text in this format.

Only the format's own markup may become special tokens: a user who types
`<end_of_turn>`, or a document that contains `<eos>`, must not end a turn.
A template's rendering is a PromptText, which knows which parts are the
template's text and which are the messages' content; the engine tokenizes
the content (and every plain string) without special-token parsing.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date
from typing import TYPE_CHECKING

from app.chat.sandbox import TemplateRenderCancelled as TemplateRenderCancelled  # re-exported for callers
from app.chat.sandbox import TemplateRenderError as TemplateRenderError  # re-exported for callers
from app.chat.sandbox import render_sandboxed
from app.errors import FlashDeskError

if TYPE_CHECKING:
    from app.engine.llama_objects import LlamaModel

PLAIN_FORMAT_NAME = "plain (User:/Assistant:)"


class PromptText(str):
    """Prompt text that remembers its parts: (text, True) for the prompt format's own markup, whose
    special-token strings become special tokens, and (text, False) for content (messages, documents,
    sources), always tokenized as plain text. Any string operation gives a plain str, which the
    engine tokenizes as plain text throughout: the safe side."""

    segments: tuple[tuple[str, bool], ...]

    def __new__(cls, segments: Iterable[tuple[str, bool]]) -> PromptText:
        merged: list[tuple[str, bool]] = []
        for text, markup in segments:
            if not text:
                continue
            if merged and merged[-1][1] == markup:
                merged[-1] = (merged[-1][0] + text, markup)
            else:
                merged.append((text, markup))
        obj = super().__new__(cls, "".join(t for t, _ in merged))
        obj.segments = tuple(merged)
        return obj


@dataclass
class ChatMessage:
    role: str  # "system" | "user" | "assistant" | "tool"
    content: str
    # an assistant's tool calls, as chat templates read them: {"id", "type": "function", "function":
    # {"name", "arguments": a dict}} (app.chat.tools); a tool result names the call it answers
    tool_calls: list[dict] | None = None
    tool_call_id: str | None = None


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

    def render(self, messages: list[ChatMessage], add_generation_prompt: bool = True,
               cancel: threading.Event | None = None, tools: list[dict] | None = None) -> str:
        """The prompt text; a model template renders under app.chat.sandbox's time and size limits, and
        setting `cancel` (the reply's Stop) interrupts it with TemplateRenderCancelled. `tools` (OpenAI's
        tool objects) go to the template only: app.chat.tools checks that it uses them."""
        if self.template is None:
            return render_plain(messages, add_generation_prompt)
        return render_template(self.template, messages, add_generation_prompt, self.bos_token, self.eos_token,
                               cancel, tools)


PLAIN_INTRO = ("A conversation between a user and a helpful assistant. The assistant answers every question "
               "directly and helpfully, and writes code in Markdown code blocks.")
PLAIN_EXAMPLES = [
    ChatMessage("user", "What is the capital of France?"),
    ChatMessage("assistant", "The capital of France is Paris. It is also the country's largest city."),
    ChatMessage("user", "Write a Python function that returns the square of a number."),
    ChatMessage("assistant", "Here is a function that returns the square of a number:\n\n```python\ndef square(x):\n"
                             "    return x * x\n```\n\nFor example, `square(3)` returns `9`."),
    ChatMessage("user", "Give me three tips for sleeping better."),
    ChatMessage("assistant", "1. Go to bed and get up at the same time every day.\n2. Keep your bedroom dark, "
                             "quiet and cool.\n3. Avoid caffeine and screens in the evening."),
]


def render_plain(messages: list[ChatMessage], add_generation_prompt: bool = True) -> str:
    system = " ".join(m.content.strip() for m in messages if m.role == "system" and m.content.strip())
    parts = [(system or PLAIN_INTRO) + "\n\n"]
    for m in PLAIN_EXAMPLES + [m for m in messages if m.role != "system"]:
        parts.append(f"{'User' if m.role == 'user' else 'Assistant'}: {m.content.strip()}\n")
    if add_generation_prompt:
        parts.append("Assistant:")
    return "".join(parts)


# the first is how an answer ends (the next turn is the user's): the context lookup drafts it there
PLAIN_STOP = ["\nUser:", "\nAssistant:"]


def with_format_stops(format_stop: list[str], extra: list[str]) -> list[str]:
    """A reply's stop strings: the format's first (its first is how a reply ends, which the context
    lookup drafts), then the caller's own."""
    return list(format_stop) + [s for s in extra if s not in format_stop]


# a message's content while the template renders: private-use characters no tokenizer markup uses
_SLOT = "\ue000{}\ue001"
_SLOT_RE = re.compile("\ue000(\\d+)\ue001")


def render_template(template: str, messages: list[ChatMessage], add_generation_prompt: bool,
                    bos_token: str = "", eos_token: str = "", cancel: threading.Event | None = None,
                    tools: list[dict] | None = None) -> PromptText:
    """The template's text with the messages' content in place, as a PromptText: the template renders
    a slot for each non-empty content, so what it writes itself is known exactly; the contents go
    into their slots afterwards, as plain text. (A template that edits content, e.g. trims it, sees
    the slot, so the content goes in as written.) Tools and tool calls are written by the template
    through `tojson`, Jinja's HTML-safe JSON (`<`, `>`, `&` escaped), so no markup can come from them;
    tool names are checked as OpenAI's (letters, digits, _ and -) before they get here."""
    slotted = [ChatMessage(m.role, _SLOT.format(i) if m.content else "", m.tool_calls, m.tool_call_id)
               for i, m in enumerate(messages)]
    rendered = _render_template(template, slotted, add_generation_prompt, bos_token, eos_token, cancel, tools)
    segments = []
    for j, part in enumerate(_SLOT_RE.split(rendered)):
        if j % 2 == 0:
            segments.append((part, True))
        elif int(part) < len(messages):
            segments.append((messages[int(part)].content, False))
    return PromptText(segments)


def _render_template(template: str, messages: list[ChatMessage], add_generation_prompt: bool,
                     bos_token: str, eos_token: str, cancel: threading.Event | None,
                     tools: list[dict] | None = None) -> str:
    def raise_exception(msg: str) -> None:
        raise TemplateRenderError(f"the model's chat template refused the conversation: {str(msg)[:300]}")

    helpers = {"raise_exception": raise_exception, "strftime_now": lambda fmt: date.today().strftime(fmt)}
    context = {"messages": [_message_dict(m) for m in messages],
               "add_generation_prompt": add_generation_prompt, "bos_token": bos_token, "eos_token": eos_token}
    if tools:
        context["tools"] = tools
    return render_sandboxed(template, context, cancel=cancel, helpers=helpers)


def _message_dict(m: ChatMessage) -> dict:
    """A message as templates read it (HF's shape): tool fields only where the message has them."""
    out: dict = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = m.tool_calls
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


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
            tid = int(eos_id)
            # an id past the vocabulary would throw std::out_of_range through the C API (an abort)
            eos = model.token_to_piece(tid, special=True).decode("utf-8", "replace") if 0 <= tid < model.n_vocab \
                else ""
        except (ValueError, FlashDeskError):
            eos = ""
    # BOS comes from tokenization (add_special), so the template gets an empty bos_token: no double BOS
    return format_for_model(template, bos_token="", eos_token=eos)
