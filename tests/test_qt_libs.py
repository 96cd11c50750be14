"""Start-up on a desktop without Qt's X11 libraries (issue 16, point 10): the missing libraries and the
command that installs them, found by the dynamic loader's real lookup, from doctor and before Qt starts."""

from __future__ import annotations

import subprocess
import sys

from app.cli.doctor import doctor_report, report_text
from app.ui.qt_libs import XCB_LIBRARIES, check_before_qt, missing_libraries, platform_is_xcb

# a library no system has, next to one every Linux has
ABSENT = ("libflashdesk-no-such-library.so.7", "libflashdesk-no-such-library7")
LIBS = [ABSENT, ("libc.so.6", "libc6")]
X11_DESKTOP = {"DISPLAY": ":0", "XDG_SESSION_TYPE": "x11"}


def test_a_library_the_loader_cannot_find_is_named_with_its_package() -> None:
    assert missing_libraries(LIBS) == [ABSENT]
    msg = check_before_qt(X11_DESKTOP, LIBS)
    assert msg == ("the desktop window cannot open: Qt's X11 (xcb) platform plugin needs "
                   "libflashdesk-no-such-library.so.7, which this system lacks. On Debian/Ubuntu install them "
                   "with: sudo apt install libflashdesk-no-such-library7")


def test_only_an_xcb_start_is_checked() -> None:
    assert platform_is_xcb(X11_DESKTOP, "linux")
    assert platform_is_xcb({"QT_QPA_PLATFORM": "xcb", "WAYLAND_DISPLAY": "wayland-0"}, "linux")
    assert not platform_is_xcb({"QT_QPA_PLATFORM": "offscreen"}, "linux")
    assert not platform_is_xcb({"QT_QPA_PLATFORM": "wayland"}, "linux")
    assert not platform_is_xcb({"WAYLAND_DISPLAY": "wayland-0", "XDG_SESSION_TYPE": "wayland"}, "linux")
    assert not platform_is_xcb(X11_DESKTOP, "darwin")
    assert check_before_qt({"QT_QPA_PLATFORM": "offscreen"}, LIBS) is None


def test_doctor_names_the_missing_libraries_and_the_command() -> None:
    rep = doctor_report(env=X11_DESKTOP, xcb_libraries=LIBS)
    assert rep["qt_xcb"] == "missing libflashdesk-no-such-library.so.7"
    text = report_text(rep)
    assert "qt_xcb: missing libflashdesk-no-such-library.so.7" in text.splitlines()
    assert text.splitlines()[-1].startswith("warning: the desktop window cannot open")
    assert text.rstrip().endswith("sudo apt install libflashdesk-no-such-library7")


def test_doctor_on_this_machine_says_what_it_found() -> None:
    env = {"PATH": "/usr/bin:/bin", "DISPLAY": ":0", "HOME": "/tmp"}  # an X11 desktop's start, no QT_QPA_PLATFORM
    res = subprocess.run([sys.executable, "-m", "app.cli", "doctor"], capture_output=True, text=True, timeout=120,
                         env=env)
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("qt_xcb: "))
    missing = missing_libraries()
    if missing:
        assert line == f"qt_xcb: missing {', '.join(s for s, _ in missing)}"
        assert "sudo apt install" in res.stdout
    else:
        assert line == f"qt_xcb: ok ({len(XCB_LIBRARIES)} X11 libraries found)"
