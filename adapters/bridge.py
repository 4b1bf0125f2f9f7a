"""What every bus bridge (``streamtrace bridge lsl|mqtt``) shares: its settings from the
serve TOML, the engine endpoint, its counters and the summary it prints.

A bridge is a process of its own between a sensor bus and the engine: samples from the bus
go to the engine through an :class:`~streamtrace.adapters.link.EngineLink`, predictions go
back onto the bus. A bad payload on the bus is counted by its reason and dropped before it
reaches the engine; it never stops the bridge.
"""
from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = ["BridgeStats", "BridgeThread", "NatsTarget", "load_bridge_config", "apply_flags", "engine_endpoint",
           "engine_target", "open_link", "stream_problem", "stop_event"]

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"


def load_bridge_config(path, bus: str, settings):
    """``settings`` (a dataclass instance of the bridge's defaults) filled from ``[bridge.<bus>]``
    of the TOML at ``path`` (nothing when ``path`` is None); unknown keys and wrong types are a
    ``ConfigError`` naming the key. Returns ``(settings, router endpoint of [sockets] or None)``."""
    from streamtrace.engine.config import fill_section, read_toml
    if not path:
        return settings, None
    data = read_toml(path)
    bridge = data.get("bridge", {})
    if not isinstance(bridge, dict):
        from streamtrace.engine.config import ConfigError
        raise ConfigError("bridge", f"must be a table ([bridge.{bus}]); got {bridge!r}")
    fill_section(settings, bridge.get(bus, {}), f"bridge.{bus}.")
    router = data.get("sockets", {}).get("router") if isinstance(data.get("sockets"), dict) else None
    return settings, router


def apply_flags(settings, args, names):
    """Each of the ``names`` given as a flag (not None on ``args``) overrides that setting."""
    for name in names:
        value = getattr(args, name, None)
        if value is not None:
            setattr(settings, name, value)
    return settings


def engine_endpoint(flag: str | None, from_config: str | None) -> str:
    """The flag wins, then the config's ``sockets.router``, then the default. A bound address
    (``tcp://*:5555``, ``tcp://0.0.0.0:5555``) is turned into one to connect to."""
    ep = flag or from_config or DEFAULT_ENDPOINT
    for wildcard in ("tcp://*:", "tcp://0.0.0.0:"):
        if ep.startswith(wildcard):
            ep = "tcp://127.0.0.1:" + ep[len(wildcard):]
    return ep


@dataclass
class NatsTarget:
    """A cluster reached through NATS (``--nats URL``), where a bridge's target is otherwise an
    engine's ZeroMQ router (a string). Credentials: a ``streamtrace.cluster.Credentials``."""
    url: str
    creds: object = None

    def __str__(self):
        from streamtrace.cluster.jetstream import redact
        return f"cluster {redact(self.url)}"


NATS_SCHEMES = ("nats://", "tls://", "ws://", "wss://")


def engine_target(args, from_config: str | None):
    """``--nats URL`` (a :class:`NatsTarget` with the NATS credential flags), else the engine
    endpoint as :func:`engine_endpoint` picks it. Mixing the two, or NATS credentials without
    ``--nats``, is refused (``ConfigError`` naming the flag): either would silently be ignored."""
    from streamtrace.cluster.cli import credentials, stray_credential
    from streamtrace.engine.config import ConfigError
    url = getattr(args, "nats", None)
    stray = stray_credential(args)
    if stray:
        raise ConfigError(stray, "a NATS credential or TLS option needs --nats URL (without it the bridge talks to "
                          "one engine over ZeroMQ)")
    if url is None:
        return engine_endpoint(getattr(args, "endpoint", None), from_config)
    if getattr(args, "endpoint", None):
        raise ConfigError("--nats", "choose one of --nats (a cluster) and --endpoint (one engine)")
    if not url.startswith(NATS_SCHEMES):
        raise ConfigError("--nats", f"{url!r} is not a NATS URL: nats://host:port (or tls://, ws://, wss://)")
    return NatsTarget(url, credentials(args))


def open_link(target, ctx=None):
    """The bridge's link: an ``EngineLink`` to an engine's router, or a ``ClusterLink`` through
    NATS (streamtrace[cluster], imported only then). The NATS one connects at once and raises
    ``ConnectionError`` saying why when it cannot."""
    if isinstance(target, NatsTarget):
        from .cluster_link import ClusterLink
        return ClusterLink(target.url, creds=target.creds)
    from .link import EngineLink
    return EngineLink(target, ctx=ctx)


def stream_problem(target, sid: str) -> str | None:
    """Why ``sid`` cannot be a stream id of ``target`` (None when it can): the engine takes 1..128
    printable characters; a cluster also needs one NATS subject token (no '.', '*', '>', spaces)."""
    from streamtrace.wire import MAX_STREAM_ID
    if not (0 < len(sid) <= MAX_STREAM_ID and sid.isprintable()):
        return f"not 1..{MAX_STREAM_ID} printable characters"
    if isinstance(target, NatsTarget):
        from streamtrace.cluster.jetstream import check_stream_id
        try:
            check_stream_id(sid)
        except ValueError as e:
            return str(e)
    return None


@dataclass
class BridgeStats:
    """Counters of one bridge run; ``bad`` and ``refused`` are keyed by reason / engine code."""
    received: int = 0            # samples taken off the bus
    forwarded: int = 0           # sent to the engine
    answered: int = 0            # predictions back from the engine
    published: int = 0           # predictions put on the bus
    not_sent: int = 0            # good samples the engine could not take (gone or stalled: its queue is full)
    bad: Counter = field(default_factory=Counter)       # bus payloads dropped, by reason
    refused: Counter = field(default_factory=Counter)   # engine refusals, by code
    rtt_s: list = field(default_factory=list)           # engine round trips (bounded sample)
    started: float = field(default_factory=time.monotonic)

    MAX_RTT = 100_000

    def bad_payload(self, reason: str):
        self.bad[reason] += 1

    def answer(self, answer):
        if answer.error is not None:
            self.refused[answer.error] += 1
            return
        self.answered += 1
        if answer.rtt_s is not None and len(self.rtt_s) < self.MAX_RTT:
            self.rtt_s.append(answer.rtt_s)

    def summary(self) -> dict:
        d = asdict(self)
        d.pop("rtt_s"), d.pop("started")
        d["bad"], d["refused"] = dict(self.bad), dict(self.refused)
        d["seconds"] = round(time.monotonic() - self.started, 3)
        if self.rtt_s:
            r = np.asarray(self.rtt_s) * 1e6
            d["engine_rtt_us"] = {"p50": round(float(np.median(r)), 1), "p99": round(float(np.percentile(r, 99)), 1)}
        return d

    def print(self, bus: str, file=sys.stderr):
        s = self.summary()
        bad = ", ".join(f"{k} {v}" for k, v in sorted(s["bad"].items())) or "none"
        refused = ", ".join(f"{k} {v}" for k, v in sorted(s["refused"].items())) or "none"
        rtt = s.get("engine_rtt_us")
        print(f"{bus} bridge: {s['received']} samples received, {s['forwarded']} forwarded, {s['answered']} "
              f"answered, {s['published']} predictions published in {s['seconds']:.1f} s; "
              + (f"{s['not_sent']} not sent (engine not taking messages); " if s["not_sent"] else "")
              + f"bad payloads: {bad}; "
              f"engine refusals: {refused}" + (f"; engine round trip p50 {rtt['p50']} us, p99 {rtt['p99']} us"
                                               if rtt else ""), file=file)

    def json(self) -> str:
        return json.dumps(self.summary())


def stop_event() -> threading.Event:
    """Set on SIGTERM / SIGINT (main thread only), so a bridge loop ends cleanly and prints its
    summary."""
    ev = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: ev.set())
    return ev


class BridgeThread:
    """``start()`` / ``stop()`` for a bridge whose ``run(stop_event)`` is the bridge: it runs in a
    daemon thread; ``stop`` sets the event, joins, re-raises what ended the thread, and returns
    ``self.result()``. A bridge sets ``_stop`` (an Event), ``_thread`` and ``_error`` (None) in
    its ``__init__``."""
    thread_name = "bridge"

    def start(self):
        def target():
            try:
                self.run(self._stop)
            except BaseException as e:  # noqa: BLE001 - handed to stop()
                self._error = e
                self.failed()
        self._thread = threading.Thread(target=target, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0):
        """Stop the thread started by ``start``; re-raises what ended it, if anything did."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._error is not None:
            raise self._error
        return self.result()

    def failed(self):
        """Called in the thread when ``run`` raised (before ``stop`` re-raises it)."""

    def result(self):
        return self.summary()
