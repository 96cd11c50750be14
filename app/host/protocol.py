"""The messages between the app and its engine process (pickled over one socket pair).

The parent sends one request at a time and reads the child's messages until
`Done`; only `Cancel` and `Ack` may cross while a request runs (the child's
reader thread takes them). Everything here is a plain dataclass: no Qt, no
llama.cpp objects.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.server.service import GenerationRequest
from app.session.models import ModelSpec
from app.session.settings import ChatSettings


@dataclass
class ModelInfo:
    """The loaded pair, as the window shows it."""
    spec: ModelSpec
    label: str
    has_drafter: bool
    block_size: int
    prompt_format: str
    n_ctx: int
    # which draft sources this load uses and why, one line each (app.session.draft_sources)
    draft_sources: tuple[str, ...] = ()


# --- parent -> child: requests --------------------------------------------------------------------------------------
@dataclass
class Load:
    spec: ModelSpec | None  # None: the bundled pair
    calibrate: bool = False


@dataclass
class Unload:
    pass


# a reply's steps reach the window at most this often (the last step at once; the store has every one):
# the window redraws a reply at most every 100 ms (app.ui.chat_view), and each update it is sent costs the
# UI process Python (unpickling, the message model) on the cores the decode shares, per step, where a GPU
# streams hundreds a second. On this 2-core CPU at ~90 steps a second it made no difference within the
# noise: a plain reply in the window still reads ~0.91x the engine process's own plain replies, before
# and after (docs/bench/first-reply-window-cpu.json at 35eab9a and after this)
UPDATE_INTERVAL_S = 0.04


@dataclass
class Reply:
    conversation_id: int
    settings: ChatSettings
    # steps the child may decode ahead of the parent's acks (0: each step waits for its ack, so a
    # Stop pressed while a step is shown ends the reply at the next one, as in-process)
    window: int = 0


@dataclass
class Plan:
    spec: ModelSpec


@dataclass
class ProbeDevices:
    pass


@dataclass
class ServeJob:
    """A local server request, run on the loaded pair with the chat session's controller."""
    request: GenerationRequest
    max_tokens: int  # the server's cap on tokens when the request names none


@dataclass
class Shutdown:
    pass


# --- parent -> child while a request runs ---------------------------------------------------------------------------
@dataclass
class Cancel:
    """Stop the running request after its current step (or a load at its next progress report)."""


@dataclass
class Ack:
    """The parent has shown one reply step (see Reply.window)."""


# --- child -> parent -----------------------------------------------------------------------------------------------
@dataclass
class LoadProgress:
    stage: str
    fraction: float


@dataclass
class Loaded:
    info: ModelInfo


@dataclass
class Failed:
    """The request failed with a message for the user (kind: "load", "reply", "plan", "calibrate", "baseline")."""
    kind: str
    message: str
    conversation_id: int = 0


@dataclass
class Result:
    """A value the request produced (kind: "baseline", "plan", "devices", "unloaded")."""
    kind: str
    value: object = None


@dataclass
class JobReport:
    """One of a server job's reports (app.server.service: Started, Piece, Finished, Failed)."""
    item: object


@dataclass
class Done:
    """The request has ended; the next one may be sent."""


# --- the embedding model's process (app.host.embedder) ----------------------------------------------------------------
@dataclass
class EmbedderReady:
    """The embedding model has loaded (or the child sends Failed("embed", ...) and exits)."""
    dim: int


@dataclass
class Embed:
    texts: list[str]


@dataclass
class Vectors:
    """(len(texts), dim) float32 rows of unit length, in the order of Embed.texts."""
    vectors: object
