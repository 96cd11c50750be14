"""The SQLite store: conversations, messages with stats, settings; WAL; crash recovery."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from app.store import Store
from app.store.db import StoreError
from app.store.records import STATUS_INTERRUPTED, STATUS_STREAMING


def test_conversations_and_messages_round_trip(tmp_path: Path):
    s = Store(tmp_path / "fd.sqlite3")
    c = s.create_conversation("first", system_prompt="be brief")
    m1 = s.add_message(c.id, "user", "hello")
    m2 = s.add_message(c.id, "assistant", "", status=STATUS_STREAMING, model="t.gguf + d.gguf")
    s.update_message(m2.id, content="hi there", status="done", stats={"summary": {"tau": 2.5}},
                     drafted_spans=[[0, 2]])
    s.close()

    s = Store(tmp_path / "fd.sqlite3")
    assert [m.id for m in s.messages(c.id)] == [m1.id, m2.id]
    got = s.message(m2.id)
    assert (got.content, got.status, got.stats, got.drafted_spans, got.model) == (
        "hi there", "done", {"summary": {"tau": 2.5}}, [[0, 2]], "t.gguf + d.gguf")
    assert s.conversation(c.id).system_prompt == "be brief"


def test_database_is_in_wal_mode(tmp_path: Path):
    Store(tmp_path / "fd.sqlite3").close()
    db = sqlite3.connect(tmp_path / "fd.sqlite3")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_search_matches_titles_and_message_text(tmp_path: Path):
    s = Store(tmp_path / "fd.sqlite3")
    a = s.create_conversation("Rust lifetimes")
    b = s.create_conversation("cooking")
    s.add_message(b.id, "user", "how long do I boil an egg (100% cooked)?")
    assert [c.id for c in s.conversations("lifetimes")] == [a.id]
    assert [c.id for c in s.conversations("EGG")] == [b.id]
    assert [c.id for c in s.conversations("100%")] == [b.id]  # LIKE wildcards are matched literally
    assert s.conversations("_") == []  # no underscore anywhere: "_" is not a wildcard here
    assert {c.id for c in s.conversations("")} == {a.id, b.id}


def test_delete_from_a_message_drops_it_and_later_ones_and_ids_are_not_reused(tmp_path: Path):
    s = Store(tmp_path / "fd.sqlite3")
    c = s.create_conversation()
    ids = [s.add_message(c.id, r, t).id for r, t in [("user", "a"), ("assistant", "b"), ("user", "c")]]
    assert s.delete_messages_from(ids[1], c.id) == 2
    assert [m.id for m in s.messages(c.id)] == [ids[0]]
    assert s.add_message(c.id, "assistant", "again").id > ids[2]


def test_deleting_a_conversation_deletes_its_messages(tmp_path: Path):
    s = Store(tmp_path / "fd.sqlite3")
    c = s.create_conversation()
    m = s.add_message(c.id, "user", "x")
    s.delete_conversation(c.id)
    with pytest.raises(StoreError, match="no message"):
        s.message(m.id)


def test_replies_left_streaming_by_a_crash_are_marked_interrupted_with_their_text(tmp_path: Path):
    s = Store(tmp_path / "fd.sqlite3")
    c = s.create_conversation()
    m = s.add_message(c.id, "assistant", "", status=STATUS_STREAMING)
    s.update_message(m.id, content="half a rep")
    assert s.recover_interrupted() == 1
    got = s.message(m.id)
    assert got.status == STATUS_INTERRUPTED and got.content == "half a rep"


def test_settings_are_json_and_a_damaged_value_falls_back(tmp_path: Path):
    s = Store(tmp_path / "fd.sqlite3")
    s.set_setting("generation", {"temperature": 0.7})
    assert s.get_setting("generation") == {"temperature": 0.7}
    s._db.execute("UPDATE settings SET value='{broken' WHERE key='generation'")
    s._db.commit()
    assert s.get_setting("generation", "default") == "default"


def test_an_unreadable_database_names_the_file(tmp_path: Path):
    bad = tmp_path / "fd.sqlite3"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match=str(bad)):
        Store(bad)
    assert bad.read_bytes().startswith(b"this is not")  # the user's file is left alone


def test_unknown_role_is_refused(tmp_path: Path):
    s = Store(tmp_path / "fd.sqlite3")
    c = s.create_conversation()
    with pytest.raises(StoreError, match="role"):
        s.add_message(c.id, "tool", "x")


def test_a_chats_collections_and_a_replys_sources_survive_a_reopen(tmp_path: Path):
    s = Store(tmp_path / "fd.sqlite3")
    c = s.create_conversation()
    assert s.conversation(c.id).collections == []
    s.set_collections(c.id, ["manuals", "notes"])
    src = {"n": 1, "file": "/d/a.pdf", "name": "a.pdf", "page": 2, "line_start": 1, "line_end": 9, "score": 1.5}
    m = s.add_message(c.id, "assistant", "", status=STATUS_STREAMING, sources=[src])
    assert s.message(m.id).sources == [src]
    s.update_message(m.id, content="x", sources=[{**src, "cited": True}])
    plain = s.add_message(c.id, "user", "hi")
    s.close()

    s = Store(tmp_path / "fd.sqlite3")
    assert s.conversation(c.id).collections == ["manuals", "notes"]
    assert s.message(m.id).sources == [{**src, "cited": True}] and s.message(plain.id).sources == []


def test_a_version_1_database_gains_the_new_columns_and_keeps_its_rows(tmp_path: Path):
    from app.store import db as store_db

    path = tmp_path / "fd.sqlite3"
    old = sqlite3.connect(path)  # the schema as FlashDesk wrote it before collections and sources
    old.executescript(store_db._SCHEMA)
    old.execute("INSERT INTO conversations(title, created_at, updated_at) VALUES ('old chat', 1, 1)")
    old.execute("INSERT INTO messages(conversation_id, role, content, created_at, updated_at)"
                " VALUES (1, 'user', 'hello', 1, 1)")
    old.execute("PRAGMA user_version=1")
    old.commit()
    old.close()

    s = Store(path)
    assert s._db.execute("PRAGMA user_version").fetchone()[0] == store_db.SCHEMA_VERSION
    conv = s.conversation(1)
    assert conv.title == "old chat" and conv.collections == []
    assert [(m.content, m.sources) for m in s.messages(1)] == [("hello", [])]
    s.set_collections(1, ["notes"])
    assert s.conversation(1).collections == ["notes"]
