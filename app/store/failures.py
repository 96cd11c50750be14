"""What a failed open or write of the database says: the path and the cause (full disk, read-only folder,
a damaged file), not a traceback."""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

_FULL = ("database or disk is full", "no space left")
_READ_ONLY = ("readonly", "read-only", "unable to open database file", "permission denied")
_FULL_ERRNO = (errno.ENOSPC, errno.EDQUOT)
_READ_ONLY_ERRNO = (errno.EACCES, errno.EPERM, errno.EROFS)
MOVE_ADVICE = "choose another folder with --data-dir or FLASHDESK_DATA_DIR"


def cause(path: Path, e: BaseException) -> str:
    """The cause in words: "the disk is full", "... is read-only", or SQLite's own text."""
    text = str(e).lower()
    no = e.errno if isinstance(e, OSError) else None
    name = getattr(e, "sqlite_errorname", "") or ""  # SQLite's own codes (not errno values)
    if no in _FULL_ERRNO or name.startswith("SQLITE_FULL") or any(m in text for m in _FULL):
        return f"the disk is full ({e}): free some space"
    if (no in _READ_ONLY_ERRNO or name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM"))
            or any(m in text for m in _READ_ONLY)):
        folder = _first_unwritable(path)
        if folder is not None:
            return f"{folder} is read-only or not writable by this user ({e}): make it writable, or {MOVE_ADVICE}"
        return f"the database cannot be written ({e}): check the permissions of {path} and its folder"
    return str(e)


def open_failure(path: Path, e: BaseException) -> str:
    if isinstance(e, sqlite3.DatabaseError) and not isinstance(e, sqlite3.OperationalError):
        # "file is not a database", "malformed": the file itself is damaged
        return f"{path}: cannot open the FlashDesk database ({e}); move the file away to start with an empty one"
    return f"{path}: cannot open the FlashDesk database: {cause(path, e)}"


def write_failure(path: Path, e: BaseException) -> str:
    return f"{path}: cannot save: {cause(path, e)}; what was saved before is kept"


def _first_unwritable(path: Path) -> Path | None:
    """The nearest existing folder holding the database that this user cannot write (SQLite needs to
    create its -wal and -shm files there), else the file itself if it cannot be written."""
    for p in [path.parent, *path.parent.parents]:
        if p.exists():
            if not os.access(p, os.W_OK):
                return p
            break
    if path.exists() and not os.access(path, os.W_OK):
        return path
    return None
