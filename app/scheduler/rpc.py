"""llama.cpp rpc-server processes as extra ggml devices.

On one machine two servers on loopback act as two "GPUs" backed by the CPU:
the real multi-device path (layer split, pipelined copies, shared weights
across devices) without GPUs. The same servers on other boxes add their
devices to this one.

Registered RPC devices cannot be unregistered from a process, and llama.cpp
creates a backend for every registered device when a model uses the default
device list: register them only in a process that is about to use them
(tests run the check in a subprocess, see app.scheduler.verify).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

from native.ggml_devices import add_rpc_server
from native.lib import build_info


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def server_command() -> tuple[Path, dict[str, str]]:
    """The build's ggml-rpc-server and the environment it runs in: the build's own folder and
    where the CUDA runtime it linked lives (a PyPI cuBLAS is on no loader path) on LD_LIBRARY_PATH."""
    info = build_info()
    path = info.lib_dir / "ggml-rpc-server"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no ggml-rpc-server in the native build (it needs GGML_RPC=ON)")
    dirs = dict.fromkeys([str(info.lib_dir), *(str(Path(p).parent) for p in info.runtime_libs)])
    return path, {**os.environ, "LD_LIBRARY_PATH": ":".join([*dirs, os.environ.get("LD_LIBRARY_PATH", "")])}


class RpcServer:
    """One ggml-rpc-server child process on host:port (a free port unless given)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, threads: int = 1):
        self.host, self.port, self.threads = host, port or free_port(host), threads
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 15.0) -> RpcServer:
        binary, env = server_command()
        self.proc = subprocess.Popen([str(binary), "-H", self.host, "-p", str(self.port), "-t", str(self.threads)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                raise RuntimeError(f"ggml-rpc-server on {self.endpoint} exited with {self.proc.returncode}: {err}")
            try:
                # a probe connection; the server drops it and waits for the next client
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"ggml-rpc-server on {self.endpoint} did not listen within {timeout:.0f} s")

    def register(self) -> list:
        """Add this server's device(s) to ggml; returns native.ggml_devices.Device entries."""
        return add_rpc_server(self.endpoint)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> RpcServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
