"""The native APIs as FlashDesk's modules use them, bound on first use: importing
FlashDesk loads no native library (the CLI's --help, the app's first window
and the tests that need none stay fast).

    from native.api import ext, llama as lc    # then lc.llama_decode(...), ext.target_layers(...)
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

from native.lib import load


class _OnFirstUse:
    """A module bound on its first attribute access."""

    def __init__(self, bind: Callable[[], ModuleType]):
        self._bind = bind
        self._mod: ModuleType | None = None

    def __getattr__(self, name: str) -> object:
        if self._mod is None:
            self._mod = self._bind()
        return getattr(self._mod, name)


def _bind_ext() -> ModuleType:
    from native import ext as mod  # noqa: PLC0415 - importing it loads the library and binds its symbols

    return mod


llama = _OnFirstUse(load)  # llama_cpp.llama_cpp on the patched build
ext = _OnFirstUse(_bind_ext)  # FlashDesk's C API (native/ext.py)
