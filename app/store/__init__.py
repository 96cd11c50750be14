"""SQLite persistence: conversations, messages with their stats, settings."""

from app.store.db import Store, default_data_dir
from app.store.records import Conversation, Message

__all__ = ["Conversation", "Message", "Store", "default_data_dir"]
