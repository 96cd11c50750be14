"""Where models live, where downloads wait, and which file names are safe.

The models folder only ever holds complete, verified files: downloads are
staged in a sibling folder (same disk, so the final move is a rename) and
partial files stay there for a later resume.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from app.errors import FlashDeskError


class UnsafeFilename(FlashDeskError):
    """A file name would escape the models folder (path traversal) or is not a plain name."""


def data_dir() -> Path:
    """FLASHDESK_DATA_DIR, else $XDG_DATA_HOME/flashdesk, else ~/.local/share/flashdesk."""
    env = os.environ.get("FLASHDESK_DATA_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share") / "flashdesk"


def models_dir() -> Path:
    """FLASHDESK_MODELS_DIR, else <data dir>/models."""
    env = os.environ.get("FLASHDESK_MODELS_DIR")
    return Path(env).expanduser() if env else data_dir() / "models"


def staging_dir_for(models: Path) -> Path:
    """The downloads folder beside a models folder (same filesystem)."""
    return models.parent / f".{models.name}-downloads"


def check_safe_name(name: str, where: str = "") -> str:
    """A relative POSIX path with no '..', no absolute part, no backslash or control character."""
    prefix = f"{where}: " if where else ""
    if not name or name.strip() != name:
        raise UnsafeFilename(f"{prefix}file name {name!r} is empty or padded")
    if "\\" in name or any(ord(c) < 32 for c in name) or ":" in name:
        raise UnsafeFilename(f"{prefix}file name {name!r} has a backslash, colon or control character")
    p = PurePosixPath(name)
    if p.is_absolute() or any(part in ("..", ".", "") for part in name.split("/")):
        raise UnsafeFilename(f"{prefix}file name {name!r} would leave the models folder (path traversal)")
    return name


def inside(base: Path, name: str) -> Path:
    """base/name after checking that it stays inside base."""
    check_safe_name(name)
    dest = (base / name).resolve()
    root = base.resolve()
    if root != dest and root not in dest.parents:
        raise UnsafeFilename(f"file name {name!r} resolves outside {base}")
    return dest
