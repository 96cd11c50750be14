"""The app's side of the engine process: start it, send one request, read its messages until Done.

The child is `python -m app.host.child` (a fresh interpreter: nothing of the
app's threads or Qt is inherited) joined by a socket pair; its stdout and
stderr (llama.cpp writes its GGML_ASSERT lines there) go to a log file. When
it dies (an abort, a segfault, an out-of-memory kill) the request in flight
raises EngineCrashed naming the models, how it ended and llama.cpp's last
line; the next request starts a fresh process.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

from app.errors import FlashDeskError
from app.host.protocol import Ack, Cancel, Done, Load, Shutdown
from app.session.chat_session import ReplyUpdate
from app.session.models import ModelSpec

POLL_S = 0.05  # how often a running request looks at its cancel event (a load, a server job)
TAIL_BYTES = 64 * 1024
LINE_MAX = 300  # chars of llama.cpp's last line in a message (a message stays under 1 KB)
_REPO = Path(__file__).resolve().parents[2]  # where the `app` package lives, for the child's sys.path


class EngineCrashed(FlashDeskError):
    """The engine process ended while it ran a request (or before it took one)."""

    def __init__(self, message: str, short: str):
        super().__init__(message)
        self.short = short  # "the engine process ended (killed by SIGABRT)": what a message row keeps


class EngineProcess:
    """One engine process at a time; not thread-safe: one thread (the app's engine worker) uses it."""

    def __init__(self, db_path: Path, documents_db: Path | None = None):
        self._db_path = Path(db_path)
        self._documents_db = documents_db
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self.log_path: Path | None = None
        self.loaded: ModelSpec | None = None  # the pair the process holds (its Loaded message said)
        self._loading = False  # a Load runs (its spec below; None: the bundled pair)
        self._loading_spec: ModelSpec | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> None:
        self._proc, self._conn, self.log_path = spawn_child(
            "app.host.child", [str(self._db_path), str(self._documents_db or "")], "engine")

    def request(self, msg: object, on_message: Callable[[object], None],
                cancel: threading.Event | None = None) -> None:
        """Send `msg`, pass each message back to on_message until Done. `cancel` set: the child is told
        (at once, or before the next step's Ack). Raises EngineCrashed when the process dies."""
        if isinstance(msg, Load):
            self._loading, self._loading_spec = True, msg.spec
        if self._proc is None:
            self._start()
        told = False
        self._send(msg)
        while True:
            told = told or self._pass_on(cancel)
            if not self._conn.poll(POLL_S):
                continue
            try:
                m = self._conn.recv()
            except (EOFError, OSError):
                raise self._crashed() from None
            if isinstance(m, Done):
                self._loading = False
                return
            on_message(m)
            if isinstance(m, ReplyUpdate) and m.finish_reason is None:
                told = told or self._pass_on(cancel)  # before the Ack the child may be waiting for
                self._send(Ack())

    def _pass_on(self, cancel: threading.Event | None) -> bool:
        """Tell the child to stop if `cancel` is set; True once told."""
        if cancel is not None and cancel.is_set():
            self._send(Cancel())
            return True
        return False

    def loaded_as(self, spec: ModelSpec) -> None:
        """The pair the process now holds (said by its Loaded message)."""
        self.loaded = spec
        if self._loading:
            self._loading_spec = spec  # the resolved pair (the bundled one named by its files)

    def forget_model(self) -> None:
        self.loaded = None

    def _send(self, msg: object) -> None:
        try:
            self._conn.send(msg)
        except OSError:  # BrokenPipe/ConnectionReset: it died between requests
            raise self._crashed() from None

    def died(self) -> EngineCrashed | None:
        """Between requests: the crash of a process that ended while idle (an out-of-memory kill with no
        request running), once; None while it lives or when none was started."""
        if self._proc is None or self._proc.poll() is None:
            return None
        return self._crashed(idle=True)

    def _crashed(self, idle: bool = False) -> EngineCrashed:
        """Collect the dead process (its exit status, the log's last llama.cpp line) and forget it."""
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        how = reap_child(proc, conn)
        doing = self._doing(idle)
        self._loading, self.loaded = False, None
        short = f"the engine process ended ({how})"
        msg = with_native_line(f"{short} while {doing}", self.log_path)
        return EngineCrashed(msg + " Your chats are kept: load the pair again or pick another model.", short)

    def _doing(self, idle: bool) -> str:
        spec = self._loading_spec if self._loading else self.loaded
        if spec is None:
            return "loading the bundled pair" if self._loading else "no model was loaded"
        files = ", ".join(str(p) for p in (spec.target, spec.drafter) if p)
        if idle:
            return f"idle with {spec.label} ({files}) loaded"
        return f"{'loading' if self._loading else 'running'} {spec.label} ({files})"

    def close(self, timeout_s: float = 30.0) -> None:
        """Ask the process to free the engine and exit; end it if it does not."""
        proc, conn = self._proc, self._conn
        self._proc = self._conn = None
        if proc is not None:
            stop_child(proc, conn, self.log_path, timeout_s)

    def kill(self) -> None:
        """SIGKILL the process now, from any thread (what an out-of-memory kill does; the tests use it)."""
        if self._proc is not None:
            self._proc.kill()


def spawn_child(module: str, args: list[str], log_name: str) -> tuple[subprocess.Popen, Connection, Path]:
    """Start `python -m module FD *args` joined by a socket pair (the child gets its end as fd FD), its
    stdout and stderr in a fresh log file (llama.cpp's GGML_ASSERT lines land there)."""
    parent, child = multiprocessing.Pipe()
    fd, log = tempfile.mkstemp(prefix=f"flashdesk-{log_name}-", suffix=".log")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(_REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    # ggml runs gdb for a backtrace before it aborts (seconds, where gdb is installed): off unless the user
    # set the variable, so the window says the crash at once
    env.setdefault("GGML_NO_BACKTRACE", "1")
    cmd = [sys.executable, "-m", module, str(child.fileno()), *args]
    try:
        proc = subprocess.Popen(cmd, pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=fd,
                                stderr=fd, env=env, cwd=str(_REPO))
    except BaseException:
        parent.close()
        raise
    finally:
        child.close()
        os.close(fd)
    return proc, parent, Path(log)


def reap_child(proc: subprocess.Popen, conn: Connection) -> str:
    """Collect a child that closed its end (or died): how it ended, in words."""
    conn.close()
    try:
        rc = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # it closed its end but lives on: end it
        proc.kill()
        rc = proc.wait()
    return _exit_text(rc)


def stop_child(proc: subprocess.Popen, conn: Connection, log_path: Path | None, timeout_s: float) -> None:
    """Ask a child to exit (Shutdown); end it if it does not in time. A clean exit's log is removed."""
    try:
        conn.send(Shutdown())
        proc.wait(timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()
    conn.close()
    if proc.returncode == 0 and log_path is not None:
        log_path.unlink(missing_ok=True)  # nothing to read later


def _exit_text(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


def with_native_line(what: str, log: Path | None) -> str:
    """A crash message: what ended, then llama.cpp's last line (if the log has one) and the log's path."""
    line = last_native_line(log)
    return what + (f"; llama.cpp's last line: {line}" if line else "") + f" (log: {log})."


def last_native_line(log: Path | None) -> str:
    """The line of the log that says why the process died: the last GGML_ASSERT or error line, else the last one."""
    if log is None or not log.is_file():
        return ""
    with log.open("rb") as f:
        f.seek(max(0, log.stat().st_size - TAIL_BYTES))
        lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    for marks in (("GGML_ASSERT", "GGML_ABORT"), ("error", "Error", "failed", "terminate")):
        hits = [ln for ln in lines if any(m in ln for m in marks)]
        if hits:
            return _cut(hits[-1])
    return _cut(lines[-1]) if lines else ""


def _cut(line: str) -> str:
    return line if len(line) <= LINE_MAX else line[:LINE_MAX] + "…"
