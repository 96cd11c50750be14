"""`flashdesk` without a display: say so, and show a short generation on the bundled pair instead."""

from __future__ import annotations

import os
import sys
from typing import TextIO

from app.session.baseline import plain_reply_baseline
from app.session.chat_session import ChatSession
from app.session.conversation_ops import send_user_message
from app.session.models import ModelSpec, bundled_spec, load_engine
from app.session.settings import ChatSettings
from app.store import Store

HEADLESS_PROMPT = "What is speculative decoding, in one sentence?"


def has_display() -> bool:
    """False on a Linux box with no X11/Wayland display and no explicit Qt platform (a server, CI)."""
    if not sys.platform.startswith("linux"):
        return True
    return any(os.environ.get(k) for k in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"))


HEADLESS_MAX_TOKENS = 32


def run_headless(out: TextIO = sys.stdout, prompt: str = HEADLESS_PROMPT, max_tokens: int = HEADLESS_MAX_TOKENS,
                 spec: ModelSpec | None = None, speculative: bool = True, plain_after: bool = False) -> int:
    """Stream one chat reply from the bundled pair (or `spec`) through the same session the app uses
    (`speculative` False: plain decoding, the reply scripts/first_reply.py compares it with;
    `plain_after`: then time plain replies again in this process and print "[plain after: X tok/s]",
    the same-process check of the line's baseline that scripts/first_reply.py reads)."""
    print("flashdesk: no display found (DISPLAY / WAYLAND_DISPLAY unset), so the desktop window cannot open.\n"
          "Running a short headless generation on the bundled pair instead. To see the app, run it in a\n"
          "desktop session, or e.g. `xvfb-run flashdesk` / QT_QPA_PLATFORM=offscreen.", file=out)
    spec = spec or bundled_spec()
    print(f"models: {spec.label}" + ("" if spec.drafter else " (no bundled drafter yet: plain decoding)"),
          file=out)
    engine = load_engine(spec)
    store = Store(":memory:")  # nothing of this demo run is kept
    try:
        session = ChatSession(engine, store)
        base = plain_reply_baseline(session, prompt, max_tokens)
        session.baseline = base
        conv = store.create_conversation()
        send_user_message(store, conv.id, prompt)
        print(f"\nUser: {prompt}\nAssistant:", end="", file=out, flush=True)
        last = None
        for last in session.reply(conv.id, ChatSettings(max_tokens=max_tokens, speculative=speculative)):
            print(last.delta, end="", file=out, flush=True)
        s = last.summary
        speed = f", {s.speedup:.2f}x vs plain {base.tokens_per_s:.1f} tok/s measured" if s.speedup else ""
        print(f"\n\n[{s.n_generated} tokens, {s.tokens_per_s:.1f} tok/s, tau {s.tau:.2f}{speed}, "
              f"{last.finish_reason}]", file=out)
        if plain_after:
            after = plain_reply_baseline(session, prompt, max_tokens, warm_up=False)
            print(f"[plain after: {after.tokens_per_s:.1f} tok/s]", file=out)
    finally:
        store.close()
        engine.close()
    return 0
