"""The MQTT bridge (``streamtrace bridge mqtt``): sensor samples from MQTT topics to the engine,
predictions back onto MQTT.

A device publishes each sample on a topic of the subscribed pattern (default
``sensors/+/data``); the level a wildcard matched (``+``) is the stream id. Each prediction goes
to the mirrored topic (default ``sensors/<id>/pred``) as JSON (or msgpack) with the stream, its
sequence number, the sample's timestamp, the engine's step and weights version. With a weights
topic, the engine's weights version is published (retained) whenever it changes.

One thread: :meth:`MqttBridge.run` polls paho's socket and the engine's in one ``zmq.Poller``
and drives paho itself (``loop_read`` / ``loop_write`` / ``loop_misc``), so a sample goes from
the broker to the engine and its prediction back without a hand-over between threads (paho's
own network thread cost two such hand-offs per sample, each a cross-thread wake-up).

Broker restarts: the loop reconnects with a delay doubling from ``reconnect_min_s`` to
``reconnect_max_s``, and every connection subscribes again; the engine link is untouched, so the
engine keeps each stream's state and numbering.
"""
from __future__ import annotations

import json
import math
import string
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import zmq

from streamtrace import wire

from .bridge import (DEFAULT_ENDPOINT, BridgeStats, BridgeThread, apply_flags, engine_target, load_bridge_config,
                     open_link, stop_event, stream_problem)
from .link import EngineLink
from .payload import BadPayload, decode_sample
from .stream_units import conform, declared_stream

__all__ = ["MqttSettings", "MqttBridge", "add_arguments", "run_cli"]

ENGINE_SILENT_S = 5.0


@dataclass
class MqttSettings:
    """``[bridge.mqtt]`` of the serve TOML; every flag of ``streamtrace bridge mqtt`` overrides one."""
    host: str = "127.0.0.1"
    port: int = 1883
    topic: str = "sensors/+/data"        # subscription pattern of the devices' samples
    pred_topic: str = "sensors/{id}/pred"  # where a stream's predictions go; {id}: its stream id
    weights_topic: str = ""              # the engine's weights version, retained ("": off)
    qos: int = 0                         # for subscribing and publishing: 0, 1 or 2
    stream_level: int = -1               # topic level (0-based) that is the stream id; -1: the
                                         # levels the wildcards matched (joined by "/")
    format: str = "json"                 # predictions as "json" or "msgpack" (the wire format)
    client_id: str = ""                  # "": paho picks one
    keepalive: int = 30                  # seconds
    max_payload: int = 65536             # bytes; larger payloads are dropped as too_large
    reconnect_min_s: float = 0.5         # reconnect delay after losing the broker, doubled on
    reconnect_max_s: float = 30.0        # every failed try up to the maximum
    drain_s: float = 1.0                 # at stop, how long answers still in flight are awaited
    units: list = field(default_factory=list)   # the devices' channel units ("mV", ...; []: those of
                                         # the config's [stream]): samples are converted into [stream] units

    def validate(self) -> MqttSettings:
        from streamtrace.engine.config import ConfigError

        def bad(key, problem):
            raise ConfigError(f"bridge.mqtt.{key}", problem)
        if self.qos not in (0, 1, 2):
            bad("qos", f"{self.qos!r}: choose 0, 1 or 2")
        if not 0 < self.port < 65536:
            bad("port", f"{self.port!r} is not a TCP port")
        levels = self.topic.split("/")
        if not self.topic or any(("+" in lv and lv != "+") or ("#" in lv and lv != "#") for lv in levels) \
                or "#" in levels[:-1]:
            bad("topic", f"{self.topic!r} is not an MQTT subscription pattern ('+' and '#' stand for whole "
                         "levels, '#' only last)")
        if not -1 <= self.stream_level < (len(levels) if "#" not in levels else 1 << 16):
            bad("stream_level", f"{self.stream_level}: the topic {self.topic!r} has {len(levels)} levels "
                                "(-1: the wildcard levels)")
        if self.stream_level == -1 and not ({"+", "#"} & set(levels)):
            bad("topic", f"{self.topic!r} has no wildcard level to name streams by: use '+', or set stream_level")
        fields = {f for _, f, _, _ in string.Formatter().parse(self.pred_topic) if f is not None}
        if fields != {"id"}:
            bad("pred_topic", f"{self.pred_topic!r} must name the stream once as {{id}} (e.g. sensors/{{id}}/pred)")
        for key, example in (("pred_topic", self.pred_topic.format(id="x")), ("weights_topic", self.weights_topic)):
            if not example:
                continue
            if "+" in example or "#" in example:
                bad(key, f"{example!r}: a topic to publish on cannot hold the wildcards '+' or '#'")
            if topic_matches(self.topic, example):
                bad(key, f"{example!r} matches the subscription {self.topic!r}: the bridge would feed its own "
                         "output back to the engine")
        if self.format not in ("json", "msgpack"):
            bad("format", f"{self.format!r}: choose 'json' or 'msgpack'")
        for key in ("keepalive", "max_payload"):
            if getattr(self, key) <= 0:
                bad(key, "must be positive")
        if not 0 < self.reconnect_min_s <= self.reconnect_max_s:
            bad("reconnect_min_s", "need 0 < reconnect_min_s <= reconnect_max_s")
        if self.drain_s < 0:
            bad("drain_s", "must be >= 0")
        from streamtrace.units import UnitError, parse_unit
        for i, unit in enumerate(self.units):
            try:
                if not isinstance(unit, str):
                    bad("units", f"must be a list of unit names (\"\": none); got {unit!r}")
                if unit:
                    parse_unit(unit, key=f"bridge.mqtt.units[{i}]")
            except UnitError as e:
                raise ConfigError(e.key, e.problem) from None
        return self


def topic_matches(pattern: str, topic: str) -> bool:
    """Whether an MQTT subscription ``pattern`` ('+': one level, '#': the rest) covers ``topic``."""
    p, t = pattern.split("/"), topic.split("/")
    for i, level in enumerate(p):
        if level == "#":
            return True
        if i >= len(t) or (level != "+" and level != t[i]):
            return False
    return len(p) == len(t)


class MqttBridge(BridgeThread):
    """Samples from ``settings.topic`` to the engine at ``endpoint``, predictions back on MQTT.
    ``endpoint`` may be a :class:`~streamtrace.adapters.bridge.NatsTarget`: a cluster through NATS.

    ``run(stop)`` is the bridge (it returns when ``stop`` is set); ``start()`` / ``stop()`` run it
    in a thread. ``stats`` counts samples and bad payloads; ``counts`` the broker connection
    (connects, disconnects) and publishing."""

    def __init__(self, settings: MqttSettings | None = None, endpoint=DEFAULT_ENDPOINT, *,
                 ctx: zmq.Context | None = None, log=sys.stderr, declared=None):
        self.settings = (settings or MqttSettings()).validate()
        self.units = _conversion(self.settings, declared)   # the devices' units into [stream]'s
        self.endpoint = endpoint
        self.ctx = ctx or zmq.Context.instance()
        self.log = log
        self.stats = BridgeStats()
        self.counts: Counter = Counter()        # engine and publishing: engine_silent, weights_published, ...
        self.net: Counter = Counter()           # the broker connection: connects, disconnects, ...
        self.connected = threading.Event()
        self.link: EngineLink | None = None
        self._closing = False
        self._up = False                        # a connection the broker accepted (CONNACK) is open
        self._version = None
        self._last_sent, self._unanswered_since, self._said_silent = 0.0, None, False
        self.engine_silent_s = ENGINE_SILENT_S
        self._level = self.settings.stream_level
        self._pattern = self.settings.topic.split("/")
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._error: BaseException | None = None

    # ---- running (BridgeThread's start / stop; stop returns the summary) ---------------------
    thread_name = "mqtt-bridge"

    def run(self, stop: threading.Event | None = None) -> BridgeStats:
        try:
            import paho.mqtt.client as mqtt
        except ImportError:
            raise SystemExit("the MQTT bridge needs paho-mqtt: pip install 'streamtrace[mqtt]'") from None
        stop = stop or threading.Event()
        s = self.settings
        self.link = link = open_link(self.endpoint, self.ctx)
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=s.client_id or "",
                             protocol=mqtt.MQTTv311)
        client.max_queued_messages_set(10000)     # bounded while the broker is away (QoS 1/2)
        client.on_connect, client.on_disconnect = self._on_connect, self._on_disconnect
        client.on_message, client.on_subscribe = self._on_message, self._on_subscribe
        self._client, self._mqtt = client, mqtt
        units = (f" (units {', '.join(u or '-' for u in self.units.source_units)} converted into "
                 f"{', '.join(u or '-' for u in self.units.units)})" if self.units.factors is not None else "")
        self._say(f"mqtt bridge: broker {s.host}:{s.port}, samples from {s.topic}{units}, predictions to "
                  f"{s.pred_topic}, engine {self.endpoint}")
        poller = zmq.Poller()
        poller.register(link.sock, zmq.POLLIN)
        sock, next_try, delay, tried = None, 0.0, s.reconnect_min_s, False
        try:
            while not stop.is_set():
                now = time.monotonic()
                if client.socket() is None and now >= next_try:
                    try:
                        client.reconnect() if tried else client.connect(s.host, s.port, s.keepalive)
                        delay = s.reconnect_min_s
                    except (OSError, ValueError) as e:      # refused, unreachable, bad address
                        self._connect_failed(e)
                        next_try, delay = now + delay, min(2 * delay, s.reconnect_max_s)
                    tried = True
                current = client.socket()
                if current is not sock:                     # a new connection (or none)
                    if sock is not None:
                        poller.unregister(sock)
                    sock = current
                    if sock is not None:
                        poller.register(sock, zmq.POLLIN)
                if sock is not None:
                    poller.modify(sock, zmq.POLLIN | (zmq.POLLOUT if client.want_write() else 0))
                ready = dict(poller.poll(100 if sock is not None else 50))
                events = ready.get(sock.fileno(), 0) if sock is not None else 0   # plain sockets: by fd
                if events & zmq.POLLIN:
                    client.loop_read(100)                   # calls _on_message per sample
                if events & zmq.POLLOUT and client.socket() is not None:
                    client.loop_write()
                if link.sock in ready:
                    for a in link.poll(0):
                        self._answer(a)
                if client.socket() is not None:
                    client.loop_misc()                      # keepalive pings, timeouts
                self._check_engine()
            end = time.monotonic() + s.drain_s     # answers to samples already sent
            while link.in_flight and time.monotonic() < end:
                for a in link.poll(0.05):
                    self._answer(a)
                if client.socket() is not None and client.want_write():
                    client.loop_write()
        finally:
            self._closing = True
            if client.socket() is not None:
                client.disconnect()
                if client.socket() is not None and client.want_write():
                    client.loop_write()
            link.close()
        return self.stats

    # ---- paho's callbacks (called by loop_read / loop_write in the bridge thread) ----------
    def _on_connect(self, client, userdata, flags, reason_code, properties=None):
        if reason_code.is_failure:
            self.net["refused_by_broker"] += 1
            self._say(f"mqtt bridge: the broker refused the connection: {reason_code}")
            return
        self.net["connects"] += 1
        self._up = True
        # a clean session forgets subscriptions: subscribe on every (re)connection
        client.subscribe(self.settings.topic, qos=self.settings.qos)
        self._say(f"mqtt bridge: connected to {self.settings.host}:{self.settings.port}"
                  + (f" (reconnect {self.net['connects'] - 1})" if self.net["connects"] > 1 else ""))

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties=None):
        if any(rc.is_failure for rc in reason_codes):
            self.net["subscribe_refused"] += 1
            self._say(f"mqtt bridge: the broker refused the subscription to {self.settings.topic}: {reason_codes}")
            return
        self.net["subscribed"] += 1
        self.connected.set()            # ready: samples published from now on reach the bridge

    def _connect_failed(self, error):
        self.net["connect_failures"] += 1
        if self.net["connect_failures"] == 1:          # retried with backoff; say it once
            self._say(f"mqtt bridge: cannot reach the broker at {self.settings.host}:{self.settings.port} "
                      f"({error}); retrying")

    def _on_disconnect(self, client, userdata, flags, reason_code, properties=None):
        self.connected.clear()
        up, self._up = self._up, False
        if self._closing:
            return
        if not up:     # lost before the broker accepted it (a reconnect that reached a dying
            self._connect_failed(reason_code)      # broker's socket): a failed connect, not a lost one
            return
        self.net["disconnects"] += 1
        self._say(f"mqtt bridge: lost the broker ({reason_code}); reconnecting")

    def _on_message(self, client, userdata, msg):
        try:
            topic = msg.topic
        except UnicodeDecodeError:
            topic = ""
        try:
            self._ingest(topic, msg.payload)
        except Exception:  # noqa: BLE001 - a bug here must not end the bridge: count, say once
            self.stats.bad_payload("internal")
            if self.stats.bad["internal"] == 1:
                import traceback
                self._say("mqtt bridge: internal error on one payload (dropped, counted as 'internal'):\n"
                          + traceback.format_exc())

    def _ingest(self, topic: str, payload: bytes):
        self.stats.received += 1
        stream = self.stream_id(topic)
        if stream is None:
            self.stats.bad_payload("bad_topic")
            return
        try:
            sample = decode_sample(payload, self.settings.max_payload)
            if self.units.factors is not None and sample.x.size != self.units.factors.size:
                self.stats.bad_payload("channels")      # not the channels bridge.mqtt.units names
                return
            seq = self.link.send(stream, self.units.apply(sample.x),
                                 ts=time.time() if sample.ts is None else sample.ts, y=sample.y,
                                 mode=sample.mode)
        except BadPayload as e:
            self.stats.bad_payload(e.reason)
            return
        except ValueError:          # the link's own finiteness check (y beyond float range)
            self.stats.bad_payload("non_finite")
            return
        if seq is None:             # the engine is not taking messages (gone or stalled)
            self.stats.not_sent += 1
            return
        self.stats.forwarded += 1
        self._last_sent = time.monotonic()
        if self._unanswered_since is None:
            self._unanswered_since = self._last_sent

    def _check_engine(self):
        """Say once when samples have gone unanswered for ``engine_silent_s`` while more kept coming
        (the engine is down, or elsewhere); quiet again after the next answer."""
        since = self._unanswered_since
        if since is not None and self._last_sent - since > self.engine_silent_s and not self._said_silent:
            self._said_silent = True
            self.counts["engine_silent"] += 1
            self._say(f"mqtt bridge: no answer from the engine at {self.endpoint} for {self.engine_silent_s:g} s "
                      f"({self.link.in_flight} samples waiting): is it running there?")

    def stream_id(self, topic: str) -> str | None:
        """The stream a topic's samples belong to, or None when it names none the engine takes."""
        levels = topic.split("/")
        if self._level >= 0:
            sid = levels[self._level] if self._level < len(levels) else ""
        else:
            parts = []
            for i, p in enumerate(self._pattern):
                if p == "#":
                    parts.append("/".join(levels[i:]))
                    break
                if p == "+" and i < len(levels):
                    parts.append(levels[i])
            sid = "/".join(parts)
        ok = stream_problem(self.endpoint, sid) is None and "+" not in sid and "#" not in sid
        return sid if ok else None

    def _answer(self, a):
        self._unanswered_since, self._said_silent = None, False
        self.stats.answer(a)
        if a.error is not None:
            return
        r = a.reply
        msg = {"stream": a.stream, "seq": a.seq, "ts": a.ts, "step": r.get("step"), "version": r.get("version"),
               "loss": r.get("loss")}
        if self.settings.format == "json":
            msg["pred"] = [v if math.isfinite(v) else None for v in np.asarray(a.pred, np.float64).ravel().tolist()]
            payload = json.dumps(msg)
        else:
            payload = wire.encode({"type": "prediction", **msg, "pred": wire.pack_array(a.pred)})
        if self._publish(self.settings.pred_topic.format(id=a.stream), payload):
            self.stats.published += 1
        version = r.get("version")
        if self.settings.weights_topic and version is not None and version != self._version:
            self._version = version
            notice = json.dumps({"version": version, "step": r.get("step"), "ts": time.time()})
            if self._publish(self.settings.weights_topic, notice, retain=True):
                self.counts["weights_published"] += 1

    def _publish(self, topic: str, payload, retain: bool = False) -> bool:
        try:
            info = self._client.publish(topic, payload, qos=self.settings.qos, retain=retain)
        except (ValueError, RuntimeError) as e:     # paho refuses the topic or payload
            self.counts[f"publish_failed:{type(e).__name__}"] += 1
            return False
        if info.rc != self._mqtt.MQTT_ERR_SUCCESS:
            # QoS 0 while the broker is away: dropped; QoS 1/2: queued by paho (bounded)
            self.counts[f"publish_failed:{self._mqtt.error_string(info.rc)}"] += 1
            return False
        return True

    def summary(self) -> dict:
        s = self.stats.summary()
        s["mqtt"] = {**self.net, **self.counts}
        if self.link is not None:
            s["link"] = dict(self.link.counts)
        return s

    def _say(self, text: str):
        if self.log is not None:
            print(text, file=self.log, flush=True)


def _conversion(settings: MqttSettings, declared):
    """The devices' units (``settings.units``) into the declared ``[stream]`` units; a
    ``ConfigError`` naming ``bridge.mqtt.units`` when they cannot be converted."""
    from streamtrace.engine.config import ConfigError
    from streamtrace.units import UnitError
    try:
        return conform(0.0, settings.units, declared_rate=0.0, declared_units=declared.units if declared else [],
                       what="bridge.mqtt.units")
    except UnitError as e:
        raise ConfigError(e.key, e.problem) from None


def _unit_list(text: str) -> list:
    return [t.strip() for t in text.split(",")]


# ---- the command line ----------------------------------------------------------------------
FLAGS = {  # flag -> (settings field, type, help)
    "--host": ("host", str, "the broker's host (default 127.0.0.1)"),
    "--port": ("port", int, "the broker's port (default 1883)"),
    "--topic": ("topic", str, "subscription pattern of the samples (default sensors/+/data)"),
    "--pred-topic": ("pred_topic", str, "predictions' topic, {id} is the stream (default sensors/{id}/pred)"),
    "--weights-topic": ("weights_topic", str, "publish the engine's weights version here when it changes "
                                              "(retained; default: off)"),
    "--qos": ("qos", int, "MQTT QoS for subscribing and publishing: 0, 1 or 2 (default 0)"),
    "--stream-level": ("stream_level", int, "the topic level (0-based) that names the stream (default: the "
                                            "levels the wildcards match)"),
    "--format": ("format", str, "predictions as json (default) or msgpack"),
    "--client-id": ("client_id", str, "MQTT client id (default: random)"),
    "--max-payload": ("max_payload", int, "bytes; larger payloads are dropped (default 65536)"),
    "--units": ("units", _unit_list, "the devices' channel units, comma-separated (e.g. uV,uV), converted "
                                     "into the config's [stream] units (default: already in them)"),
}


def add_arguments(parser):
    """Flags of ``streamtrace bridge mqtt`` beyond --config and --endpoint."""
    from streamtrace.arguments import nonnegative_int, output_file, port, positive_int
    kinds = {"--port": port, "--stream-level": nonnegative_int, "--max-payload": positive_int}
    for flag, (_, kind, text) in FLAGS.items():
        parser.add_argument(flag, type=kinds.get(flag, kind), default=None, help=text,
                            **({"choices": [0, 1, 2]} if flag == "--qos" else {}))
    parser.add_argument("--stats-json", type=output_file, default=None,
                        help="write the final counters to this file as JSON (default: none)")


def settings_from(args):
    """``[bridge.mqtt]`` of --config, overridden by the flags given; and the engine endpoint
    (or, with --nats, the cluster: a ``NatsTarget``)."""
    settings, router = load_bridge_config(args.config, "mqtt", MqttSettings())
    apply_flags(settings, args, [name for name, _, _ in FLAGS.values()])
    return settings.validate(), engine_target(args, router)


def run_cli(args) -> int:
    from streamtrace.engine.config import ConfigError
    try:
        settings, endpoint = settings_from(args)
        bridge = MqttBridge(settings, endpoint, declared=declared_stream(args.config))
    except ConfigError as e:
        print("config error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    try:
        bridge.run(stop_event())
    except ConnectionError as e:       # a NATS server that refused the bridge or is not there
        print(f"bridge mqtt: {e}", file=sys.stderr)
        return 2
    bridge.stats.print("mqtt")
    m = bridge.summary()["mqtt"]
    print(f"mqtt: {m.get('connects', 0)} connections, {m.get('disconnects', 0)} disconnects"
          + "".join(f", {k} {v}" for k, v in sorted(m.items()) if k not in ("connects", "disconnects")),
          file=sys.stderr)
    if args.stats_json:
        with open(args.stats_json, "w") as fh:
            json.dump(bridge.summary(), fh)
    return 0
