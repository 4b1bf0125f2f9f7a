"""The MQTT bridge (adapters/mqtt.py, `streamtrace bridge mqtt`) against a real broker.

The broker is Debian's mosquitto (or amqtt), started by tests/mqtt_broker.py on a free loopback
port; the engine is a real subprocess on ipc. Oracles: the samples the device sent (order,
sequence numbers, echoed timestamps, the next value a forecast predicts), a SensorClient stream
of the same engine fed the same values by hand (one model per stream: its predictions must be
the bridge stream's, exactly, also across a broker restart), and the payloads' known faults.
"""
from __future__ import annotations

import json
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from engine_helpers import fake_engine, running_engine
from mqtt_broker import Broker, BrokerMissing, free_port
from streamtrace import wire
from streamtrace.transport import SensorClient
from streamtrace.adapters.mqtt import MqttBridge, MqttSettings, settings_from, topic_matches
from streamtrace.adapters.payload import REASONS, BadPayload, decode_sample
from streamtrace.engine.launch import write_config
from streamtrace.engine.config import ConfigError

GRU = {
    "model": {"stack": "gru", "n_in": 1, "n_hidden": 8, "n_out": 1},
    "learning": {"algorithm": "d-rtrl", "mode": "forecast", "optimizer": "adam", "lr": 1e-2},
    "engine": {"slots": 16, "micro_batch": 1, "park_s": 0.0},   # one model per stream (the default)
    "publish": {"weights_every": 50, "stats_every_s": 3600.0, "predictions": False},
    "checkpoint": {"dir": ""},
}


def start_broker(port=None) -> Broker:
    try:
        return Broker(port).start()
    except BrokerMissing as e:          # a failure, not a skip: `make test` installs one
        pytest.fail(str(e))


def wait_for(cond, timeout=15.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class Device:
    """A sensor on the bus: publishes samples, collects what arrives on its subscriptions.
    It reconnects (and subscribes again) after a broker restart, like the bridge."""

    def __init__(self, port: int, subscribe=("sensors/+/pred",), qos: int = 1):
        import paho.mqtt.client as mqtt
        self.inbox: queue.Queue = queue.Queue()
        self.subscribed = threading.Event()
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
        self.c.reconnect_delay_set(0.1, 0.5)

        def on_connect(c, u, f, rc, p=None):
            for t in subscribe:
                c.subscribe(t, qos)
            if not subscribe:
                self.subscribed.set()

        def on_subscribe(c, u, mid, rcs, p=None):
            self.subscribed.set()
        self.c.on_connect, self.c.on_subscribe = on_connect, on_subscribe
        self.c.on_disconnect = lambda *a: self.subscribed.clear()
        self.c.on_message = lambda c, u, m: self.inbox.put((m.topic, m.payload, m.retain))
        self.qos = qos
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        assert self.subscribed.wait(10), "the test device could not connect and subscribe"

    def publish(self, topic: str, payload):
        if not isinstance(payload, (bytes, str)):
            payload = json.dumps(payload)
        self.c.publish(topic, payload, qos=self.qos)

    def take(self, n: int, topic: str | tuple | None = None, timeout: float = 30.0, decode=json.loads) -> list:
        """The next ``n`` messages (on ``topic``, or one of the topics, when given), decoded."""
        out, end = [], time.monotonic() + timeout
        while len(out) < n:
            try:
                t, p, _ = self.inbox.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"got {len(out)} of {n} messages on {topic or 'any topic'}") from None
            if topic is None or t == topic or (isinstance(topic, tuple) and t in topic):
                out.append(decode(p))
        return out

    def close(self):
        self.c.disconnect()
        self.c.loop_stop()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    with running_engine(tmp_path_factory.mktemp("mqtt"), GRU) as (proc, ep, cfg):
        with SensorClient(ep["router"], stream="warm", timeout_s=120) as c:
            c.step(np.zeros(1))          # waits for the engine's first program
        yield ep, cfg


@pytest.fixture(scope="module")
def broker():
    b = start_broker()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def bridge(engine, broker):
    settings = MqttSettings(port=broker.port, qos=1, weights_topic="sensors/weights")
    br = MqttBridge(settings, engine[0]["router"], log=None).start()
    assert br.connected.wait(15), "the bridge did not subscribe"
    yield br
    br.stop()


def oracle_predictions(endpoint: str, stream: str, xs) -> np.ndarray:
    """The engine's own answers to the same values, fed by hand on a stream of its own."""
    with SensorClient(endpoint, stream=stream, timeout_s=30) as c:
        return np.array([float(c.step([v]).pred[0]) for v in xs])


def sine(n: int, period: float = 25.0, phase: float = 0.0, scale: float = 1.0, offset: float = 0.0):
    return offset + scale * np.sin(2 * np.pi * np.arange(n) / period + phase)


# ---- through the broker ----------------------------------------------------------------------
def test_a_device_sine_is_learned_and_predictions_come_back_in_order(engine, broker, bridge):
    n = 300
    xs = sine(n + 1)
    dev = Device(broker.port, subscribe=("sensors/sine/pred", "sensors/weights"))
    try:
        for t in range(n):                     # pipelined: the device does not wait for answers
            dev.publish("sensors/sine/data", {"x": [xs[t]], "ts": 1000.0 + t})
        preds = dev.take(n, "sensors/sine/pred")
        time.sleep(0.3)                        # the last weights notice, if any, follows its prediction
        notices = []
        while not dev.inbox.empty():
            t, p, retained = dev.inbox.get()
            if t == "sensors/weights":
                notices.append(json.loads(p)["version"])
    finally:
        dev.close()
    assert [p["seq"] for p in preds] == list(range(n))                 # in order, none lost
    assert all(p["stream"] == "sine" and p["ts"] == 1000.0 + p["seq"] for p in preds)
    pred = np.array([p["pred"][0] for p in preds])
    err = np.abs(pred - xs[1:n + 1])           # forecast: the answer to x_t predicts x_{t+1}
    persistence = np.abs(np.diff(xs)).mean()
    assert err[-50:].mean() < 0.3 * err[:50].mean() and err[-50:].mean() < 0.5 * persistence, \
        (err[:50].mean(), err[-50:].mean(), persistence)
    steps = [p["step"] for p in preds]
    assert steps == sorted(steps) and len(set(steps)) == n
    # weights notices: the engine's version whenever it changed, in order, up to the latest
    versions = [p["version"] for p in preds]
    assert versions[-1] > versions[0]          # weights_every = 50: the engine published new weights
    assert notices and notices == sorted(set(notices)) and notices[-1] == versions[-1]
    assert set(versions[versions.index(notices[0]):]) <= set(notices)
    late = Device(broker.port, subscribe=("sensors/weights",))   # retained: a late subscriber learns it
    try:
        (notice,) = late.take(1, "sensors/weights", timeout=10)
    finally:
        late.close()
    assert notice["version"] == versions[-1]


def test_two_devices_are_two_streams_each_with_its_own_model(engine, broker, bridge):
    n = 40
    data = {"dev-a": sine(n), "dev-b": sine(n, period=11.0, scale=0.5, offset=0.2)}
    dev = Device(broker.port)
    try:
        for t in range(n):
            for name, xs in data.items():
                dev.publish(f"sensors/{name}/data", [xs[t]])       # the bare-array payload
        got = dev.take(2 * n, tuple(f"sensors/{name}/pred" for name in data))
    finally:
        dev.close()
    for name, xs in data.items():
        mine = [p for p in got if p["stream"] == name]
        assert [p["seq"] for p in mine] == list(range(n))
        expected = oracle_predictions(engine[0]["router"], f"oracle-{name}", xs)
        np.testing.assert_allclose([p["pred"][0] for p in mine], expected, rtol=0, atol=1e-6)
    a = np.array([p["pred"][0] for p in got if p["stream"] == "dev-a"])
    b = np.array([p["pred"][0] for p in got if p["stream"] == "dev-b"])
    assert np.max(np.abs(a - b)) > 0.05        # not one stream answered twice


def test_bad_payloads_are_counted_by_reason_and_never_reach_the_engine(engine, broker, bridge):
    bad = {   # payload -> the reason it must be counted under
        b"": "empty",
        b"[]": "empty",
        b"\xc1\xff garbage": "not_json_or_msgpack",
        b"[1.0, 2.0": "not_json_or_msgpack",
        b'["a"]': "wrong_type",
        b"[true]": "wrong_type",
        b'"hello"': "wrong_type",
        b'{"y": [1.0]}': "wrong_type",
        b'{"x": [1.0], "colour": "red"}': "wrong_type",
        b'{"x": [1.0], "ts": "noon"}': "wrong_type",
        b"[NaN]": "non_finite",
        b'{"x": [1e999]}': "non_finite",
        b"[" + b"1," * 40000 + b"1]": "too_large",
        msgpack.packb({"dtype": ">f8", "shape": [1], "data": b"\0" * 8}): "bad_array",
        msgpack.packb({"dtype": "<f4", "shape": [2], "data": b"\0" * 4}): "bad_array",
        msgpack.packb({"dtype": "<f4", "shape": [1], "data": np.float32(np.inf).tobytes()}): "non_finite",
    }
    before = Counter(bridge.stats.bad)
    sent_before, refused_before = bridge.link.counts["sent"], sum(bridge.stats.refused.values())
    dev = Device(broker.port, subscribe=("sensors/faulty/pred",))
    try:
        for payload in bad:
            dev.publish("sensors/faulty/data", payload)
        dev.publish("sensors/" + "x" * 200 + "/data", [1.0])      # no stream id the engine takes
        # then good samples of the same stream: the bad ones used up no sequence number
        dev.publish("sensors/faulty/data", msgpack.packb(wire.pack_array(np.array([0.25], np.float32))))
        dev.publish("sensors/faulty/data", 0.5)
        first, second = dev.take(2, "sensors/faulty/pred")
    finally:
        dev.close()
    wait_for(lambda: sum((bridge.stats.bad - before).values()) >= len(bad) + 1, what="the bad payloads counted")
    assert bridge.stats.bad - before == Counter(list(bad.values()) + ["bad_topic"])
    assert (first["seq"], second["seq"]) == (0, 1)
    assert bridge.link.counts["sent"] - sent_before == 2
    assert sum(bridge.stats.refused.values()) == refused_before
    expected = oracle_predictions(engine[0]["router"], "oracle-faulty", [0.25, 0.5])
    np.testing.assert_allclose([first["pred"][0], second["pred"][0]], expected, atol=1e-6)


def test_a_broker_restart_keeps_the_engines_state_and_counts_the_disconnect(engine):
    b = start_broker()
    settings = MqttSettings(port=b.port, reconnect_min_s=0.1, reconnect_max_s=0.5)
    br = MqttBridge(settings, engine[0]["router"], log=None).start()
    dev = None
    try:
        assert br.connected.wait(15)
        dev = Device(b.port, subscribe=("sensors/kept/pred",))
        xs, got = sine(60, period=17.0), []
        for t in range(30):                    # lockstep: one answer before the next sample
            dev.publish("sensors/kept/data", [xs[t]])
            got += dev.take(1, "sensors/kept/pred")
        b.kill()
        wait_for(lambda: br.net["disconnects"] == 1, what="the bridge to notice the broker's death")
        b.start()                              # the same port
        wait_for(lambda: br.connected.is_set() and dev.subscribed.is_set(), 20, "both to reconnect")
        for t in range(30, 60):
            dev.publish("sensors/kept/data", [xs[t]])
            got += dev.take(1, "sensors/kept/pred")
    finally:
        if dev is not None:
            dev.close()
        summary = br.stop()
        b.stop()
    assert [p["seq"] for p in got] == list(range(60))
    steps = [p["step"] for p in got]
    assert steps == sorted(steps) and len(set(steps)) == 60
    # the engine kept the stream's hidden state, traces and weights across the outage: its
    # answers are, to the bit, those of a stream that never saw a broker restart
    expected = oracle_predictions(engine[0]["router"], "oracle-kept", xs)
    np.testing.assert_allclose([p["pred"][0] for p in got], expected, rtol=0, atol=1e-6)
    assert summary["mqtt"]["disconnects"] == 1 and summary["mqtt"]["connects"] == 2
    assert summary["mqtt"]["subscribed"] == 2 and summary["refused"] == {} and summary["bad"] == {}


def test_the_cli_bridge_reads_its_config_stops_on_sigterm_and_writes_its_stats(engine, broker, tmp_path):
    ep, _ = engine
    cfg = write_config(tmp_path / "serve.toml", {"sockets": {"router": ep["router"]},
                                                 "bridge.mqtt": {"port": 1, "topic": "plant/+/in",
                                                                 "pred_topic": "plant/{id}/out",
                                                                 "format": "msgpack"}})
    stats = tmp_path / "stats.json"
    proc = subprocess.Popen([sys.executable, "-m", "streamtrace", "bridge", "mqtt", "--config", str(cfg),
                             "--port", str(broker.port), "--stats-json", str(stats)],   # the flag wins
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    dev = Device(broker.port, subscribe=("plant/+/out",))
    try:
        wait_for(lambda: proc.poll() is not None or _published_through(dev), 30, "the CLI bridge")
        for v in (0.1, 0.2, 0.3):
            dev.publish("plant/pump7/in", [v])
        dev.publish("plant/pump7/in", b"{broken")
        got = dev.take(3, "plant/pump7/out", decode=wire.decode)     # our wire format
    finally:
        dev.close()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert [p["seq"] for p in got] == [0, 1, 2] and all(p["stream"] == "pump7" for p in got)
    assert all(p["type"] == "prediction" and wire.unpack_array(p["pred"]).shape == (1,) for p in got)
    s = json.loads(stats.read_text())
    # the three samples, the broken one and the probe(s) that found the bridge up
    assert s["received"] == s["forwarded"] + 1 and s["forwarded"] == s["answered"] == s["published"] >= 4
    assert s["bad"] == {"not_json_or_msgpack": 1} and s["mqtt"]["connects"] == 1
    assert f"mqtt bridge: {s['received']} samples received" in err and "bad payloads: not_json_or_msgpack 1" in err


def _published_through(dev) -> bool:
    """One probe sample answered: the CLI bridge is up (the probe is stream 'probe')."""
    dev.publish("plant/probe/in", [0.0])
    try:
        t, p, _ = dev.inbox.get(timeout=1.0)
    except queue.Empty:
        return False
    return t == "plant/probe/out"


# ---- no broker needed ----------------------------------------------------------------------
def test_settings_come_from_the_toml_and_flags_override_them(tmp_path):
    import argparse

    from streamtrace.adapters.mqtt import add_arguments
    cfg = write_config(tmp_path / "c.toml", {"sockets": {"router": "tcp://*:6001"},
                                             "bridge.mqtt": {"host": "broker.lan", "qos": 2, "topic": "a/+/b"}})
    p = argparse.ArgumentParser()
    p.add_argument("--config"), p.add_argument("--endpoint")
    add_arguments(p)
    s, ep = settings_from(p.parse_args(["--config", str(cfg), "--qos", "1"]))
    assert (s.host, s.qos, s.topic, s.port) == ("broker.lan", 1, "a/+/b", 1883)
    assert ep == "tcp://127.0.0.1:6001"
    bad = write_config(tmp_path / "bad.toml", {"bridge.mqtt": {"hots": "x"}})
    with pytest.raises(ConfigError, match="bridge.mqtt.hots: unknown key"):
        settings_from(p.parse_args(["--config", str(bad)]))


@pytest.mark.parametrize("change, key", [
    ({"qos": 3}, "qos"),
    ({"topic": "sensors/a+/data"}, "topic"),
    ({"topic": "sensors/#/data"}, "topic"),
    ({"topic": "sensors/all/data"}, "topic"),                   # no wildcard and no stream_level
    ({"pred_topic": "sensors/pred"}, "pred_topic"),             # no {id}
    ({"pred_topic": "sensors/{id}/data"}, "pred_topic"),        # would feed predictions back in
    ({"topic": "sensors/#", "pred_topic": "sensors/{id}/pred"}, "pred_topic"),
    ({"weights_topic": "sensors/w/data"}, "weights_topic"),
    ({"weights_topic": "w/+"}, "weights_topic"),
    ({"format": "xml"}, "format"),
    ({"stream_level": 3}, "stream_level"),
])
def test_bad_settings_name_their_key(change, key):
    with pytest.raises(ConfigError, match=f"bridge.mqtt.{key}"):
        MqttSettings(**change).validate()


def test_topics_map_to_stream_ids():
    ids = lambda s, *topics: [MqttBridge(s, log=None).stream_id(t) for t in topics]  # noqa: E731
    assert ids(MqttSettings(), "sensors/dev1/data", "sensors/" + "x" * 129 + "/data", "sensors//data") == \
        ["dev1", None, None]
    assert ids(MqttSettings(topic="site/+/+/raw", pred_topic="out/{id}"), "site/hall/t3/raw") == ["hall/t3"]
    assert ids(MqttSettings(topic="lab/#", pred_topic="out/{id}"), "lab/eeg/ch1", "lab") == ["eeg/ch1", None]
    assert ids(MqttSettings(topic="lab/+/x", stream_level=0), "lab/eeg/x") == ["lab"]
    assert topic_matches("a/+/c", "a/b/c") and not topic_matches("a/+/c", "a/b/c/d") and topic_matches("a/#", "a")


def test_payload_forms_decode_to_the_values_sent():
    x = np.array([0.5, -2.0, 3.25], np.float32)
    for raw in (json.dumps(x.tolist()).encode(), msgpack.packb(wire.pack_array(x)),
                msgpack.packb(x.tolist())):
        s = decode_sample(raw)
        assert s.x.tolist() == x.tolist() and s.y is None and s.ts is None
    s = decode_sample(msgpack.packb({"x": wire.pack_array(x), "y": [1, 2], "ts": 17.5, "mode": "predict"}))
    assert (s.x.tolist(), s.y.tolist(), s.ts, s.mode) == (x.tolist(), [1.0, 2.0], 17.5, "predict")
    assert decode_sample(b"21.5").x.tolist() == [21.5]
    with pytest.raises(BadPayload, match="'ts' must be a number") as e:
        decode_sample(b'{"x": [1], "ts": true}')
    assert e.value.reason == "wrong_type"
    with pytest.raises(BadPayload, match="beyond the float range"):
        decode_sample(b"[1" + b"0" * 400 + b"]")
    with pytest.raises(BadPayload) as e:
        decode_sample(b"[" * 30000 + b"]" * 30000)             # nesting: no crash, a reason
    assert e.value.reason in ("wrong_type", "not_json_or_msgpack")


def test_a_connection_closed_before_the_broker_accepted_it_is_a_failed_connect_not_a_disconnect():
    """What a reconnect meets when it reaches a dying broker's socket (seen under load: one
    broker death counted as two disconnects): TCP connects, then the peer closes before any
    CONNACK. Counted as a connect failure and retried; nothing was connected, so nothing was lost."""
    import socket
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    accepted = []

    def closer():
        srv.settimeout(0.2)
        while len(accepted) < 3:
            try:
                conn, _ = srv.accept()
            except OSError:       # timeout, or closed at the end of the test
                if srv.fileno() < 0:
                    return
                continue
            accepted.append(1)
            conn.close()          # no CONNACK: the connection ends during MQTT's handshake
    th = threading.Thread(target=closer, daemon=True)
    th.start()
    br = MqttBridge(MqttSettings(port=srv.getsockname()[1], reconnect_min_s=0.05, reconnect_max_s=0.1),
                    log=None).start()
    try:
        wait_for(lambda: len(accepted) >= 3, what="three connection attempts to reach the socket")
        wait_for(lambda: br.net["connect_failures"] >= 3, what="them to be counted")
    finally:
        summary = br.stop()
        srv.close()
    assert summary["mqtt"].get("disconnects", 0) == 0 and summary["mqtt"].get("connects", 0) == 0
    assert summary["mqtt"]["connect_failures"] >= 3


def test_an_unreachable_broker_and_a_silent_engine_are_said_not_fatal(broker):
    import io
    import tempfile
    log = io.StringIO()
    nowhere = MqttBridge(MqttSettings(port=free_port(), reconnect_min_s=0.1, reconnect_max_s=0.2), log=log).start()
    wait_for(lambda: nowhere.net["connect_failures"] >= 2, what="connection retries")
    assert nowhere.stop()["mqtt"]["connect_failures"] >= 2
    assert log.getvalue().count("cannot reach the broker at 127.0.0.1") == 1      # said once, retried
    log = io.StringIO()
    nobody = tempfile.mkdtemp(prefix="st-", dir="/tmp")          # ipc paths must stay short
    br = MqttBridge(MqttSettings(port=broker.port), f"ipc://{nobody}/no-engine", log=log)
    br.engine_silent_s = 0.3
    br.start()
    dev = None
    try:
        assert br.connected.wait(15)
        dev = Device(broker.port, subscribe=())
        for i in range(10):
            dev.publish("sensors/lonely/data", [float(i)])
            time.sleep(0.1)
        wait_for(lambda: br.counts["engine_silent"] == 1, what="the silent engine noticed")
    finally:
        if dev is not None:
            dev.close()
        s = br.stop()
        os.rmdir(nobody)
    assert s["forwarded"] == 10 and s["answered"] == 0 and s["mqtt"]["engine_silent"] == 1
    assert "no answer from the engine at ipc://" in log.getvalue()


_json_values = hs.recursive(
    hs.none() | hs.booleans() | hs.integers(-2**63, 2**63 - 1) | hs.floats() | hs.text(max_size=5),
    lambda inner: hs.lists(inner, max_size=4) | hs.dictionaries(hs.sampled_from(["x", "y", "ts", "mode", "q"]),
                                                                 inner, max_size=3),
    max_leaves=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=hs.binary(max_size=64) | _json_values.map(lambda v: json.dumps(v).encode())
       | _json_values.map(lambda v: msgpack.packb(v)))
def test_any_payload_is_a_finite_sample_or_a_counted_reason(raw):
    try:
        s = decode_sample(raw)
    except BadPayload as e:
        assert e.reason in REASONS
        return
    assert s.x.ndim >= 1 and s.x.size > 0 and np.all(np.isfinite(s.x))
    assert s.y is None or (s.y.size > 0 and np.all(np.isfinite(s.y)))
    assert s.ts is None or math.isfinite(s.ts)


# ---- the devices' units ([bridge.mqtt] units) into the serve config's [stream] units ---------------
def test_samples_in_the_devices_units_reach_the_engine_in_the_declared_units(broker):
    from streamtrace.engine.config import StreamConfig
    sock, endpoint, received = fake_engine()
    settings = MqttSettings(port=broker.port, qos=1, units=["microvolts", "mV"])
    br = MqttBridge(settings, endpoint, log=None, declared=StreamConfig(units=["mV", "V"])).start()
    dev = Device(broker.port, subscribe=())
    try:
        assert br.connected.wait(15), "the bridge did not subscribe"
        dev.publish("sensors/units1/data", {"x": [2500.0, 1500.0]})
        dev.publish("sensors/units1/data", [7.0])                 # one value: not the two channels declared
        dev.publish("sensors/units1/data", [-1250, 250])
        got = received(2)
        wait_for(lambda: br.stats.received == 3, what="three payloads")
    finally:
        dev.close()
        br.stop()
        sock.close()
    # by hand: 2500 uV = 2.5 mV, 1500 mV = 1.5 V
    np.testing.assert_allclose(got, [[2.5, 1.5], [-1.25, 0.25]], rtol=1e-15)
    assert dict(br.stats.bad) == {"channels": 1} and br.stats.forwarded == 2


def test_without_device_units_samples_go_as_they_are(broker):
    from streamtrace.engine.config import StreamConfig
    sock, endpoint, received = fake_engine()
    br = MqttBridge(MqttSettings(port=broker.port, qos=1), endpoint, log=None,
                    declared=StreamConfig(rate=250.0, units=["mV"])).start()
    dev = Device(broker.port, subscribe=())
    try:
        assert br.connected.wait(15), "the bridge did not subscribe"
        dev.publish("sensors/units2/data", [3.25])
        got = received(1)
    finally:
        dev.close()
        br.stop()
        sock.close()
    np.testing.assert_array_equal(got, [[3.25]])


@pytest.mark.parametrize("units,declared,match", [
    (["A"], ["V"], r"bridge.mqtt.units, channel 0: 'A' is a current, 'V' is a voltage"),
    (["mV", "mV"], ["V"], r"bridge.mqtt.units: has 2 channels; stream.units declares 1"),
    (["bananas"], [], r"bridge.mqtt.units\[0\]: 'bananas' is not a unit"),
])
def test_device_units_that_cannot_be_converted_are_refused_naming_the_key(units, declared, match):
    from streamtrace.engine.config import StreamConfig
    with pytest.raises(ConfigError, match=match):
        MqttBridge(MqttSettings(units=units), log=None, declared=StreamConfig(units=declared))


def test_the_cli_takes_units_from_the_flag_and_stream_from_the_config(tmp_path):
    cfg = write_config(tmp_path / "c.toml", {"stream": {"units": ["V"]}, "bridge.mqtt": {"units": ["uV"]}})
    r = subprocess.run([sys.executable, "-m", "streamtrace", "bridge", "mqtt", "--config", str(cfg),
                        "--units", "s"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip() == ("config error: bridge.mqtt.units, channel 0: 's' is a duration, 'V' is a voltage: "
                                "they cannot be converted")
