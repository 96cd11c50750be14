"""The documents' embedding model in its own process, so an abort, a segfault or an out-of-memory kill
in llama.cpp while indexing ends that process only, never the app.

EmbedderProcess has what the indexer and the retriever use of an EmbeddingModel (.path, .id, .dim,
.embed, .close). A crash raises EmbedderCrashed naming the model, how the process ended and llama.cpp's
last line (the indexer marks that file failed with it and goes on); the next embed starts a fresh
process. Not thread-safe: one thread (the documents panel's index worker) uses it.
"""

from __future__ import annotations

import subprocess
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from app.documents.embedding import model_id
from app.errors import FlashDeskError, GenerationError, ModelLoadError
from app.host.process import reap_child, spawn_child, stop_child, with_native_line
from app.host.protocol import Embed, EmbedderReady, Failed, Vectors


class EmbedderCrashed(FlashDeskError):
    """The embedding model's process ended while it loaded or embedded."""


class EmbedderProcess:
    def __init__(self, path: str | Path, n_threads: int = 0):
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise ModelLoadError(f"{self.path}: embedding model not found")
        self.id = model_id(self.path)  # from the file (no llama.cpp): the same id the child's model has
        self._n_threads = n_threads
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self.log_path: Path | None = None
        self.dim = 0
        self._start()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> None:
        self._proc, self._conn, self.log_path = spawn_child(
            "app.host.embedder_child", [str(self.path), str(self._n_threads)], "embedder")
        msg = self._recv("loading")
        if isinstance(msg, Failed):
            self._reap()
            self.log_path.unlink(missing_ok=True)  # the message says why; llama.cpp's load log adds nothing
            raise ModelLoadError(msg.message)
        assert isinstance(msg, EmbedderReady), msg
        self.dim = msg.dim

    def embed(self, texts: list[str]) -> np.ndarray:
        """(len(texts), dim) float32, each row of unit length (as EmbeddingModel.embed)."""
        if self._proc is None:  # it crashed before: a fresh process
            self._start()
        try:
            self._conn.send(Embed(list(texts)))
        except OSError:  # it died between requests
            raise self._crashed("embedding") from None
        msg = self._recv("embedding")
        if isinstance(msg, Failed):
            raise GenerationError(msg.message)
        assert isinstance(msg, Vectors), msg
        return msg.vectors

    def _recv(self, doing: str) -> object:
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            raise self._crashed(doing) from None

    def _reap(self) -> str:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        return reap_child(proc, conn)

    def _crashed(self, doing: str) -> EmbedderCrashed:
        how = self._reap()
        return EmbedderCrashed(with_native_line(
            f"the embedding model's process ended ({how}) while {doing} with {self.path}", self.log_path))

    def close(self) -> None:
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if proc is not None:
            stop_child(proc, conn, self.log_path, timeout_s=30.0)

    def kill(self) -> None:
        """SIGKILL the process now (what an out-of-memory kill does; the tests use it)."""
        if self._proc is not None:
            self._proc.kill()

    def __del__(self) -> None:
        self.close()
