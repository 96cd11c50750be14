"""What a server starts with, and the rule that keeps it private by default: it binds the
loopback interface unless told otherwise, and a non-loopback bind needs an API key."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from app.server.errors import ServerConfigError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
LOOPBACK_NAMES = ("localhost",)
# Host headers a loopback-bound server answers: anything else is a browser tricked by DNS rebinding
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


@dataclass
class ServerConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT  # 0: any free port
    api_key: str | None = None  # None: no key (loopback only)
    cors: list[str] = field(default_factory=list)  # origins allowed to call from a browser; none by default
    max_body_bytes: int = 1 << 20
    max_tokens: int = 2048  # the most tokens one request may ask for (and the default for chat)
    max_queue: int = 8  # requests waiting behind the running one; more get 429

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def validate(self) -> None:
        if not self.loopback and not self.api_key:
            raise ServerConfigError(f"refusing to serve on {self.host} without an API key: anyone who can reach "
                                    f"this machine could use the model. Pass --api-key KEY, or bind 127.0.0.1")
        if self.api_key is not None and not self.api_key.strip():
            raise ServerConfigError("the API key is empty")
        if not 0 <= self.port <= 65535:
            raise ServerConfigError(f"port {self.port} is not in 0..65535")
        for name in ("max_body_bytes", "max_tokens"):
            if getattr(self, name) < 1:
                raise ServerConfigError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_queue < 0:
            raise ServerConfigError(f"max_queue must be >= 0, got {self.max_queue}")
        if "*" in self.cors:
            raise ServerConfigError("--cors '*' would let every web page use the model: name the origin")


def is_loopback(host: str) -> bool:
    """True for a loopback address or "localhost"; a hostname or 0.0.0.0 is not."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
