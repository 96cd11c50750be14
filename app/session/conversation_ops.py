"""Edits to a conversation that precede a reply: send, regenerate, edit-and-resend.

Each leaves the conversation ending with the user message to answer; the
reply itself is ChatSession.reply's job.
"""

from __future__ import annotations

from app.errors import FlashDeskError
from app.store import Store
from app.store.records import Message

DEFAULT_TITLE = "New chat"
_TITLE_CHARS = 48


class ConversationError(FlashDeskError):
    pass


def send_user_message(store: Store, conv_id: int, text: str) -> Message:
    """Append a user message; the first one also names an untitled chat."""
    if not text.strip():
        raise ConversationError("the message is empty")
    msg = store.add_message(conv_id, "user", text)
    conv = store.conversation(conv_id)
    if conv.title == DEFAULT_TITLE:
        store.rename_conversation(conv_id, title_from(text))
    return msg


def title_from(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _TITLE_CHARS else line[:_TITLE_CHARS - 1].rstrip() + "…"


def prepare_regenerate(store: Store, conv_id: int) -> Message:
    """Drop everything after the last user message; returns that message."""
    msgs = store.messages(conv_id)
    users = [m for m in msgs if m.role == "user"]
    if not users:
        raise ConversationError("there is no user message to answer again")
    last = users[-1]
    later = [m for m in msgs if m.id > last.id]
    if later:
        store.delete_messages_from(later[0].id, conv_id)
    return last


def edit_user_message(store: Store, msg_id: int, text: str) -> Message:
    """Replace a user message's text and drop every later message (edit-and-resend)."""
    if not text.strip():
        raise ConversationError("the edited message is empty")
    msg = store.message(msg_id)
    if msg.role != "user":
        raise ConversationError(f"message {msg_id} is a {msg.role} message; only user messages can be edited")
    store.update_message(msg_id, content=text)
    later = [m for m in store.messages(msg.conversation_id) if m.id > msg_id]
    if later:
        store.delete_messages_from(later[0].id, msg.conversation_id)
    return store.message(msg_id)
