"""The system libraries Qt's X11 (xcb) platform plugin needs, checked before Qt starts.

PySide6's wheels bring Qt but not the X11 helper libraries its xcb plugin
links against. On a Debian/Ubuntu desktop without e.g. libxcb-cursor0 the
window never opens and Qt only says "Reinstalling the application may fix
this problem". This module names the missing libraries and the command
that installs them. No Qt import here: it runs before Qt loads.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Mapping, Sequence

# (soname, Debian/Ubuntu package): what PySide6's libqxcb.so and libQt6XcbQpa.so.6 need (readelf -d),
# less what every X11 desktop has anyway
XCB_LIBRARIES: tuple[tuple[str, str], ...] = (
    ("libxcb-cursor.so.0", "libxcb-cursor0"),
    ("libxcb-icccm.so.4", "libxcb-icccm4"),
    ("libxcb-keysyms.so.1", "libxcb-keysyms1"),
    ("libxcb-image.so.0", "libxcb-image0"),
    ("libxcb-render-util.so.0", "libxcb-render-util0"),
    ("libxcb-util.so.1", "libxcb-util1"),
    ("libxcb-randr.so.0", "libxcb-randr0"),
    ("libxcb-shape.so.0", "libxcb-shape0"),
    ("libxcb-xkb.so.1", "libxcb-xkb1"),
    ("libxcb-sync.so.1", "libxcb-sync1"),
    ("libxcb-xfixes.so.0", "libxcb-xfixes0"),
    ("libxkbcommon-x11.so.0", "libxkbcommon-x11-0"),
    ("libX11-xcb.so.1", "libx11-xcb1"),
)


def platform_is_xcb(env: Mapping[str, str] | None = None, platform: str | None = None) -> bool:
    """True when Qt will use its xcb plugin: Linux, and QT_QPA_PLATFORM unset or xcb. (Qt picks
    wayland on its own only in a Wayland session.)"""
    env = os.environ if env is None else env
    if not (platform or sys.platform).startswith("linux"):
        return False
    chosen = env.get("QT_QPA_PLATFORM", "").strip()
    if chosen:
        return chosen.split(";")[0].split(":")[0] == "xcb"
    return not (env.get("WAYLAND_DISPLAY") and env.get("XDG_SESSION_TYPE") == "wayland")


def missing_libraries(libraries: Sequence[tuple[str, str]] = XCB_LIBRARIES) -> list[tuple[str, str]]:
    """The (soname, package) pairs the dynamic loader cannot load: the same lookup Qt's plugin gets."""
    missing = []
    for soname, package in libraries:
        try:
            ctypes.CDLL(soname)
        except OSError:
            missing.append((soname, package))
    return missing


def advice(missing: Sequence[tuple[str, str]]) -> str:
    """What to tell the user: the missing libraries and the install command."""
    names = ", ".join(s for s, _ in missing)
    packages = " ".join(dict.fromkeys(p for _, p in missing))
    return (f"the desktop window cannot open: Qt's X11 (xcb) platform plugin needs {names}, which this system "
            f"lacks. On Debian/Ubuntu install them with: sudo apt install {packages}")


def check_before_qt(env: Mapping[str, str] | None = None,
                    libraries: Sequence[tuple[str, str]] = XCB_LIBRARIES) -> str | None:
    """The message to stop with if the xcb plugin would fail to load, else None."""
    if not platform_is_xcb(env):
        return None
    missing = missing_libraries(libraries)
    return advice(missing) if missing else None
