"""What the dashboard shows, read from the engine's PUB socket on a thread of its own.

The feed subscribes to ``pred/`` (per stream the last ``points`` predictions and the signal
each carries), ``error`` (recent refusals) and ``stats`` (the engine's counters, latency, rolling
NRMSE / MAE per stream). It only reads: nothing here sends to the engine. ZeroMQ reconnects by
itself when the engine restarts; a stats message whose uptime went backwards marks the restart.
``view`` gives the page a decimated copy: at most ``max_points`` points per chosen stream, so
hundreds of streams or long windows never reach the browser whole.
"""
from __future__ import annotations

import threading
import time
from collections import deque

import msgpack
import numpy as np
import zmq

from ..wire import WireError, unpack_array

__all__ = ["Feed", "decimate"]

TOPICS = (b"pred/", b"error", b"stats")
HISTORY = 600          # engine rate / latency points kept (one per stats message)
BATCH_S = 0.05         # the page redraws 10 times a second: reading 20 times a second is enough


class StreamView:
    """One stream's last points: seq, first channel of the prediction and of the signal."""

    __slots__ = ("seq", "pred", "signal", "last_seq", "missed")

    def __init__(self, points: int):
        self.seq, self.pred, self.signal = deque(maxlen=points), deque(maxlen=points), deque(maxlen=points)
        self.last_seq, self.missed = None, 0

    def add(self, seq: int, pred: float, signal: float | None):
        if self.last_seq is not None:
            if seq <= self.last_seq:           # the stream started again (a new sensor, a restart)
                self.seq.clear(), self.pred.clear(), self.signal.clear()
            elif seq > self.last_seq + 1:
                self.missed += seq - self.last_seq - 1   # publications this dashboard never got
        self.last_seq = seq
        self.seq.append(seq)
        self.pred.append(pred)
        self.signal.append(np.nan if signal is None else signal)


def decimate(n: int, max_points: int) -> np.ndarray:
    """Indices of at most max_points of n points, evenly spaced, always keeping the last."""
    if n <= max_points:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, max_points).round().astype(int))


def _first(arr) -> float | None:
    if arr is None:
        return None
    a = unpack_array(arr)
    return float(a.reshape(-1)[0]) if a.size else None


class Feed:
    def __init__(self, endpoint: str, *, points: int = 2000, max_errors: int = 50, ctx: zmq.Context | None = None):
        self.endpoint, self.points = endpoint, points
        self.ctx = ctx or zmq.Context.instance()
        self.lock = threading.Lock()
        self.streams: dict[str, StreamView] = {}
        self.stats: dict = {}
        self.heard_at = 0.0                     # monotonic time of the last publication
        self.restarts = 0
        self.received = 0
        self.bad = 0                            # publications that did not decode
        self.recent_errors: deque = deque(maxlen=max_errors)
        self.history = {k: deque(maxlen=HISTORY) for k in ("t", "steps_per_s", "p50", "p99")}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dashboard-feed", daemon=True)

    def start(self) -> "Feed":
        self._thread.start()
        return self

    def close(self):
        self._stop.set()
        self._thread.join(5)

    # ---- the reading thread -----------------------------------------------------------------
    def _run(self):
        sock = self.ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 0)      # never the reason for a gap: the engine counts those
        sock.setsockopt(zmq.RECONNECT_IVL, 200)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
        for t in TOPICS:
            sock.setsockopt(zmq.SUBSCRIBE, t)
        sock.connect(self.endpoint)
        try:
            while not self._stop.is_set():
                if not sock.poll(100):
                    continue
                batch = []
                while len(batch) < 5000:        # take what waits, then apply it under one lock
                    try:
                        batch.append(sock.recv_multipart(zmq.NOBLOCK))
                    except zmq.Again:
                        break
                with self.lock:
                    for topic, raw in batch:
                        self._take(topic, raw)
                # read in batches: one wake-up per BATCH_S, not one per prediction, so a busy
                # engine's messages cost this process (and the CPUs it shares) little
                self._stop.wait(BATCH_S)
        finally:
            sock.close(0)

    def _take(self, topic: bytes, raw: bytes):
        self.received += 1
        self.heard_at = time.monotonic()
        try:
            msg = msgpack.unpackb(raw, raw=False)
            kind = msg.get("type") if isinstance(msg, dict) else None
            if kind == "prediction":
                view = self.streams.get(msg["stream"])
                if view is None:
                    view = self.streams[msg["stream"]] = StreamView(self.points)
                view.add(int(msg["seq"]), _first(msg["pred"]), _first(msg.get("signal")))
            elif kind == "error":
                self.recent_errors.append({"t": time.time(), **{k: msg.get(k) for k in
                                                                ("code", "message", "stream", "seq")}})
            elif kind == "stats":
                self._take_stats(msg)
        except (WireError, KeyError, TypeError, ValueError, msgpack.ExtraData):
            self.bad += 1

    def _take_stats(self, msg: dict):
        if self.stats and msg.get("uptime_s", 0) < self.stats.get("uptime_s", 0):
            self.restarts += 1                  # a new engine process behind the same address
        self.stats = msg
        lat = msg.get("latency_us", {})
        h = self.history
        h["t"].append(time.time())
        h["steps_per_s"].append(float(msg.get("steps_per_s", 0.0)))
        h["p50"].append(float(lat.get("p50", 0.0)))
        h["p99"].append(float(lat.get("p99", 0.0)))

    # ---- what the page gets -----------------------------------------------------------------
    def names(self, contains: str = "", limit: int = 200) -> dict:
        with self.lock:
            names = sorted(self.streams)
        hits = [n for n in names if contains in n]
        return {"total": len(names), "matched": len(hits), "names": hits[:limit]}

    def view(self, chosen: list[str], max_points: int = 300, stale_s: float = 5.0) -> dict:
        with self.lock:
            s = self.stats
            # (stats wait while the engine compiles between messages: any publication counts)
            age = time.monotonic() - self.heard_at if self.heard_at else None
            engine = {
                "connected": age is not None and age < stale_s,
                "heard_s_ago": age, "restarts": self.restarts,
                "steps_per_s": s.get("steps_per_s"), "latency_us": s.get("latency_us"),
                "pending": s.get("pending"), "streams": s.get("streams"), "slots_free": s.get("slots_free"),
                "parked_streams": s.get("parked_streams"), "version": s.get("version"),
                "updates": s.get("updates"), "steps": s.get("steps"), "errors": s.get("errors"),
                "errors_by_code": s.get("errors_by_code", {}), "dropped": s.get("pub_dropped"),
                "dropped_by_topic": s.get("pub_dropped_by_topic", {}), "mode": s.get("mode"),
                "uptime_s": s.get("uptime_s"),
            }
            metrics = s.get("stream_metrics", {})
            lag = 1 if s.get("mode", "forecast") == "forecast" else 0
            streams = {n: self._series(n, max_points, metrics.get(n), lag) for n in chosen if n in self.streams}
            return {"engine": engine, "streams": streams, "recent_errors": list(self.recent_errors)[-10:],
                    "history": {k: list(v)[-max_points:] for k, v in self.history.items()},
                    "dashboard": {"received": self.received, "bad": self.bad,
                                  "missed": sum(v.missed for v in self.streams.values())},
                    "stream_count": len(self.streams)}

    def _series(self, name: str, max_points: int, metrics: dict | None, lag: int) -> dict:
        """Decimated points; a forecast made at seq t is drawn at t + 1, beside what it forecast."""
        v = self.streams[name]
        seq, pred, sig = (np.asarray(d, float) for d in (v.seq, v.pred, v.signal))
        if lag and len(pred):
            pred = np.concatenate([[np.nan], pred[:-1]])
        idx = decimate(len(seq), max_points)
        seq, pred, sig = seq[idx], pred[idx], sig[idx]
        # JSON has no NaN: a missing signal is null
        return {"seq": seq.astype(int).tolist(), "pred": _nullable(pred), "signal": _nullable(sig),
                "last_seq": v.last_seq, "missed": v.missed, "metrics": metrics or {}}


def _nullable(a: np.ndarray) -> list:
    return [None if x != x else x for x in a.astype(float).tolist()]
