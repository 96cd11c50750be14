"""`flashdesk` on a machine without a display: a clear message and a short generation, no crash."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.ui.headless import has_display

REPO = Path(__file__).resolve().parents[2]


def test_display_detection(monkeypatch: pytest.MonkeyPatch):
    for k in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(k, raising=False)
    assert has_display() is (not sys.platform.startswith("linux"))
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    assert has_display()


def test_headless_run_streams_a_reply_with_its_stats(tiny_spec):
    import io

    from app.ui.headless import run_headless

    out = io.StringIO()
    assert run_headless(out, prompt="hello there", max_tokens=12, spec=tiny_spec) == 0
    text = out.getvalue()
    assert "no display found" in text and "User: hello there\nAssistant:" in text
    assert "tok/s" in text and "tau" in text and "measured" in text
    assert "[plain after:" not in text
    out = io.StringIO()  # the same-process check scripts/first_reply.py asks for
    assert run_headless(out, prompt="hello there", max_tokens=12, spec=tiny_spec, plain_after=True) == 0
    assert out.getvalue().rstrip().splitlines()[-1].startswith("[plain after: ")


@pytest.mark.gemma
@pytest.mark.slow  # the real command on the bundled model: ~15 s on a quiet machine, minutes on a busy one
def test_flashdesk_without_a_display_runs_a_headless_generation(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    env["PYTHONPATH"] = str(REPO)
    env["FLASHDESK_DATA_DIR"] = str(tmp_path)  # the demo must not touch the user's database either way
    r = subprocess.run([sys.executable, "-m", "app.cli"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "no display found" in r.stdout
    assert "Assistant:" in r.stdout and "tok/s" in r.stdout
    assert not list(tmp_path.iterdir())
