"""Request bodies, parsed strictly: every field of OpenAI's chat and completions requests is
accepted (so that no client gets a 400 for sending a default), and llama.cpp's common extras; a
value this server cannot honour (n > 1, audio, tools on a model without them: app.chat.tools) is a 400 that names
the field and what it supports, as are unknown fields, wrong types and values out of range.
Fields with no effect on a local model (user, metadata, store, service_tier...) are accepted and
ignored; the README's server section lists each field and what it does here."""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from app.chat.format import ChatMessage
from app.chat.tools import call_grammar
from app.engine.grammar import check_grammar, json_grammar
from app.engine.params import MAX_TOKENS, MAX_TOP_K, MAX_TOP_LOGPROBS, InvalidParams
from app.server.errors import ApiError, bad_request
from app.server.service import CHAT, COMPLETION, GenerationRequest

MAX_STOP = 4  # OpenAI's limit
MAX_DEPTH = 64  # how deep a body's JSON may nest (a JSON schema's too): deeper is a 400, never a RecursionError
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
_TYPE_NAMES = {"str", "int", "float", "bool", "none", "dict", "list"}  # pydantic's union member names in a loc
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]  # OpenAI's range


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ContentPart(_Strict):
    type: str
    text: str | None = None
    refusal: str | None = None  # an assistant's refusal part
    image_url: Any = None
    input_audio: Any = None
    file: Any = None

    @field_validator("type")
    @classmethod
    def _text_only(cls, t: str) -> str:
        if t not in ("text", "refusal"):
            raise ValueError(f"content parts of type {t!r} are not supported: this model reads text only")
        return t


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None  # accepted, not used
    refusal: str | None = None  # an assistant's, accepted, not used
    audio: dict | None = None
    tool_calls: list[dict] | None = None
    tool_call_id: str | None = None
    function_call: dict | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content)


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # accepted: nothing here is obfuscated


class JsonSchema(_Strict):
    name: str = Field("response", min_length=1, max_length=64)
    description: str | None = None
    schema_: dict = Field(default_factory=dict, alias="schema")
    strict: bool | None = None  # the grammar always enforces the schema

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None
    schema_: dict | None = Field(None, alias="schema")  # llama.cpp's server accepts the schema here too

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class _Sampling(_Strict):
    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    # the ranges are GenerationParams.validate's (app.engine.params), narrowed to OpenAI's where it has one
    temperature: float | None = Field(1.0, ge=0.0, le=2.0)  # OpenAI's default: sampling (null: the default)
    top_p: float | None = Field(1.0, gt=0.0, le=1.0)
    frequency_penalty: Penalty | None = 0.0
    presence_penalty: Penalty | None = 0.0
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    seed: int | None = None  # None: a fresh one per request
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = 1
    user: str | None = None  # accepted, not used
    response_format: ResponseFormat | None = None
    # llama.cpp's server's extras
    top_k: int = Field(40, ge=0, le=MAX_TOP_K)  # llama.cpp server's default; 0: off
    min_p: float = Field(0.0, ge=0.0, lt=1.0)
    typical_p: float = 1.0
    repeat_penalty: float = Field(1.0, gt=0.0, le=100.0)
    repeat_last_n: int = Field(64, ge=-1, le=MAX_TOKENS)
    grammar: str | None = None  # GBNF
    json_schema: dict | None = None  # llama.cpp's shortcut for response_format json_schema
    n_probs: int = Field(0, ge=0, le=MAX_TOP_LOGPROBS)  # llama.cpp's name for top logprobs
    cache_prompt: bool = True  # accepted: the cache is always reused, and reuse does not change a reply
    return_tokens: bool = False  # the generated token ids in the choice (llama.cpp's name)

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int | None) -> int:
        if n not in (None, 1):
            raise ValueError("only n=1 is supported")
        return 1

    @field_validator("typical_p")
    @classmethod
    def _no_typical(cls, v: float) -> float:
        if v != 1.0:
            raise ValueError("only typical_p=1 (off) is supported")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _token_ids(cls, bias: dict[str, float] | None) -> dict[str, float] | None:
        if bias and not all(k.isdigit() for k in bias):
            raise ValueError("keys must be token ids (decimal strings)")
        return bias

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > MAX_STOP or not all(stops):
            raise ValueError(f"stop takes up to {MAX_STOP} non-empty strings")
        return stop

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def grammar_text(self) -> str | None:
        """The GBNF the reply must follow: grammar, json_schema or response_format (one of them)."""
        rf = self.response_format
        wanted = [name for name, on in (("grammar", self.grammar is not None), ("json_schema", self.json_schema),
                                        ("response_format", rf is not None and rf.type != "text")) if on]
        if len(wanted) > 1:
            raise bad_request(f"{' and '.join(wanted)} both constrain the reply: send one", wanted[1])
        if self.grammar is not None:
            check_grammar(self.grammar)
            return self.grammar
        if self.json_schema is not None:
            return json_grammar(self.json_schema, "json_schema")
        if rf is None or rf.type == "text":
            return None
        if rf.type == "json_object":
            return json_grammar(rf.schema_, "response_format.schema")
        if rf.json_schema is None:
            raise bad_request("response_format.json_schema is required with type json_schema",
                              "response_format")
        return json_grammar(rf.json_schema.schema_, "response_format.json_schema.schema")

    def _request(self, kind: str, max_tokens: int | None, limit: int, top_logprobs: int | None) -> GenerationRequest:
        if max_tokens is not None and max_tokens > limit:
            raise bad_request(f"max_tokens is {max_tokens}; this server allows at most {limit}", "max_tokens")
        if top_logprobs is None and self.n_probs:
            top_logprobs = self.n_probs
        return GenerationRequest(
            kind=kind, model=self.model, max_tokens=max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p, top_k=self.top_k, min_p=self.min_p,
            presence_penalty=self.presence_penalty or 0.0, frequency_penalty=self.frequency_penalty or 0.0,
            repeat_penalty=self.repeat_penalty, repeat_last_n=self.repeat_last_n,
            logit_bias={int(k): v for k, v in (self.logit_bias or {}).items()}, grammar=self.grammar_text(),
            logprobs=top_logprobs, seed=self.seed, stop=self.stop_list(), stream=bool(self.stream),
            include_usage=bool(self.stream_options and self.stream_options.include_usage),
            return_tokens=self.return_tokens)


class Function(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule; also keeps markup out of prompts
    description: str | None = None
    parameters: dict | None = None  # a JSON schema; none: no arguments
    strict: bool | None = None  # the grammar (tool_choice required or named) always follows the schema


class Tool(_Strict):
    type: str = "function"
    function: Function | None = None
    custom: dict | None = None

    @field_validator("type")
    @classmethod
    def _functions_only(cls, t: str) -> str:
        if t != "function":
            raise ValueError(f"tools of type {t!r} are not supported: type \"function\" only")
        return t


def _tool_calls_for_template(calls: list[dict], i: int) -> list[dict]:
    """An assistant message's tool_calls as chat templates read them: arguments as a JSON object (as
    llama.cpp's server passes them), where OpenAI sends JSON text."""
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        where = f"messages.{i}.tool_calls.{j}"
        if not (isinstance(fn, dict) and isinstance(fn.get("name"), str)
                and re.fullmatch(r"[A-Za-z0-9_-]{1,64}", fn["name"]) and isinstance(fn.get("arguments"), str)):
            raise bad_request(f"{where}: needs function.name (letters, digits, _ and -) and function.arguments "
                              "(JSON text)", "messages")
        try:
            args = json.loads(fn["arguments"] or "{}")
        except ValueError:
            args = None
        if not isinstance(args, dict):
            raise bad_request(f"{where}.function.arguments: must be a JSON object's text", "messages")
        out.append({"id": str(call.get("id", "")), "type": "function",
                    "function": {"name": fn["name"], "arguments": args}})
    return out


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # the newer name of max_tokens
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict] | None = None  # the older name of tools
    function_call: str | dict | None = None  # the older name of tool_choice
    audio: dict | None = None
    modalities: list[Literal["text", "audio"]] | None = None
    prediction: dict | None = None  # accepted: a hint, the reply is the model's either way
    web_search_options: dict | None = None
    moderation: dict | None = None
    # accepted, no effect on a local model
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict | None = None

    def to_request(self, limit: int) -> GenerationRequest:
        self._refuse_what_cannot_be_honoured()
        call_grammar_text = self._tool_grammar()
        req = self._request(CHAT, self.max_completion_tokens or self.max_tokens, limit,
                            (self.top_logprobs or 0) if self.logprobs else None)
        if call_grammar_text is not None:
            if req.grammar is not None:
                raise bad_request("tool_choice (a required call) and a grammar or response_format both constrain "
                                  "the reply: send one", "tool_choice")
            req.grammar = call_grammar_text
        # with tool_choice "none" the model is not told of the tools, and its reply is not read for calls
        if self.tools and self.tool_choice != "none":
            req.tools = [t.model_dump(exclude_none=True) for t in self.tools]
        # "developer" is the newer name of "system"
        req.messages = [ChatMessage("system" if m.role == "developer" else m.role, m.text(),
                                    _tool_calls_for_template(m.tool_calls, i) if m.tool_calls else None,
                                    m.tool_call_id)
                        for i, m in enumerate(self.messages)]
        return req

    def _tool_grammar(self) -> str | None:
        """The grammar that forces a call (tool_choice "required" or a named function), or None."""
        choice = self.tool_choice
        if choice in (None, "none", "auto"):
            return None
        if not self.tools:
            raise bad_request("tool_choice needs tools", "tool_choice")
        if choice == "required":
            return call_grammar([t.model_dump() for t in self.tools], None, self.parallel_tool_calls is not False)
        fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if name is None:
            raise bad_request("tool_choice takes \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                              "\"function\": {\"name\": ...}}", "tool_choice")
        if name not in [t.function.name for t in self.tools]:
            raise bad_request(f"tool_choice names {str(name)[:64]!r}, which is not among the tools", "tool_choice")
        return call_grammar([t.model_dump() for t in self.tools], name, False)

    def _refuse_what_cannot_be_honoured(self) -> None:
        if self.audio is not None or (self.modalities and "audio" in self.modalities):
            raise bad_request("audio output is not supported: modalities takes [\"text\"] only", "modalities")
        if self.web_search_options is not None:
            raise bad_request("web search is not supported: leave web_search_options out", "web_search_options")
        if self.moderation is not None:
            raise bad_request("moderation is not supported: leave moderation out", "moderation")
        if self.functions or self.function_call not in (None, "none", "auto"):
            raise bad_request("functions and function_call (the older names) are not supported: send tools and "
                              "tool_choice", "functions" if self.functions else "function_call")
        for t in self.tools or []:
            if t.function is None:
                raise bad_request("tools: each needs a function ({\"name\": ..., \"parameters\": ...})", "tools")
        for i, m in enumerate(self.messages):
            if m.role == "function" or m.function_call:
                raise bad_request(f"messages.{i}: function messages and function_call (the older names) are not "
                                  "supported: send tool messages and tool_calls", "messages")
            if m.audio is not None:
                raise bad_request(f"messages.{i}.audio: audio is not supported", "messages")


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)  # how many alternatives (OpenAI's up to 5)
    echo: bool | None = False
    best_of: int | None = None
    suffix: str | None = None

    def to_request(self, limit: int) -> GenerationRequest:
        prompts = [self.prompt] if isinstance(self.prompt, str) else self.prompt
        if len(prompts) != 1:
            raise bad_request("prompt must be one string (batches are not supported)", "prompt")
        if self.echo:
            raise bad_request("echo is not supported: only false", "echo")
        if self.best_of not in (None, 1):
            raise bad_request("only best_of=1 is supported", "best_of")
        if self.suffix:
            raise bad_request("suffix (fill in the middle) is not supported: send null or \"\"", "suffix")
        req = self._request(COMPLETION, self.max_tokens or COMPLETION_DEFAULT_MAX_TOKENS, limit, self.logprobs)
        req.prompt = prompts[0]
        return req


def parse_body(body: bytes, schema: type[ChatRequest] | type[CompletionRequest], limit: int) -> GenerationRequest:
    """The request in `body` (JSON), or an ApiError that says what is wrong with it."""
    too_deep = bad_request(f"the body nests deeper than {MAX_DEPTH} levels", code="too_deep")
    try:
        data = json.loads(body, parse_constant=_no_constant)
    except RecursionError:
        raise too_deep from None
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"the body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object")
    if depth(data) > MAX_DEPTH:
        raise too_deep
    try:
        parsed = schema.model_validate(data)
    except ValidationError as e:
        raise _validation_error(e) from None
    try:
        return parsed.to_request(limit)
    except InvalidParams as e:  # a grammar or schema that cannot be used
        raise bad_request(str(e), e.param.split(".")[0] if e.param else None) from None


def depth(value: object) -> int:
    """How deep a parsed JSON value nests (a scalar: 0), without recursion."""
    deepest = 0
    todo = [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _validation_error(e: ValidationError) -> ApiError:
    # a union's first member's complaint ("should be a valid string") says less than our own checks'
    err = next((x for x in e.errors() if x["type"] == "value_error"), e.errors()[0])
    where = _where(err["loc"])
    if err["type"] == "extra_forbidden":
        return bad_request(f"unknown field {where!r}", where.split(".")[0], "unknown_field")
    if err["type"] == "missing":
        return bad_request(f"missing required field {where!r}", where.split(".")[0], "missing_field")
    msg = err["msg"].removeprefix("Value error, ")
    return bad_request(f"{where}: {msg}" if where else msg, where.split(".")[0] or None)


def _where(loc: tuple) -> str:
    """The field path of an error, without the names pydantic gives union members (stop.list[str].0)."""
    parts = []
    for x in loc:
        if isinstance(x, int):
            parts.append(str(x))
        elif isinstance(x, str) and x.isidentifier() and x not in _TYPE_NAMES:
            parts.append(x)
    return ".".join(parts)
