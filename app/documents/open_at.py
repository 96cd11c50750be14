"""Open a source file at its page (PDF) or line (text, code).

A plain `file://` URL opens the file but not the place: desktop openers drop
the `#page=` fragment. So the known viewers that take a page or a line on
their command line are tried first, then the desktop's default opener.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from app.errors import FlashDeskError

# viewer -> argument list for (path, page); first one installed wins
_PDF_VIEWERS: list[tuple[str, Callable[[str, int], list[str]]]] = [
    ("okular", lambda p, n: ["okular", "-p", str(n), p]),
    ("evince", lambda p, n: ["evince", "-i", str(n), p]),
    ("zathura", lambda p, n: ["zathura", "-P", str(n), p]),
    ("qpdfview", lambda p, n: ["qpdfview", f"{p}#{n}"]),
    ("mupdf", lambda p, n: ["mupdf", p, str(n)]),
    ("xreader", lambda p, n: ["xreader", "-i", str(n), p]),
    ("atril", lambda p, n: ["atril", "-i", str(n), p]),
]
_EDITORS: list[tuple[str, Callable[[str, int], list[str]]]] = [
    ("code", lambda p, n: ["code", "-g", f"{p}:{n}"]),
    ("kate", lambda p, n: ["kate", "-l", str(n), p]),
    ("gedit", lambda p, n: ["gedit", f"+{n}", p]),
    ("gnome-text-editor", lambda p, n: ["gnome-text-editor", f"+{n}", p]),
    ("subl", lambda p, n: ["subl", f"{p}:{n}"]),
]


class OpenError(FlashDeskError):
    pass


def open_command(path: str | Path, page: int | None = None, line: int | None = None,
                 which: Callable[[str], str | None] = shutil.which) -> list[str]:
    """The command that opens `path` at `page` (PDF) or `line` (text), or the
    desktop's default opener when no viewer that knows places is installed."""
    p = str(Path(path))
    is_pdf = p.lower().endswith(".pdf")
    if is_pdf and page:
        for name, make in _PDF_VIEWERS:
            if which(name):
                return make(p, page)
    if not is_pdf and line and Path(p).suffix.lower() not in (".docx", ".html", ".htm"):
        for name, make in _EDITORS:
            if which(name):
                return make(p, line)
    if sys.platform == "darwin":
        return ["open", p]
    if sys.platform.startswith("win"):
        return ["cmd", "/c", "start", "", p]
    return ["xdg-open", p]


def open_at(path: str | Path, page: int | None = None, line: int | None = None) -> list[str]:
    """Start the viewer (detached) and return the command used."""
    if not Path(path).exists():
        raise OpenError(f"{path}: the file is no longer there (moved or deleted since it was indexed)")
    cmd = open_command(path, page, line)
    try:
        subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    except OSError as e:
        raise OpenError(f"{path}: could not start {cmd[0]} ({e.strerror or e})") from None
    return cmd
