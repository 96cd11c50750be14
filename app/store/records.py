"""Rows of the store as plain dataclasses (no SQLite, no Qt)."""

from __future__ import annotations

from dataclasses import dataclass, field

# message.status values
STATUS_DONE = "done"  # finished normally (or a user message)
STATUS_STREAMING = "streaming"  # being written right now
STATUS_STOPPED = "stopped"  # the user pressed Stop
STATUS_INTERRUPTED = "interrupted"  # the app died while it streamed (found at the next start)
STATUS_ERROR = "error"  # generation failed; `error` says why


@dataclass
class Conversation:
    id: int
    title: str
    system_prompt: str = ""
    overrides: dict = field(default_factory=dict)  # per-chat generation settings (only what differs)
    created_at: float = 0.0
    updated_at: float = 0.0
    collections: list[str] = field(default_factory=list)  # document collections the chat answers from


@dataclass
class Message:
    id: int
    conversation_id: int
    role: str  # "system" | "user" | "assistant"
    content: str
    status: str = STATUS_DONE
    stats: dict | None = None  # GenerationStats.to_dict() of the reply, plus the session's summary keys
    drafted_spans: list[list[int]] = field(default_factory=list)  # [start, end) char ranges from accepted drafts
    model: str = ""  # "target + drafter" file names that wrote it
    error: str = ""
    created_at: float = 0.0
    updated_at: float = 0.0
    sources: list[dict] = field(default_factory=list)  # document sources given to a reply (Source.to_dict())
