"""Screenshot of FlashDesk mid-reply, under Xvfb, for the README.

    python scripts/screenshot.py [--out docs/screenshot.png] [--drafter D.gguf] [--draft-length 4]

Starts its own Xvfb server when there is no DISPLAY (apt-get install xvfb libxcb-cursor0
libxcb-icccm4 libxcb-keysyms1: Qt's xcb plugin needs the last three), opens the real window on
a throwaway database with the bundled target, asks two questions and grabs the screen while the
second reply is streaming (the worker is held at that step, so the picture is mid-reply). The
drafter is the bundled one, or --drafter, or else a random one written once for the bundled
target (then acceptance is ~0: the numbers are real, the drafter is not trained).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

QUESTIONS = ["Explain what a hash table is.",
             "Write a Python function that checks whether a string is a palindrome."]


def start_xvfb(size: str = "1600x1000x24") -> subprocess.Popen | None:
    """An Xvfb server on a free display number, or None when a display already exists."""
    if os.environ.get("DISPLAY"):
        return None
    if shutil.which("Xvfb") is None:
        sys.exit("no DISPLAY and no Xvfb: apt-get install -y xvfb")
    for n in range(99, 130):
        if not Path(f"/tmp/.X11-unix/X{n}").exists() and not Path(f"/tmp/.X{n}-lock").exists():
            proc = subprocess.Popen(["Xvfb", f":{n}", "-screen", "0", size, "-nolisten", "tcp"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(100):
                if Path(f"/tmp/.X11-unix/X{n}").exists():
                    os.environ["DISPLAY"] = f":{n}"
                    return proc
                time.sleep(0.05)
            proc.kill()
    sys.exit("could not start Xvfb")


def default_drafter(target: Path) -> Path:
    from app.bundled import default_drafter as bundled

    d = bundled()
    if d is not None:
        return d
    import numpy as np

    from gguf_tools.synth import write_drafter

    path = Path.home() / ".cache" / "flashdesk" / "screenshot" / "gemma-random-dflash.gguf"
    if not path.exists():
        print(f"no bundled drafter yet: writing a random one to {path}", flush=True)
        write_drafter(path, target, n_layer=2, dtype=np.float16)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "docs" / "screenshot.png"))
    ap.add_argument("--drafter", help="drafter GGUF (default: the bundled one, else a random one)")
    ap.add_argument("--draft-length", default="auto", help="auto (the app's default) or 1..15")
    ap.add_argument("--after-steps", type=int, default=10,
                    help="grab after this many window updates of the 2nd reply (each carries the steps "
                         "decoded since the last: app.host.protocol.UPDATE_INTERVAL_S)")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=0, help="llama.cpp threads (0: all cores)")
    args = ap.parse_args()

    xvfb = start_xvfb()
    if os.environ.get("QT_QPA_PLATFORM") == "offscreen":
        del os.environ["QT_QPA_PLATFORM"]  # a real X server: the picture is what a user sees
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QApplication

    from app.bundled import default_target
    from app.session.models import ModelSpec
    from app.store import Store
    from app.ui.event_wait import wait_until
    from app.ui.main_window import MainWindow

    app = QApplication([sys.argv[0]])
    data = Path(tempfile.mkdtemp(prefix="flashdesk-shot-"))
    target = default_target()
    drafter = Path(args.drafter) if args.drafter else default_drafter(target)
    store = Store(data / Store.FILENAME)
    dl = args.draft_length if args.draft_length == "auto" else int(args.draft_length)
    store.set_setting("generation", {"max_tokens": args.max_tokens, "draft_length": dl})
    store.close()

    win = MainWindow(data / Store.FILENAME, model=ModelSpec(str(target), str(drafter), n_ctx=2048,
                                                                n_threads=args.threads))
    win.resize(1500, 940)
    win.show()
    wait_until(lambda: win.model_info is not None and not win.loading)
    win.input.setPlainText(QUESTIONS[0])
    win.send()
    wait_until(lambda: win.busy_conv is None)

    # hold the worker after N steps of the second reply: the grab shows it mid-stream
    release, steps = threading.Event(), []

    def gate(_u) -> None:  # noqa: ANN001 - runs in the worker thread
        steps.append(1)
        if len(steps) == args.after_steps:
            release.wait(120)

    win.controller.worker.replyUpdate.connect(gate, Qt.ConnectionType.DirectConnection)
    win.input.setPlainText(QUESTIONS[1])
    win.send()
    wait_until(lambda: len(steps) >= args.after_steps or win.busy_conv is None)
    t_end = time.time() + 0.5  # let the last queued step render
    wait_until(lambda: time.time() > t_end)
    win.chat_view.flush()
    app.processEvents()
    # the window's own rendering (under Xvfb with the xcb platform, as on a desktop): a screen grab
    # would also pick up whatever the X server has not repainted yet
    shot = win.grab()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    shot.save(str(out), "PNG")
    print(f"wrote {out} ({shot.width()}x{shot.height()}), {len(steps)} updates into the reply", flush=True)
    release.set()
    win.close()  # closeEvent stops the worker within a step and closes the database
    if xvfb is not None:
        xvfb.terminate()
    shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
