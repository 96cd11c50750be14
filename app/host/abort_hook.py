"""A test hook for the engine processes: a real native abort, through ggml's own GGML_ASSERT path.

With FLASHDESK_TEST_ENGINE_ABORT set to a place's name ("load", "reply", "embed"), the process that
reaches that place aborts there, its GGML_ASSERT line on stderr, as llama.cpp's own asserts do.
"""

from __future__ import annotations

import ctypes
import os

from native.lib import build_info

ABORT_ENV = "FLASHDESK_TEST_ENGINE_ABORT"


def abort_here_if_asked(where: str) -> None:
    if os.environ.get(ABORT_ENV) != where:
        return
    ggml = ctypes.CDLL(str(build_info().lib_dir / "libggml-base.so"))
    ggml.ggml_abort.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
    # the text is the format itself (no % in it): ggml prints "file:line: text", then aborts
    ggml.ggml_abort(b"flashdesk-test-hook", 1, f"GGML_ASSERT({ABORT_ENV}={where}) failed".encode())
