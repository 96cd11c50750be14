"""Tool calls in the Hermes/Qwen format, the one most local chat models use:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

The tools themselves reach the model through its chat template (PromptFormat.render's `tools`);
this module says whether a template can take them, reads the calls out of a reply (whole, or as
it streams) and builds the grammar that forces a call (tool_choice "required" or a named
function). Templates with other call formats (Llama 3.x's bare JSON, Mistral's [TOOL_CALLS],
Functionary, DeepSeek's, Command R's...) are refused with a 400 rather than misread.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from functools import lru_cache

from app.chat.format import ChatMessage, PromptFormat, TemplateRenderError
from app.engine.grammar import wrapped_json_grammar

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL_RE = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.DOTALL)
_PROBE_NAME = "flashdesk_probe_tool"
_PROBE = [{"type": "function", "function": {"name": _PROBE_NAME, "description": "probe",
                                            "parameters": {"type": "object", "properties": {}}}}]


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI sends it

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def tools_refusal(fmt: PromptFormat) -> str | None:
    """Why this prompt format cannot take tools (None: it can), in words for a 400."""
    if fmt.template is None:
        return "this model has no chat template, so it has no way to be given tools (send no tools)"
    if not _template_uses_tools(fmt.template):
        return "this model's chat template has no tool support: it ignores tools (send no tools)"
    if OPEN not in fmt.template:
        return (f"this model's chat template writes tool calls in a format this server does not read (it reads "
                f"the Hermes/Qwen {OPEN} format only); send no tools")
    return None


@lru_cache(maxsize=8)
def _template_uses_tools(template: str) -> bool:
    """As llama.cpp's server decides it: a template supports tools if a tool given to it shows up
    in the prompt it renders."""
    fmt = PromptFormat("probe", template)
    try:
        return _PROBE_NAME in fmt.render([ChatMessage("user", "hi")], tools=_PROBE)
    except TemplateRenderError:
        return False


def parse_tool_calls(text: str) -> tuple[str | None, list[ToolCall]]:
    """The reply's content (None when only calls) and its tool calls. A <tool_call> block that is not
    a JSON object with a string "name" (and an object "arguments") is no call: the whole reply stays
    content, as llama.cpp's server leaves it."""
    calls = []
    for body in _CALL_RE.findall(text):
        try:
            obj = json.loads(body)
        except ValueError:
            return text, []
        if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)
                and isinstance(obj.get("arguments", {}), dict)):
            return text, []
        calls.append(ToolCall(new_call_id(), obj["name"], json.dumps(obj.get("arguments", {}), ensure_ascii=False)))
    if not calls:
        return text, []
    content = _CALL_RE.sub("", text).strip()
    return content or None, calls


class ToolCallStream:
    """A streamed reply's content, held back from the first <tool_call> on (or while the text ends
    with what may be its start), so that calls are never sent as content; finish() reads the rest."""

    def __init__(self) -> None:
        self._held = ""
        self._in_call = False

    def feed(self, text: str) -> str:
        """The content that can go out now."""
        self._held += text
        if self._in_call:
            return ""
        at = self._held.find(OPEN)
        if at >= 0:
            self._in_call = True
            out, self._held = self._held[:at], self._held[at:]
            return out
        keep = _partial_open(self._held)
        out, self._held = self._held[:len(self._held) - keep], self._held[len(self._held) - keep:]
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The content still held and the calls: the held text parsed as a whole reply's would be."""
        content, calls = parse_tool_calls(self._held)
        return content or "", calls


def _partial_open(text: str) -> int:
    """How many characters at the end of `text` may begin OPEN."""
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if text.endswith(OPEN[:n]):
            return n
    return 0


def call_grammar(tools: list[dict], name: str | None, parallel: bool) -> str:
    """GBNF for a reply that is tool calls only: to any of `tools`, or to `name` alone; one call, or
    (parallel) one or more."""
    chosen = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    schema = {"anyOf": [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
                         "properties": {"name": {"const": f["name"]},
                                        "arguments": f.get("parameters") or {"type": "object"}}}
                        for f in chosen]}
    return wrapped_json_grammar(schema, "tools", OPEN + "\n", "\n" + CLOSE, parallel, ("name", "arguments"))
