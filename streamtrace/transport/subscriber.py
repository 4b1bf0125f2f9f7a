"""Subscribers to the engine's PUB socket: predictions, errors, stats, and the weights.

``WeightsSubscriber`` rebuilds the engine's current weights exactly: it subscribes first,
asks the engine for a snapshot over request/reply, then applies every update whose base is
the version it holds (an update carries full values of the parameters that changed). A missed
update is noticed by its base version and triggers a new snapshot.
"""
from __future__ import annotations

import numpy as np
import zmq


from .client import SensorClient, decode_reply

__all__ = ["Subscriber", "WeightsSubscriber"]


class Subscriber:
    def __init__(self, endpoint: str = "tcp://127.0.0.1:5557", topics=(b"",), *, ctx: zmq.Context | None = None):
        self.ctx = ctx or zmq.Context.instance()
        self.sock = self.ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.RCVHWM, 0)
        for t in topics:
            self.sock.setsockopt(zmq.SUBSCRIBE, t if isinstance(t, bytes) else t.encode())
        self.sock.connect(endpoint)

    def recv(self, timeout_s: float = 5.0):
        """(topic, decoded message) or None on timeout."""
        if not self.sock.poll(int(timeout_s * 1000)):
            return None
        topic, raw = self.sock.recv_multipart()
        return topic, decode_reply(raw)

    def close(self):
        self.sock.close(0)


class WeightsSubscriber:
    """The engine's current weights, kept exactly: a snapshot over request/reply, then each
    published update whose base is the version held (a gap: a new snapshot).

    Parameters: ``pub_endpoint`` the engine's PUB socket; ``router_endpoint`` its ROUTER (for
    snapshots); ``ctx`` a ZeroMQ context to share. After ``poll``: ``version``, ``params`` and
    ``state`` (name -> array, a row per entry of ``slots``, the engine's slots serving a
    stream; shared weights have no row axis) and ``streams`` (stream -> its row).

    >>> ws = WeightsSubscriber("ipc:///tmp/doc-pub", "ipc:///tmp/doc-router")
    >>> ws.apply({"kind": "snapshot", "version": 3, "params": {"w": np.zeros((1, 2))}, "state": {},
    ...           "slots": [5], "streams": {"a": 0}}), ws.slots, ws.streams
    (True, [5], {'a': 0})
    >>> ws.apply({"kind": "update", "version": 5, "base": 4, "params": {}, "state": {}})  # 4 was missed
    False
    >>> ws.close()
    """

    def __init__(self, pub_endpoint: str = "tcp://127.0.0.1:5557",
                 router_endpoint: str = "tcp://127.0.0.1:5555", *, ctx: zmq.Context | None = None):
        self.sub = Subscriber(pub_endpoint, (b"weights",), ctx=ctx)
        self.req = SensorClient(router_endpoint, stream="weights-subscriber", ctx=ctx)
        self.version: int | None = None
        self.params: dict[str, np.ndarray] = {}
        self.state: dict[str, np.ndarray] = {}       # the rest of what predicts (readout, normaliser, experts)
        self.slots: list[int] = []                   # the engine's slots the arrays' rows are
        self.streams: dict[str, int] = {}            # each stream's row in the arrays
        self.snapshots = 0

    def _take(self, msg: dict, whole: bool):
        if whole:
            self.params, self.state = {}, {}
        for part in ("params", "state"):
            getattr(self, part).update({n: np.array(v) for n, v in msg.get(part, {}).items()})
        self.slots, self.streams = list(msg.get("slots", [])), dict(msg.get("streams", {}))
        self.version = msg["version"]

    def snapshot(self):
        self._take(self.req.get_weights(), whole=True)
        self.snapshots += 1

    def apply(self, msg: dict) -> bool:
        """Apply one 'weights' message; False when it could not be applied (a gap)."""
        if msg["kind"] == "snapshot":
            self._take(msg, whole=True)
            return True
        if self.version is None or msg["version"] <= self.version:
            return True          # older than what we hold: nothing to do
        if msg["base"] != self.version:
            return False
        self._take(msg, whole=False)
        return True

    def poll(self, timeout_s: float = 1.0) -> bool:
        """Wait for and apply one published update; True if one arrived."""
        if self.version is None:
            self.snapshot()
        got = self.sub.recv(timeout_s)
        if got is None:
            return False
        if not self.apply(got[1]):
            self.snapshot()
        return True

    def close(self):
        self.sub.close()
        self.req.close()
