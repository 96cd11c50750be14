"""app.chat.tools without a model: which templates can take tools, the Hermes/Qwen <tool_call>
parser (whole and streamed in any cut) and the grammar that forces a call."""

from __future__ import annotations

import json
from pathlib import Path

from app.chat.format import format_for_model
from app.chat.tools import ToolCallStream, call_grammar, parse_tool_calls, tools_refusal

QWEN_TEMPLATE = (Path(__file__).parent / "qwen25_tool_template.jinja").read_text()
# Llama 3.1's way (tools in the prompt, calls as bare JSON): tool-capable, but not a format read here
LLAMA_LIKE = "{% for t in tools or [] %}{{ t | tojson }}{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}"
REPLY = 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n' \
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


def test_which_templates_can_take_tools() -> None:
    assert tools_refusal(format_for_model(QWEN_TEMPLATE)) is None
    assert "no chat template" in tools_refusal(format_for_model(None))
    assert "no tool support" in tools_refusal(format_for_model("{% for m in messages %}{{ m.content }}{% endfor %}"))
    assert "does not read" in tools_refusal(format_for_model(LLAMA_LIKE))


def test_calls_are_parsed_and_malformed_ones_stay_content() -> None:
    content, calls = parse_tool_calls(REPLY)
    assert content == "Checking."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"}),
                                                                    ("get_time", {})]
    assert len({c.id for c in calls}) == 2
    for broken in ('<tool_call>\n{"name": "x", "arguments": {}\n</tool_call>',  # no closing brace
                   '<tool_call>\n{"arguments": {}}\n</tool_call>',  # no name
                   '<tool_call>\n{"name": "x", "arguments": "{}"}\n</tool_call>',  # arguments not an object
                   '<tool_call>\n{"name": "x", "arguments": {}}'):  # cut off before its end
        assert parse_tool_calls(broken) == (broken, [])


def test_a_stream_holds_back_calls_in_every_cut() -> None:
    for cut in range(1, len(REPLY)):
        stream = ToolCallStream()
        sent = "".join(stream.feed(piece) for piece in (REPLY[:cut], REPLY[cut:]))
        rest, calls = stream.finish()
        assert (sent + rest).strip() == "Checking." and "<" not in sent, cut
        assert [c.name for c in calls] == ["get_weather", "get_time"]
    stream = ToolCallStream()
    assert stream.feed("a <tool") == "a " and stream.feed(" box") == "<tool box"  # not a call after all
    assert stream.finish() == ("", [])


def test_the_call_grammar_names_the_chosen_tools() -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
             {"type": "function", "function": {"name": "get_time"}}]
    anyone = call_grammar(tools, None, True)
    assert '"\\"get_weather\\""' in anyone and '"\\"get_time\\""' in anyone and anyone.count("root ::=") == 1
    assert ')*' in anyone.split("root ::=")[1]  # parallel: one or more calls
    only = call_grammar(tools, "get_time", False)
    assert "get_weather" not in only and ")*" not in only.split("root ::=")[1]
