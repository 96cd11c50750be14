"""A full disk or a read-only data folder: a message naming the path and the cause, a reply cut off by a
failed write marked interrupted (not left streaming), and nothing stored before lost.

The full disk is SQLite's own: `PRAGMA max_page_count` caps the database at the pages it has, so the next
write that needs a page fails with SQLITE_FULL, as on a full filesystem. The read-only folder is a real
permission denial: chmod for an ordinary user; as root (who writes through any mode bits) the check runs in
a child process that drops to the `nobody` user first.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.session.chat_session import ChatSession
from app.session.conversation_ops import send_user_message
from app.session.settings import ChatSettings
from app.store import Store
from app.store.db import StoreError
from app.store.records import STATUS_INTERRUPTED

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def chat_engine(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """The tiny pair with a template that writes only what its vocabulary has (as the window tests use)."""
    from app.engine.dflash import Engine, EngineConfig
    from gguf_tools.synth import write_tiny_pair
    from tests.ui.conftest import TINY_TEMPLATE

    t, d = write_tiny_pair(tmp_path_factory.mktemp("tiny-chat"), "qwen3", chat_template=TINY_TEMPLATE)
    e = Engine(t, d, EngineConfig(n_ctx=1024, n_threads=1))
    yield e
    e.close()


def _fill(store: Store) -> None:
    """Cap the database at the pages it has and fill them: the next write that needs room fails."""
    pages = store._db.execute("PRAGMA page_count").fetchone()[0]  # noqa: SLF001 - the one connection the cap acts on
    store._db.execute(f"PRAGMA max_page_count={pages}")  # noqa: SLF001
    other = store.create_conversation("filler")
    with pytest.raises(StoreError):
        for _ in range(10_000):
            store.add_message(other.id, "user", "x" * 100)


def test_a_full_disk_mid_reply_ends_it_interrupted_and_keeps_what_was_stored(chat_engine, tmp_path: Path):  # noqa: ANN001
    store = Store(tmp_path / "db.sqlite3")
    earlier = store.create_conversation("earlier")
    send_user_message(store, earlier.id, "kept")
    conv = store.create_conversation()
    send_user_message(store, conv.id, "tell me a long story")
    steps = ChatSession(chat_engine, store).reply(conv.id, ChatSettings(max_tokens=300, draft_length=2))
    first = next(steps)  # stored, then shown
    _fill(store)
    with pytest.raises(StoreError) as e:
        for _ in steps:
            pass
    msg = str(e.value)
    assert str(store.path) in msg and "the disk is full" in msg and "what was saved before is kept" in msg
    assert len(msg) < 1024
    reply = store.message(first.message_id)
    assert reply.status == STATUS_INTERRUPTED  # not left "streaming"
    assert reply.content.startswith(first.content) and reply.content
    assert [m.content for m in store.messages(earlier.id)] == ["kept"]
    assert store._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"  # noqa: SLF001
    store.close()


def test_a_full_disk_when_sending_says_so(tmp_path: Path):
    store = Store(tmp_path / "db.sqlite3")
    conv = store.create_conversation()
    _fill(store)
    with pytest.raises(StoreError, match="the disk is full") as e:
        send_user_message(store, conv.id, "y" * 5000)
    assert str(store.path) in str(e.value)
    store.close()


_OPEN = """
import os, sys
from app.store import Store
from app.store.db import StoreError
if os.geteuid() == 0:  # root writes through any mode bits: be an ordinary user (everything is imported by now)
    os.setgid(65534)
    os.setuid(65534)
try:
    Store(sys.argv[1]).close()
except StoreError as e:
    print(e)
    sys.exit(3)
"""


def _open_as_user(db: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _OPEN, str(db)], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder the `nobody` user can reach (pytest's own tmp folders are private to their owner)."""
    d = Path(tempfile.mkdtemp(prefix="flashdesk-ro-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("existing", [True, False])
def test_a_read_only_data_folder_names_the_folder_not_a_damaged_file(shared_dir: Path, existing: bool):
    folder = shared_dir / "data"
    folder.mkdir()
    db = folder / Store.FILENAME
    if existing:
        s = Store(db)
        s.create_conversation("kept")
        s.close()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    try:
        r = _open_as_user(db)
    finally:
        folder.chmod(0o755)
    assert r.returncode == 3, r.stdout + r.stderr
    msg = r.stdout.strip()
    assert f"{folder} is read-only or not writable by this user" in msg, msg
    assert "move the file away" not in msg and "--data-dir" in msg and str(db) in msg
    if existing:  # nothing of it was lost
        s = Store(db)
        assert [c.title for c in s.conversations()] == ["kept"]
        s.close()


def test_a_damaged_file_still_says_move_it_away(tmp_path: Path):
    db = tmp_path / Store.FILENAME
    db.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="move the file away"):
        Store(db)
