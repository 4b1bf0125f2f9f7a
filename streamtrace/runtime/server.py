"""``streamtrace-runner``: an exported learner served over ``serve``'s wire protocol, without jax.

The ZeroMQ shell around ``RunnerCore``: a ROUTER socket (request/reply), optionally PULL
(fire and forget) and PUB (predictions, errors, weights, stats), loopback by default, CURVE when
a server key is given. Checkpoints (``serve``'s format) every ``checkpoint_every`` steps and on
SIGTERM / SIGINT; on start it resumes from the newest good one in its folder, ``serve``'s too.
"""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass

import zmq

from .core import RunnerCore
from .receive import recv_message
from .sockets import Curve, bind

__all__ = ["RunnerSettings", "RunnerServer"]


@dataclass
class RunnerSettings:
    """Where the runner listens and what it keeps (the same meanings as the serve config's keys).

    Parameters
    ----------
    router, pull, pub : str
        ``[sockets]``: ZeroMQ addresses ("" turns PULL or PUB off).
    hwm : int
        Every socket's queue bound.
    max_message_bytes : int
        ``engine.max_message_bytes``.
    checkpoint_dir : str
        ``[checkpoint] dir`` ("" for none); ``checkpoint_every``, ``keep`` as there.
    stats_every_s : float
        ``publish.stats_every_s``; ``weights_every``: ``publish.weights_every`` (0: never).
    curve_secret_key_file, curve_authorized_dir, allow_any_client
        ``[security]``.
    """
    router: str = "tcp://127.0.0.1:5555"
    pull: str = ""
    pub: str = ""
    hwm: int = 10000
    max_message_bytes: int = 1 << 20
    checkpoint_dir: str = ""
    checkpoint_every: int = 1000
    keep: int = 3
    stats_every_s: float = 1.0
    weights_every: int = 100
    curve_secret_key_file: str = ""
    curve_authorized_dir: str = ""
    allow_any_client: bool = False


class RunnerServer:
    """Serves ``runner`` (a ``Runner``) with ``settings`` until SIGTERM / SIGINT or ``stop()``."""

    def __init__(self, runner, settings: RunnerSettings | None = None):
        self.settings = s = settings or RunnerSettings()
        self.core = RunnerCore(runner, max_message_bytes=s.max_message_bytes, publish_predictions=bool(s.pub),
                               checkpoint_dir=s.checkpoint_dir, checkpoint_every=s.checkpoint_every, keep=s.keep,
                               weights_every=s.weights_every if s.pub else 0)
        self.resumed = self.core.resume()
        self.ctx = zmq.Context()
        self.curve = Curve(s.curve_secret_key_file, s.curve_authorized_dir, s.allow_any_client) \
            if s.curve_secret_key_file else None
        sock = lambda kind, addr: bind(self.ctx, kind, addr, hwm=s.hwm,  # noqa: E731
                                       max_message_bytes=s.max_message_bytes, curve=self.curve)
        self.router = sock(zmq.ROUTER, s.router)
        self.pull = sock(zmq.PULL, s.pull) if s.pull else None
        self.pub = sock(zmq.PUB, s.pub) if s.pub else None
        self._stop = False

    @property
    def endpoints(self) -> dict:
        return {name: sock.getsockopt(zmq.LAST_ENDPOINT).decode()
                for name, sock in (("router", self.router), ("pull", self.pull), ("pub", self.pub)) if sock}

    def stop(self, *_):
        self._stop = True

    def _send(self, outs):
        for kind, dest, raw in outs:
            try:
                if kind == "reply":
                    self.router.send_multipart([dest, raw], zmq.NOBLOCK)
                elif self.pub is not None:
                    self.pub.send_multipart([dest, raw], zmq.NOBLOCK)
            except zmq.Again:       # a full peer queue: dropped, never blocking the loop
                self.core.counters["dropped"] += 1

    def _drain(self, sock, routed: bool):
        while True:
            try:
                got = recv_message(sock, routed=routed, max_bytes=self.settings.max_message_bytes)
            except zmq.Again:
                return
            origin = got.identity if routed else None
            if got.error is not None:
                self.core.counters["received"] += 1
                self._send(self.core.refuse(origin, *got.error))
            else:
                self._send(self.core.handle(got.payload, origin))

    def run(self):
        """Serve until stopped; then a final checkpoint, and the sockets closed."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.stop)
        poller = zmq.Poller()
        for sock in (self.router, self.pull):
            if sock is not None:
                poller.register(sock, zmq.POLLIN)
        next_stats = time.monotonic() + self.settings.stats_every_s
        try:
            while not self._stop:
                ready = dict(poller.poll(100))
                if self.router in ready:
                    self._drain(self.router, True)
                if self.pull is not None and self.pull in ready:
                    self._drain(self.pull, False)
                if self.pub is not None and time.monotonic() >= next_stats:
                    next_stats = time.monotonic() + self.settings.stats_every_s
                    self._send([("pub", b"stats", self.core.stats_message())])
        finally:
            self.core.save_checkpoint()
            self.close()

    def close(self):
        for sock in (self.router, self.pull, self.pub):
            if sock is not None:
                sock.close(0)
        if self.curve is not None:
            self.curve.stop()
        self.ctx.term()
