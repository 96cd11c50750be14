"""The embedding model's process: `python -m app.host.embedder_child FD MODEL N_THREADS`, started by
app.host.embedder. It loads the model, says EmbedderReady (or Failed), then answers each Embed with
Vectors (or Failed) until Shutdown or the parent's end closes."""

from __future__ import annotations

import sys
from multiprocessing.connection import Connection

from app.documents.embedding import EmbeddingModel
from app.errors import FlashDeskError
from app.host.abort_hook import abort_here_if_asked
from app.host.protocol import Embed, EmbedderReady, Failed, Shutdown, Vectors


def main(argv: list[str]) -> int:
    conn = Connection(int(argv[0]))
    try:
        model = EmbeddingModel(argv[1], n_threads=int(argv[2]))
    except (FlashDeskError, OSError, ValueError) as e:
        conn.send(Failed("embed", str(e)))
        return 1
    conn.send(EmbedderReady(model.dim))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the app is gone
            break
        if isinstance(msg, Shutdown):
            break
        assert isinstance(msg, Embed), msg
        try:
            vectors = model.embed(msg.texts)
            abort_here_if_asked("embed")  # test hook: after the first texts are embedded
            conn.send(Vectors(vectors))
        except (FlashDeskError, ValueError) as e:
            conn.send(Failed("embed", str(e)))
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
