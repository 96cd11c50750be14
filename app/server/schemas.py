"""Request bodies, parsed strictly: unknown fields, wrong types and values out of range are a 400
that names the field (as OpenAI's API does), never a guess. The accepted fields are OpenAI's
that this server honours, plus llama.cpp's `top_k`, `min_p` and `return_tokens`."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from app.chat.format import ChatMessage
from app.engine.params import MAX_TOP_K
from app.server.errors import ApiError, bad_request
from app.server.service import CHAT, COMPLETION, GenerationRequest

MAX_STOP = 4  # OpenAI's limit
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
_TYPE_NAMES = {"str", "int", "float", "bool", "none"}  # pydantic's names of union members in an error's loc


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None  # accepted, not used

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    # the ranges are GenerationParams.validate's (app.engine.params), temperature narrowed to OpenAI's 0..2
    temperature: float = Field(1.0, ge=0.0, le=2.0)  # OpenAI's default: sampling
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(40, ge=0, le=MAX_TOP_K)  # llama.cpp server's default; 0: off
    min_p: float = Field(0.0, ge=0.0, lt=1.0)
    seed: int | None = None  # None: a fresh one per request
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    user: str | None = None  # accepted, not used
    return_tokens: bool = False  # the generated token ids in the choice (llama.cpp's name)

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n

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

    def _request(self, kind: str, max_tokens: int | None, limit: int) -> GenerationRequest:
        if max_tokens is not None and max_tokens > limit:
            raise bad_request(f"max_tokens is {max_tokens}; this server allows at most {limit}", "max_tokens")
        return GenerationRequest(
            kind=kind, model=self.model, max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
            top_k=self.top_k, min_p=self.min_p, seed=self.seed, stop=self.stop_list(), stream=self.stream,
            include_usage=bool(self.stream_options and self.stream_options.include_usage),
            return_tokens=self.return_tokens)


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # the newer name of max_tokens

    def to_request(self, limit: int) -> GenerationRequest:
        req = self._request(CHAT, self.max_completion_tokens or self.max_tokens, limit)
        # "developer" is the newer name of "system"
        req.messages = [ChatMessage("system" if m.role == "developer" else m.role, m.text()) for m in self.messages]
        return req


class CompletionRequest(_Sampling):
    prompt: str | list[str]

    def to_request(self, limit: int) -> GenerationRequest:
        prompts = [self.prompt] if isinstance(self.prompt, str) else self.prompt
        if len(prompts) != 1:
            raise bad_request("prompt must be one string (batches are not supported)", "prompt")
        req = self._request(COMPLETION, self.max_tokens or COMPLETION_DEFAULT_MAX_TOKENS, limit)
        req.prompt = prompts[0]
        return req


def parse_body(body: bytes, schema: type[ChatRequest] | type[CompletionRequest], limit: int) -> GenerationRequest:
    """The request in `body` (JSON), or an ApiError that says what is wrong with it."""
    try:
        data = json.loads(body, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"the body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object")
    try:
        parsed = schema.model_validate(data)
    except ValidationError as e:
        raise _validation_error(e) from None
    return parsed.to_request(limit)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _validation_error(e: ValidationError) -> ApiError:
    err = e.errors()[0]
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
