"""The MQTT and LSL bridges sending to a cluster (``streamtrace bridge mqtt|lsl --nats URL``): a
real token-protected nats-server on loopback with one worker, a real MQTT broker, real LSL
outlets. Oracle: one engine fed the same values one message per call (tests/cluster_harness.py):
every sample answered once, in order, each prediction bit-identical to the engine's."""
from __future__ import annotations

from paths import TESTS
import os
import time
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("LSLAPICFG", str((TESTS / "lsl_api.cfg")))
pytest.importorskip("nats", reason="pip install 'streamtrace[cluster]' (make test installs it)")

import cluster_harness as H                                             # noqa: E402
from streamtrace.adapters.bridge import NatsTarget                      # noqa: E402
from streamtrace.commands.cli import main                                        # noqa: E402
from streamtrace.cluster import Credentials, NatsServer                 # noqa: E402
from streamtrace.cluster.nats_server import find_server_binary               # noqa: E402

TOKEN = "br1dge"
STEPS = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(nats URL, engine config): one worker owning every partition of a token-protected server."""
    tmp = tmp_path_factory.mktemp("bridge-cluster")
    find_server_binary()
    cfg = H.config(tmp)
    srv = NatsServer(token=TOKEN, store_dir=str(tmp / "store")).start()
    worker = H.start_worker(srv.url, cfg, "--token", TOKEN)
    try:
        H.wait_balanced(srv.url, 1, creds=Credentials(token=TOKEN))
        yield srv.url, cfg
    finally:
        assert H.terminate([worker]) == [0]
        srv.kill()


def reference(cfg, data: dict) -> dict:
    preds, _ = H.reference(cfg, data)
    return {key: float(np.asarray(p).ravel()[0]) for key, p in preds.items()}


def test_mqtt_bridge_sends_to_the_cluster_and_each_sample_is_answered_once(cluster):
    """Each sample answered once, in order, as one engine answers it; then a restarted bridge (a
    new link numbering from 0) has its first sample per stream refused as a repeat and goes on
    with the numbers the worker expects (a JetStream message id would have had it dropped unanswered)."""
    from mqtt_broker import Broker
    url, cfg = cluster
    more = 4
    rows = {f"m{i}": v for i, v in enumerate(H.signals(2, STEPS + 1 + more).values())}
    # what the worker steps: rows 0..STEPS-1, then (the restart's first sample refused) the rest
    want = reference(cfg, {n: np.concatenate([xs[:STEPS], xs[STEPS + 1:]]) for n, xs in rows.items()})
    broker = Broker().start()
    try:
        got, stats = _bridge_run(url, broker.port, rows, range(STEPS), bad_topic=True)
        again, stats2 = _bridge_run(url, broker.port, rows, range(STEPS, STEPS + 1 + more), expect=more, resync=True)
    finally:
        broker.stop()
    for name in rows:
        mine = [p for p in got if p["stream"] == name]
        assert [p["seq"] for p in mine] == list(range(STEPS))       # each once, in order, none lost
        assert [p["ts"] for p in mine] == [100.0 + t for t in range(STEPS)]
        assert [p["pred"][0] for p in mine] == [want[(name, t)] for t in range(STEPS)]
        mine = [p for p in again if p["stream"] == name]
        assert [p["seq"] for p in mine] == list(range(STEPS, STEPS + more))
        assert [p["pred"][0] for p in mine] == [want[(name, t)] for t in range(STEPS, STEPS + more)]
    assert (stats["forwarded"], stats["answered"], stats["published"]) == (2 * STEPS,) * 3
    assert stats["bad"] == {"bad_topic": 1} and not stats["refused"]
    assert stats2["refused"] == {"repeat": 2} and stats2["link"]["resynced"] == 2 and stats2["answered"] == 2 * more


def _bridge_run(url, port, rows: dict, steps, bad_topic=False, expect=None, resync=False):
    """One MQTT bridge to the cluster: a device publishes ``rows`` at ``steps`` (pipelined) and
    takes ``expect`` (default: all) predictions per stream. With ``resync``, the first step's
    refusals are awaited before the rest go (samples sent before a stream's refusal comes back
    carry the old numbers and are refused too). Returns (predictions, bridge summary)."""
    from test_bridge_mqtt import Device
    from streamtrace.adapters.mqtt import MqttBridge, MqttSettings
    bridge = MqttBridge(MqttSettings(port=port, qos=1), NatsTarget(url, Credentials(token=TOKEN)), log=None).start()
    try:
        assert bridge.connected.wait(15), "the bridge did not subscribe"
        dev = Device(port, subscribe=("sensors/+/pred",))
        try:
            if bad_topic:
                dev.publish("sensors/a.b/data", {"x": [0.5]})     # a '.' cannot be in a NATS subject token
            for k, t in enumerate(steps):
                for name, xs in rows.items():
                    dev.publish(f"sensors/{name}/data", {"x": [float(xs[t, 0])], "ts": 100.0 + t})
                if resync and k == 0:
                    deadline = time.monotonic() + 60
                    while bridge.link is None or bridge.link.counts["resynced"] < len(rows):
                        assert time.monotonic() < deadline, "the restarted bridge never resynchronised"
                        time.sleep(0.02)
            got = dev.take(len(rows) * (expect or len(steps)), timeout=90)
        finally:
            dev.close()
    finally:
        summary = bridge.stop()
    return got, summary


def test_lsl_bridge_sends_to_the_cluster_and_each_sample_is_answered_once(cluster):
    pylsl = pytest.importorskip("pylsl")
    from test_bridge_lsl import collect, make_outlet, pred_inlet, unique
    from streamtrace.adapters.lsl import LslBridge, LslSettings
    url, cfg = cluster
    name = unique("cl")
    xs = H.signals(1, STEPS + 1)["s0"]
    want = reference(cfg, {f"src-{name}": xs})
    outlet = make_outlet(name, channels=1)
    bridge = LslBridge(LslSettings(name=name, wait_s=10), NatsTarget(url, Credentials(token=TOKEN))).start()
    try:
        assert bridge.ready.wait(30)
        t0 = pylsl.local_clock()
        outlet.push_sample(xs[0], t0)                 # the first answer makes the prediction outlet
        inlet, _ = pred_inlet(name, timeout=60)
        for t in range(1, STEPS + 1):
            outlet.push_sample(xs[t], t0 + 0.01 * t)
        pred, ts = collect(inlet, STEPS, timeout=90)
    finally:
        stats = bridge.stop()
    assert stats.forwarded == stats.answered == stats.published == STEPS + 1 and not stats.refused
    assert len(ts) == STEPS and np.all(np.diff(ts) > 0)     # each once, in order
    assert pred[:, 0].tolist() == [want[(f"src-{name}", t)] for t in range(1, STEPS + 1)]


@pytest.mark.parametrize("argv, said", [
    (["bridge", "mqtt", "--nats", "nats://127.0.0.1:4222", "--endpoint", "tcp://127.0.0.1:5555"], "choose one"),
    (["bridge", "mqtt", "--token", "t"], "needs --nats"),
    (["bridge", "lsl", "--name", "x", "--nats", "127.0.0.1:4222"], "not a NATS URL"),
    (["replay", "rows.csv", "--user", "u"], "needs --nats"),
])
def test_bad_nats_options_are_refused_with_what_is_wrong(argv, said, capsys):
    assert main(argv) == 2
    assert said in capsys.readouterr().err


def test_a_bridge_without_the_token_is_turned_away_clearly(cluster, capsys):
    url, _ = cluster
    assert main(["bridge", "mqtt", "--nats", url, "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert "cannot connect to NATS" in err and "Authorization" in err
    assert main(["bridge", "lsl", "--name", "x", "--nats", url, "--token", "wrong"]) == 2
    assert "Authorization" in capsys.readouterr().err
