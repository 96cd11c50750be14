"""OpenAI's response objects for a finished (or streaming) generation, with llama.cpp-style `timings`.

`timings` follows llama.cpp's server (cache_n, prompt_n, prompt_ms, prompt_per_second, predicted_n,
predicted_ms, predicted_per_token_ms, predicted_per_second, draft_n, draft_n_accepted) and adds
DFlash's tau and draft sources, read from GenerationStats.to_dict() (the one serialisation).
"""

from __future__ import annotations

import time
import uuid

from app.chat.tools import ToolCall, ToolCallStream, parse_tool_calls
from app.engine.events import FINISH_CANCELLED, FINISH_LENGTH
from app.server.service import CHAT, SERVED_MODE, Finished, Logprob

# the stats fields timings carries as they are
STATS_KEYS = ("steps", "tau", "tau_by_source", "token_share", "drafted_by_source", "accepted_by_source")


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == CHAT else "cmpl-") + uuid.uuid4().hex[:24]


def finish_reason(reason: str, calls: list[ToolCall] | None = None) -> str:
    """OpenAI's names; "cancelled" only reaches a client when the server stops mid-reply. A reply with
    tool calls that ended by itself is "tool_calls"; one cut by max_tokens stays "length" (as
    llama.cpp's server has it), so that a client does not run the calls of a cut reply."""
    name = {FINISH_LENGTH: "length", FINISH_CANCELLED: "cancelled"}.get(reason, "stop")
    return "tool_calls" if calls and name == "stop" else name


def timings(stats: dict) -> dict:
    """llama.cpp's timings of a generation (stats: GenerationStats.to_dict()), plus DFlash's."""
    prompt_n = stats["n_prompt"] - stats["n_prompt_reused"]  # the tokens this request computed
    prompt_ms = stats["t_prefill_s"] * 1000.0
    predicted_n = stats["n_generated"]
    predicted_ms = stats["t_decode_s"] * 1000.0
    out = {
        "cache_n": stats["n_prompt_reused"],
        "prompt_n": prompt_n,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_second": round(prompt_n / prompt_ms * 1000.0, 3) if prompt_ms > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_token_ms": round(predicted_ms / predicted_n, 3) if predicted_n else 0.0,
        "predicted_per_second": stats["tokens_per_s"],
        "draft_n": stats["drafted"],
        "draft_n_accepted": stats["accepted"],
        "draft_mode": SERVED_MODE,
    }
    out.update({k: stats[k] for k in STATS_KEYS})
    return out


def usage(prompt_tokens: int, done: Finished) -> dict:
    n = done.stats["n_generated"]
    return {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n,
            "prompt_tokens_details": {"cached_tokens": done.stats["n_prompt_reused"]}}


class Reply:
    """The objects of one response: the whole one, or its stream's chunks (same id and time)."""

    def __init__(self, kind: str, model: str, prompt_tokens: int, return_tokens: bool, logprobs: bool = False,
                 tools: bool = False):
        self.kind = kind
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.return_tokens = return_tokens
        self.logprobs = logprobs
        self.tools = tools  # the reply is read for tool calls
        self._calls = ToolCallStream() if tools else None  # a stream's text, held back from a call on
        self._offset = 0  # a completion's text_offset so far (its stream's chunks continue it)
        self.id = new_id(kind)
        self.created = int(time.time())

    def _head(self, chunk: bool) -> dict:
        obj = ("chat.completion.chunk" if chunk else "chat.completion") if self.kind == CHAT else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _tail(self, done: Finished) -> dict:
        return {"usage": usage(self.prompt_tokens, done), "timings": timings(done.stats)}

    def whole(self, done: Finished) -> dict:
        lp = self._logprobs(done.logprobs)
        content, calls = parse_tool_calls(done.text) if self.tools else (done.text, [])
        if self.kind == CHAT:
            message = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = [c.to_openai() for c in calls]
            choice = {"index": 0, "message": message, "logprobs": lp}
        else:
            choice = {"index": 0, "text": done.text, "logprobs": lp}
        choice["finish_reason"] = finish_reason(done.finish_reason, calls)
        if self.return_tokens:
            choice["tokens"] = done.tokens
        return {**self._head(False), "choices": [choice], **self._tail(done)}

    def first_chunk(self) -> dict | None:
        """A chat stream opens with the assistant's role (a completion stream has no such chunk)."""
        if self.kind != CHAT:
            return None
        return self._chunk({"role": "assistant", "content": ""}, None)

    def text_chunk(self, text: str, logprobs: list[Logprob] | None = None) -> dict | None:
        """A step's chunk; None when it has nothing to say yet (text held back as a possible tool call)."""
        if self._calls is not None:
            text = self._calls.feed(text)
            if not text and not logprobs:
                return None
        out = self._chunk({"content": text} if self.kind == CHAT else text, None)
        out["choices"][0]["logprobs"] = self._logprobs(logprobs)
        return out

    def last_chunks(self, done: Finished) -> list[dict]:
        """What the held text turned out to be (content, or a chunk per tool call, with its index),
        then the finish reason, usage and timings (and the tokens, if asked)."""
        out = []
        calls = []
        if self._calls is not None:
            content, calls = self._calls.finish()
            if content:
                out.append(self._chunk({"content": content}, None))
            out += [self._chunk({"tool_calls": [{"index": i, **c.to_openai()}]}, None) for i, c in enumerate(calls)]
        last = self._chunk({} if self.kind == CHAT else "", finish_reason(done.finish_reason, calls))
        if self.return_tokens:
            last["choices"][0]["tokens"] = done.tokens
        return [*out, {**last, **self._tail(done)}]

    def usage_chunk(self, done: Finished) -> dict:
        """stream_options.include_usage: OpenAI's extra chunk with no choices."""
        return {**self._head(True), "choices": [], **self._tail(done)}

    def _logprobs(self, found: list[Logprob] | None) -> dict | None:
        """OpenAI's logprobs object of these tokens: chat's `content` list, or a completion's lists."""
        if not self.logprobs:
            return None
        found = found or []
        if self.kind == CHAT:
            return {"content": [{"token": x.token, "logprob": x.logprob, "bytes": x.bytes,
                                 "top_logprobs": [{"token": t, "logprob": v, "bytes": b} for t, b, v in x.top]}
                                for x in found], "refusal": None}
        offsets = []
        for x in found:
            offsets.append(self._offset)
            self._offset += len(x.token)
        return {"tokens": [x.token for x in found], "token_logprobs": [x.logprob for x in found],
                "top_logprobs": [{t: v for t, _, v in x.top} for x in found], "text_offset": offsets}

    def _chunk(self, delta: dict | str, reason: str | None) -> dict:
        if self.kind == CHAT:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": reason}
        return {**self._head(True), "choices": [choice]}
