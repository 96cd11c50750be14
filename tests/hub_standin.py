"""A local stand-in for the Hugging Face hub endpoints the downloader uses, on loopback.

    HEAD/GET /{owner}/{repo}/resolve/{revision}/{path}

HEAD answers like the hub for an LFS file (X-Repo-Commit, X-Linked-Etag = the
sha256, X-Linked-Size, ETag, Content-Length); GET serves the bytes, honouring
`Range: bytes=N-` with 206.

    POST /api/models/{owner}/{repo}/paths-info/{revision}   (form: paths=...)

answers like the hub's API: each file's size, git blob id (`oid`) and, for an
LFS file, `lfs.oid` = its sha256. Knobs for tests: serve corrupted bytes,
announce a huge size, pause mid-file until released (deterministic
cancel/resume), files kept in git rather than LFS, an ETag that is no checksum
(as a proxy may send), no API (a bare mirror), a connection dropped after N
bytes of every GET, and a log of every request.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

COMMIT = "0123456789abcdef0123456789abcdef01234567"
_PATH = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/paths-info/(?P<rev>[^/]+)$")


def git_blob_id(data: bytes) -> str:
    """What git (and the hub's API, as `oid`) calls a file kept in git: sha1 of a header and the bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


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
    in_git: set[tuple[str, str]] = field(default_factory=set)  # kept in git, not LFS: no sha256 anywhere
    opaque_etag: set[tuple[str, str]] = field(default_factory=set)  # HEAD's ETag is no checksum (a proxy's)
    no_api: bool = False  # paths-info answers 404, as a bare mirror would
    drop_after: int | None = None  # bytes of every GET body sent before the connection is cut
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
                if key in hub.opaque_etag:
                    self.send_header("ETag", 'W/"5e1f-18c2a4b7"')
                elif key in hub.in_git:  # the hub's ETag for a file in git is its blob id
                    self.send_header("ETag", f'"{git_blob_id(data)}"')
                else:
                    self.send_header("ETag", f'"{sha}"')
                if key not in hub.in_git and key not in hub.opaque_etag:
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
                    if hub.drop_after is not None and len(body) > hub.drop_after:
                        self.wfile.write(body[:hub.drop_after])
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)  # cut mid-body: the client sees too few bytes
                        return
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client cancelled

            def do_POST(self) -> None:  # noqa: N802
                hub.log.append(Request("POST", self.path, None))
                form = parse_qs(self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode())
                m = _API.match(self.path.split("?")[0])
                if m is None or hub.no_api:
                    body = b'{"error":"Not Found"}'
                    self.send_response(404)
                else:
                    infos = []
                    for path in form.get("paths", []):
                        data = hub.files.get((m["repo"], path))
                        if data is None:
                            continue  # the hub leaves out paths it does not have
                        info = {"type": "file", "path": path, "size": len(data), "oid": git_blob_id(data)}
                        if (m["repo"], path) not in hub.in_git:
                            info["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                                           "pointerSize": 134}
                        infos.append(info)
                    body = json.dumps(infos).encode()
                    self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
