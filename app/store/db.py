"""The FlashDesk database: one SQLite file in the user data directory.

WAL mode with synchronous=NORMAL: every commit survives a crash or kill of
the app (only a power loss can drop the last commits), and a reader in one
thread never blocks the writer in another. Each thread opens its own Store
on the same file (sqlite3 connections are not shared across threads).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app.errors import FlashDeskError
from app.store.failures import open_failure, write_failure
from app.store.records import STATUS_INTERRUPTED, STATUS_STREAMING, Conversation, Message

SCHEMA_VERSION = 2

# columns added after version 1, as (table, column, declaration): added to older files when they open, so a
# database written by an earlier FlashDesk keeps working (and an earlier FlashDesk ignores them)
_ADDED_COLUMNS = [
    ("conversations", "collections", "TEXT NOT NULL DEFAULT '[]'"),  # v2: the chat's document collections
    ("messages", "sources", "TEXT NOT NULL DEFAULT '[]'"),  # v2: the document sources of a reply
]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- ids are never reused (a regenerated reply gets a new one)
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    overrides TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- ids are never reused (a regenerated reply gets a new one)
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT 'done',
    stats TEXT,
    drafted_spans TEXT NOT NULL DEFAULT '[]',
    model TEXT NOT NULL DEFAULT '',
    error TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
CREATE TABLE IF NOT EXISTS settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""


class StoreError(FlashDeskError):
    pass


def default_data_dir() -> Path:
    """$FLASHDESK_DATA_DIR, else $XDG_DATA_HOME/flashdesk, else ~/.local/share/flashdesk."""
    if os.environ.get("FLASHDESK_DATA_DIR"):
        return Path(os.environ["FLASHDESK_DATA_DIR"]).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "flashdesk"


class Store:
    """Conversations, messages and settings in one SQLite file."""

    FILENAME = "flashdesk.sqlite3"

    def __init__(self, path: str | Path | None = None):
        path = Path(path) if path is not None else default_data_dir() / self.FILENAME
        if str(path) == ":memory:":  # a throwaway store (headless runs, tests)
            pass
        elif path.is_dir():
            path = path / self.FILENAME
        self.path = path
        try:
            if str(path) != ":memory:":
                path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(str(path), timeout=10.0)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            with self._db:
                self._db.executescript(_SCHEMA)
                _add_missing_columns(self._db)
                self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except (sqlite3.DatabaseError, OSError) as e:
            raise StoreError(open_failure(path, e)) from e

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """One transaction; a failed write (a full disk, a read-only folder) is a StoreError naming the
        file and the cause, and the transaction is rolled back: what was stored before stays."""
        try:
            with self._db:
                yield
        except sqlite3.Error as e:
            raise StoreError(write_failure(self.path, e)) from e

    # --- conversations --------------------------------------------------------
    def create_conversation(self, title: str = "New chat", system_prompt: str = "") -> Conversation:
        now = time.time()
        with self._writing():
            cur = self._db.execute(
                "INSERT INTO conversations(title, system_prompt, created_at, updated_at) VALUES (?,?,?,?)",
                (title, system_prompt, now, now))
        return self.conversation(cur.lastrowid)

    def conversation(self, conv_id: int) -> Conversation:
        row = self._db.execute("SELECT * FROM conversations WHERE id=?", (conv_id,)).fetchone()
        if row is None:
            raise StoreError(f"{self.path}: no conversation with id {conv_id}")
        return _conversation(row)

    def conversations(self, search: str = "") -> list[Conversation]:
        """All conversations, most recently used first; `search` matches titles and message text."""
        if not search.strip():
            rows = self._db.execute("SELECT * FROM conversations ORDER BY updated_at DESC, id DESC").fetchall()
        else:
            like = "%" + search.strip().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            rows = self._db.execute(
                "SELECT * FROM conversations c WHERE c.title LIKE ? ESCAPE '\\' OR EXISTS ("
                " SELECT 1 FROM messages m WHERE m.conversation_id=c.id AND m.content LIKE ? ESCAPE '\\')"
                " ORDER BY updated_at DESC, id DESC", (like, like)).fetchall()
        return [_conversation(r) for r in rows]

    def rename_conversation(self, conv_id: int, title: str) -> None:
        title = title.strip() or "Untitled"
        with self._writing():
            self._db.execute("UPDATE conversations SET title=? WHERE id=?", (title, conv_id))

    def set_system_prompt(self, conv_id: int, text: str) -> None:
        with self._writing():
            self._db.execute("UPDATE conversations SET system_prompt=? WHERE id=?", (text, conv_id))

    def set_overrides(self, conv_id: int, overrides: dict) -> None:
        with self._writing():
            self._db.execute("UPDATE conversations SET overrides=? WHERE id=?", (json.dumps(overrides), conv_id))

    def set_collections(self, conv_id: int, names: list[str]) -> None:
        """The document collections the chat answers from (empty: a plain chat)."""
        with self._writing():
            self._db.execute("UPDATE conversations SET collections=? WHERE id=?", (json.dumps(list(names)), conv_id))

    def delete_conversation(self, conv_id: int) -> None:
        with self._writing():
            self._db.execute("DELETE FROM conversations WHERE id=?", (conv_id,))

    def touch(self, conv_id: int) -> None:
        with self._writing():
            self._db.execute("UPDATE conversations SET updated_at=? WHERE id=?", (time.time(), conv_id))

    # --- messages -------------------------------------------------------------
    def add_message(self, conv_id: int, role: str, content: str, status: str = "done", model: str = "",
                    sources: list[dict] | None = None) -> Message:
        """`sources`: the document sources a reply was given (Source.to_dict() forms)."""
        if role not in ("system", "user", "assistant"):
            raise StoreError(f"{self.path}: unknown message role {role!r}")
        now = time.time()
        with self._writing():
            cur = self._db.execute(
                "INSERT INTO messages(conversation_id, role, content, status, model, sources, created_at,"
                " updated_at) VALUES (?,?,?,?,?,?,?,?)",
                (conv_id, role, content, status, model, json.dumps(sources or []), now, now))
            self._db.execute("UPDATE conversations SET updated_at=? WHERE id=?", (now, conv_id))
        return self.message(cur.lastrowid)

    def message(self, msg_id: int) -> Message:
        row = self._db.execute("SELECT * FROM messages WHERE id=?", (msg_id,)).fetchone()
        if row is None:
            raise StoreError(f"{self.path}: no message with id {msg_id}")
        return _message(row)

    def messages(self, conv_id: int) -> list[Message]:
        rows = self._db.execute("SELECT * FROM messages WHERE conversation_id=? ORDER BY id", (conv_id,)).fetchall()
        return [_message(r) for r in rows]

    def update_message(self, msg_id: int, *, content: str | None = None, status: str | None = None,
                       stats: dict | None = None, drafted_spans: list[list[int]] | None = None,
                       error: str | None = None, sources: list[dict] | None = None) -> None:
        """Write the given fields in one commit (the streaming path calls this every step)."""
        sets, vals = ["updated_at=?"], [time.time()]
        for name, value in (("content", content), ("status", status), ("error", error)):
            if value is not None:
                sets.append(f"{name}=?")
                vals.append(value)
        if stats is not None:
            sets.append("stats=?")
            vals.append(json.dumps(stats))
        if drafted_spans is not None:
            sets.append("drafted_spans=?")
            vals.append(json.dumps(drafted_spans))
        if sources is not None:
            sets.append("sources=?")
            vals.append(json.dumps(sources))
        vals.append(msg_id)
        with self._writing():
            self._db.execute(f"UPDATE messages SET {', '.join(sets)} WHERE id=?", vals)

    def delete_messages_from(self, msg_id: int, conv_id: int) -> int:
        """Delete message `msg_id` and every later one of its conversation; returns how many."""
        with self._writing():
            cur = self._db.execute("DELETE FROM messages WHERE conversation_id=? AND id>=?", (conv_id, msg_id))
        return cur.rowcount

    def mark_interrupted(self, conv_id: int, error: str) -> int:
        """The conversation's replies still 'streaming' (their writer died) become interrupted, saying why."""
        with self._writing():
            cur = self._db.execute("UPDATE messages SET status=?, error=?, updated_at=? WHERE conversation_id=? "
                                   "AND status=?", (STATUS_INTERRUPTED, error, time.time(), conv_id, STATUS_STREAMING))
        return cur.rowcount

    def recover_interrupted(self) -> int:
        """Mark replies left 'streaming' by a crash as interrupted (their text is kept)."""
        with self._writing():
            cur = self._db.execute("UPDATE messages SET status=? WHERE status=?",
                                   (STATUS_INTERRUPTED, STATUS_STREAMING))
        return cur.rowcount

    # --- settings -------------------------------------------------------------
    def get_setting(self, key: str, default: object = None) -> object:
        row = self._db.execute("SELECT value FROM settings WHERE key=?", (key,)).fetchone()
        if row is None:
            return default
        try:
            return json.loads(row["value"])
        except json.JSONDecodeError:
            return default  # a hand-edited or damaged value: fall back, never crash the app

    def set_setting(self, key: str, value: object) -> None:
        with self._writing():
            self._db.execute("INSERT INTO settings(key, value) VALUES (?,?) "
                             "ON CONFLICT(key) DO UPDATE SET value=excluded.value", (key, json.dumps(value)))


def _add_missing_columns(db: sqlite3.Connection) -> None:
    for table, column, decl in _ADDED_COLUMNS:
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if column not in have:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")


def _conversation(r: sqlite3.Row) -> Conversation:
    names = _json(r["collections"], [])
    return Conversation(r["id"], r["title"], r["system_prompt"], _json(r["overrides"], {}),
                        r["created_at"], r["updated_at"],
                        [str(n) for n in names] if isinstance(names, list) else [])


def _message(r: sqlite3.Row) -> Message:
    sources = _json(r["sources"], [])
    return Message(r["id"], r["conversation_id"], r["role"], r["content"], r["status"],
                   _json(r["stats"], None), _json(r["drafted_spans"], []), r["model"], r["error"],
                   r["created_at"], r["updated_at"],
                   [d for d in sources if isinstance(d, dict)] if isinstance(sources, list) else [])


def _json(text: str | None, default: object) -> object:
    if not text:
        return default
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return default
