"""uvicorn on a socket bound up front (so a taken port is a clear error before anything starts, and
port 0 gets a free one): in the foreground (`flashdesk serve`, Ctrl-C stops it) or in a thread
(the app's Server panel, the tests, the bench)."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from fastapi import FastAPI

from app.server.app import create_app
from app.server.config import ServerConfig
from app.server.errors import ServerConfigError
from app.server.service import EngineExecutor, GenerationService

GRACEFUL_S = 3  # how long a stop waits for replies still streaming (their generations are cancelled first)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port, or a ServerConfigError that says why not."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except OSError as e:
        raise ServerConfigError(f"cannot resolve {host}: {e}") from None
    infos.sort(key=lambda info: info[0] != socket.AF_INET)  # "localhost": 127.0.0.1, as clients try first
    family, kind, proto, _, addr = infos[0]
    # proto must say TCP: asyncio sets TCP_NODELAY on accepted sockets only then, and without it a
    # response written in two parts waits for the client's delayed ACK (40 ms per request)
    sock = socket.socket(family, kind, proto or socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise ServerConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _server(app: FastAPI) -> uvicorn.Server:
    # uvicorn's access log is replaced by the service's request log (tokens, tok/s, tau)
    return uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off",
                                         timeout_graceful_shutdown=GRACEFUL_S))


def serve_forever(app: FastAPI, sock: socket.socket) -> None:
    """Serve until SIGINT/SIGTERM (uvicorn's own handlers, in the main thread)."""
    _server(app).run(sockets=[sock])


class ServerThread:
    """uvicorn in a daemon thread: start() returns once it accepts connections; stop() joins it."""

    def __init__(self, app: FastAPI, sock: socket.socket):
        self.sock = sock
        self.url = url_of(sock)
        self._server = _server(app)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="flashdesk-server", daemon=True)

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        if not self._server.started:
            self.stop()
            raise ServerConfigError(f"the server on {self.url} did not start")
        return self

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = GRACEFUL_S + 5) -> None:
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self.sock.close()


class BackgroundServer:
    """A whole server in a thread over `executor`: the service, the app, uvicorn. Refuses to start
    as config.validate() says; stop() fails what is queued, cancels what runs, and joins."""

    def __init__(self, executor: EngineExecutor, config: ServerConfig):
        config.validate()
        self.config = config
        self.service = GenerationService(executor, config.max_queue, config.max_tokens)
        self._thread = ServerThread(create_app(self.service, config), bind(config.host, config.port)).start()
        self.url = self._thread.url

    @property
    def running(self) -> bool:
        return self._thread.running

    def stop(self) -> None:
        self.service.close()
        self._thread.stop()
