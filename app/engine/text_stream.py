"""Incremental detokenization with stop strings.

Tokens become bytes, bytes become text only once they form whole UTF-8
characters, and text that might be the start of a stop string is held back
until it is known not to be one (as llama.cpp's server does).
"""

from __future__ import annotations

import codecs
from collections.abc import Callable


class TextStream:
    def __init__(self, piece: Callable[[int], bytes], stop: list[str]):
        self._piece = piece
        self._stop = [s for s in stop if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""  # all text so far (before any stop string)
        self._sent = 0
        self.stopped = False

    def push(self, tokens: list[int]) -> str:
        """Add tokens; return the text that can be shown now."""
        if self.stopped:
            return ""
        self.text += self._decoder.decode(b"".join(self._piece(t) for t in tokens))
        return self._release()

    def finish(self) -> str:
        """End of generation: flush whatever is held back."""
        if not self.stopped:
            self.text += self._decoder.decode(b"", final=True)
        out = self.text[self._sent:]
        self._sent = len(self.text)
        return out

    def _release(self) -> str:
        for s in self._stop:
            i = self.text.find(s, self._sent)
            if i >= 0:
                self.text = self.text[:i]
                self.stopped = True
        if self.stopped:
            out = self.text[self._sent:]
            self._sent = len(self.text)
            return out
        hold = 0
        for s in self._stop:
            for n in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        end = len(self.text) - hold
        out = self.text[self._sent:end] if end > self._sent else ""
        self._sent = max(self._sent, end)
        return out
