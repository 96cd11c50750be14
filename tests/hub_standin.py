"""A local stand-in for the Hugging Face hub endpoints the downloader uses, on loopback.

    HEAD/GET /{owner}/{repo}/resolve/{revision}/{path}

HEAD answers like the hub for an LFS file (X-Repo-Commit, X-Linked-Etag = the
sha256, X-Linked-Size, ETag, Content-Length); GET serves the bytes, honouring
`Range: bytes=N-` with 206. Knobs for tests: serve corrupted bytes, announce a
huge size, pause mid-file until released (deterministic cancel/resume), and a
log of every request.
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_PATH = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")


@dataclass
class Request:
    method: str
    path: str
    range: str | None


@dataclass
class HubStandIn:
    files: dict[tuple[str, str], bytes] = field(default_factory=dict)  # (repo, path) -> content
    corrupt: set[tuple[str, str]] = field(default_factory=set)  # serve flipped bytes, announce the real sha
    announce_size: dict[tuple[str, str], int] = field(default_factory=dict)  # lie about the size in HEAD
    pause_after: int | None = None  # bytes of a GET body sent before waiting for `release`
    release: threading.Event = field(default_factory=threading.Event)
    paused: threading.Event = field(default_factory=threading.Event)  # set when a GET reached the pause
    log: list[Request] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    def add(self, repo: str, path: str, content: bytes) -> str:
        """Publish a file; returns its sha256."""
        self.files[(repo, path)] = content
        return hashlib.sha256(content).hexdigest()

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def gets(self) -> list[Request]:
        return [r for r in self.log if r.method == "GET"]

    def start(self) -> HubStandIn:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # noqa: ANN002 - quiet
                pass

            def handle(self) -> None:
                try:
                    super().handle()
                except (ConnectionResetError, BrokenPipeError):
                    pass  # a cancelled client hung up

            def _lookup(self) -> tuple[tuple[str, str], bytes] | None:
                m = _PATH.match(self.path.split("?")[0])
                if not m:
                    return None
                key = (m["repo"], m["file"])
                return (key, hub.files[key]) if key in hub.files else None

            def _not_found(self) -> None:
                body = b'{"error":"Entry not found"}'
                self.send_response(404)
                self.send_header("X-Error-Code", "EntryNotFound")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command == "GET":
                    self.wfile.write(body)

            def _headers(self, key: tuple[str, str], data: bytes, length: int, status: int = 200,
                         first: int = 0) -> None:
                sha = hashlib.sha256(data).hexdigest()
                size = hub.announce_size.get(key, len(data))
                self.send_response(status)
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{sha}"')
                self.send_header("X-Linked-Etag", f'"{sha}"')
                self.send_header("X-Linked-Size", str(size))
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(length))
                if status == 206:
                    self.send_header("Content-Range", f"bytes {first}-{len(data) - 1}/{len(data)}")
                self.end_headers()

            def do_HEAD(self) -> None:  # noqa: N802
                hub.log.append(Request("HEAD", self.path, None))
                found = self._lookup()
                if found is None:
                    return self._not_found()
                key, data = found
                self._headers(key, data, hub.announce_size.get(key, len(data)))

            def do_GET(self) -> None:  # noqa: N802
                rng = self.headers.get("Range")
                hub.log.append(Request("GET", self.path, rng))
                found = self._lookup()
                if found is None:
                    return self._not_found()
                key, data = found
                if key in hub.corrupt:
                    data_out = bytes(b ^ 0xFF for b in data[:64]) + data[64:]
                else:
                    data_out = data
                first = 0
                if rng:
                    m = re.match(r"bytes=(\d+)-$", rng)
                    first = int(m.group(1)) if m else 0
                body = data_out[first:]
                self._headers(key, data, len(body), 206 if first else 200, first)
                try:
                    if hub.pause_after is not None and len(body) > hub.pause_after:
                        self.wfile.write(body[:hub.pause_after])
                        self.wfile.flush()
                        hub.paused.set()
                        hub.release.wait(timeout=30)
                        body = body[hub.pause_after:]
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client cancelled

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
