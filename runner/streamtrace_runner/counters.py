"""The counters of ``serve``'s engine and of the jax-free runner's server (one module, so both
stats messages carry the same keys): the latest latencies for percentiles, per-stream loss, and
an optional Prometheus exporter (prometheus-client, served on loopback)."""
from __future__ import annotations

import math
import time
from collections import deque

import numpy as np

__all__ = ["EngineCounters", "percentile"]

_EVENT_COUNTERS = {"outlier": "outliers", "rolled_back": "rolled_back"}    # a reply's flag -> its counter

MAX_TOPICS = 1024     # per-topic drop counts kept by name (streams come and go)


def percentile(ordered: np.ndarray, q: float) -> float:
    """The ``q``-th percentile of the sorted values ``ordered``, interpolated linearly between
    the two nearest ranks (``np.percentile``'s default, which would import ``numpy.ma`` into
    the runner's memory).

    >>> v = np.sort(np.random.default_rng(0).normal(size=101))
    >>> [bool(abs(percentile(v, q) - np.percentile(v, q)) < 1e-12) for q in (0, 50, 90, 99, 100)]
    [True, True, True, True, True]
    """
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(ordered) - 1)
    return float(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))


class EngineCounters:
    """What the engine counts: messages, steps, errors by code, replies and publications dropped,
    the latest latencies (for percentiles), per-stream loss, metrics and events; the `stats`
    message and the Prometheus exporter read it. (Not `st.Metrics`, the learner's rolling scores.)

    >>> c = EngineCounters(); c.count("steps", 3); c.counters["steps"]
    3
    """

    def __init__(self, latency_samples: int = 20000):
        self.counters = {"received": 0, "accepted": 0, "answered": 0, "errors": 0, "dropped": 0,
                         "steps": 0, "updates": 0, "skipped": 0, "lost_on_resync": 0,
                         "checkpoints": 0, "weights_published": 0, "reply_failures": 0,
                         "parked": 0, "unparked": 0, "park_dropped": 0, "pub_dropped": 0, "labels": 0,
                         "labels_refused": 0, "replied_first": 0, "outliers": 0, "rolled_back": 0}
        self.errors_by_code: dict[str, int] = {}
        self.pub_dropped_by_topic: dict[str, int] = {}
        self.latency_us: deque = deque(maxlen=latency_samples)
        self.stream_loss: dict[str, float] = {}
        self.stream_events: dict[str, dict] = {}     # per stream: outliers screened, steps rolled back
        self._t0 = time.monotonic()
        self._last = (self._t0, 0)
        self._prom = None

    def count(self, name: str, n: int = 1):
        self.counters[name] += n
        if self._prom:
            self._prom["counter"].labels(name).inc(n)

    def error(self, code: str):
        self.errors_by_code[code] = self.errors_by_code.get(code, 0) + 1
        self.count("errors")
        if self._prom:
            self._prom["errors"].labels(code).inc()

    def pub_drop(self, topic: bytes):
        """A publication refused because a subscriber's queue was full (no subscriber got it).
        Per topic, so a subscriber can match the gaps it saw; at most MAX_TOPICS topics are
        named, the rest are summed under "other"."""
        name = topic.decode(errors="replace")
        by = self.pub_dropped_by_topic
        if name not in by and len(by) >= MAX_TOPICS:
            name = "other"
        by[name] = by.get(name, 0) + 1
        self.count("pub_dropped")
        self.count("dropped")

    def latency(self, seconds: float):
        self.latency_us.append(seconds * 1e6)
        if self._prom:
            self._prom["latency"].observe(seconds)

    def loss(self, stream: str, value: float, alpha: float = 0.05):
        if math.isfinite(value):     # not NaN (no score), nor an overflow that would stay for good
            old = self.stream_loss.get(stream)
            self.stream_loss[stream] = value if old is None else (1 - alpha) * old + alpha * value

    def events(self, stream: str, events: dict):
        """A step of ``stream`` had an outlier in its input and/or was rolled back (its reply's
        flags): counted in total and per stream (stats, Prometheus, the dashboard)."""
        per = self.stream_events.setdefault(stream, {"outliers": 0, "rolled_back": 0})
        for key in events:
            name = _EVENT_COUNTERS[key]
            per[name] += 1
            self.count(name)
            if self._prom:
                self._prom["stream_events"].labels(stream, name).inc()

    def forget(self, stream: str):
        """A stream left: its per-stream figures go (its Prometheus series stay, as counters do)."""
        self.stream_loss.pop(stream, None)
        self.stream_events.pop(stream, None)

    def quality(self, per_stream: dict):
        """Rolling prequential metrics per stream into Prometheus (gauges of gone streams removed)."""
        if not self._prom:
            return
        g = self._prom["quality"]
        for name in self._prom_streams - set(per_stream):
            for metric in ("mse", "mae", "nrmse"):
                g.remove(name, metric)
        for name, vals in per_stream.items():
            for metric in ("mse", "mae", "nrmse"):
                g.labels(name, metric).set(vals[metric])
        self._prom_streams = set(per_stream)

    def snapshot(self, streams: int, slots_free: int) -> dict:
        now = time.monotonic()
        t_prev, n_prev = self._last
        rate = (self.counters["accepted"] - n_prev) / max(now - t_prev, 1e-9)
        self._last = (now, self.counters["accepted"])
        lat = np.sort(np.asarray(self.latency_us) if self.latency_us else np.zeros(1))
        snap = {"uptime_s": now - self._t0, "steps_per_s": rate, **self.counters,
                "errors_by_code": dict(self.errors_by_code),
                "pub_dropped_by_topic": dict(self.pub_dropped_by_topic),
                "latency_us": {"p50": percentile(lat, 50), "p90": percentile(lat, 90),
                               "p99": percentile(lat, 99), "max": float(lat[-1])},
                "streams": streams, "slots_free": slots_free,
                "stream_loss": {k: float(v) for k, v in self.stream_loss.items()},
                "stream_events": {k: dict(v) for k, v in self.stream_events.items()}}
        if self._prom:
            self._prom["rate"].set(rate)
            self._prom["streams"].set(streams)
        return snap

    def serve_prometheus(self, port: int, addr: str = "127.0.0.1"):
        import prometheus_client as pc
        reg = pc.CollectorRegistry()
        self._prom = {
            "counter": pc.Counter("streamtrace_events", "engine event counts", ["event"], registry=reg),
            "errors": pc.Counter("streamtrace_errors", "rejected messages by error code", ["code"], registry=reg),
            "latency": pc.Histogram("streamtrace_latency_seconds", "ingest to reply",
                                    buckets=(5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2, 0.1, 1.0),
                                    registry=reg),
            "rate": pc.Gauge("streamtrace_steps_per_second", "accepted steps per second", registry=reg),
            "streams": pc.Gauge("streamtrace_streams", "connected streams", registry=reg),
            "stream_events": pc.Counter("streamtrace_stream_events", "per stream: steps whose input held an "
                                        "outlier (outliers), steps undone (rolled_back)", ["stream", "event"],
                                        registry=reg),
            "quality": pc.Gauge("streamtrace_stream_quality", "rolling prequential error per stream "
                                "(user units; time constant metrics.window steps)", ["stream", "metric"],
                                registry=reg),
        }
        self._prom_streams = set()
        for name, v in self.counters.items():
            if v:
                self._prom["counter"].labels(name).inc(v)
        pc.start_http_server(port, addr=addr, registry=reg)
