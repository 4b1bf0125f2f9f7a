"""`streamtrace bridge lsl` (streamtrace.adapters.lsl) with real LSL outlets and inlets on this
host and a real engine subprocess.

Oracles: the samples and timestamps the test pushes itself (predictions compared with the next
sample, timestamps with the ones sent plus LSL's clock offset), the engine's own sequence
numbering read by a hand-fed SensorClient (how many samples really reached it), and the
bridge's stats file written by the CLI process.
"""
from __future__ import annotations

from paths import TESTS
import json
import re
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

from pathlib import Path

import numpy as np
import pytest

# before liblsl reads its configuration (first use); the CLI bridge subprocess inherits it
os.environ.setdefault("LSLAPICFG", str((TESTS / "lsl_api.cfg")))
pylsl = pytest.importorskip("pylsl")

from engine_helpers import fake_engine, running_engine  # noqa: E402
from streamtrace.transport import SensorClient  # noqa: E402
from streamtrace.adapters.lsl import (ENGINE_SILENT_S, LslBridge, LslBridgeError, LslSettings,  # noqa: E402
                                      settings_from)
from streamtrace.engine.config import ConfigError  # noqa: E402

GRU = {
    "model": {"stack": "gru", "n_in": 2, "n_hidden": 16, "n_out": 2},
    "learning": {"algorithm": "d-rtrl", "mode": "forecast", "optimizer": "adam", "lr": 1e-2},
    "engine": {"slots": 8, "micro_batch": 1, "park_s": 0.0},   # one per test stream
    "publish": {"weights_every": 0, "stats_every_s": 3600.0, "predictions": False},
    "checkpoint": {"dir": ""},
}


def unique(prefix: str) -> str:
    """Stream names nobody else on this host uses (other test runs see the same LSL network)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def make_outlet(name: str, fmt=None, channels: int = 2, srate: float = 100.0):
    info = pylsl.StreamInfo(name, "TestSignal", channels, srate, pylsl.cf_float32 if fmt is None else fmt,
                            f"src-{name}")
    return pylsl.StreamOutlet(info)


def pred_inlet(name: str, timeout: float = 30.0):
    """An inlet on the bridge's prediction outlet (it appears with the first prediction)."""
    found = pylsl.resolve_byprop("name", name + "-pred", 1, timeout)
    assert found, f"no prediction outlet {name}-pred within {timeout} s"
    inlet = pylsl.StreamInlet(found[0], max_buflen=60, processing_flags=0)
    inlet.open_stream(10)
    return inlet, found[0]


def collect(inlet, want: int, timeout: float = 60.0):
    xs, ts, got, end = [], [], 0, time.monotonic() + timeout
    while got < want and time.monotonic() < end:
        x, t = inlet.pull_chunk(timeout=0.2, max_samples=1024, min_samples=1, as_numpy=True)
        if len(t):
            xs.append(np.asarray(x, np.float64)), ts.append(np.asarray(t))
            got += len(t)
    return (np.concatenate(xs) if xs else np.zeros((0, 2)), np.concatenate(ts) if ts else np.zeros(0))


def wait_until(cond, timeout: float = 30.0):
    end = time.monotonic() + timeout
    while not cond() and time.monotonic() < end:
        time.sleep(0.02)
    return cond()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    with running_engine(tmp_path_factory.mktemp("lsl"), GRU) as (proc, ep, _):
        with SensorClient(ep["router"], stream="warm", timeout_s=120) as c:
            c.step(np.zeros(2))          # waits for the engine's first program
        yield ep


def test_a_sine_is_learned_and_predictions_come_back_in_order_with_the_samples_timestamps(engine):
    name, n = unique("sine"), 1500
    outlet = make_outlet(name)
    bridge = LslBridge(LslSettings(name=name, wait_s=10), engine["router"]).start()
    try:
        assert bridge.ready.wait(15)
        t = np.arange(n + 1)
        x = np.column_stack([np.sin(0.25 * t), 0.8 * np.cos(0.25 * t + 0.3)]).astype(np.float32)
        t0 = pylsl.local_clock()
        sent_ts = t0 + 0.01 * t
        outlet.push_sample(x[0], sent_ts[0])      # the first answer makes the prediction outlet
        inlet, info = pred_inlet(name)
        assert (info.type(), info.channel_count(), info.nominal_srate()) == ("Prediction", 2, 100.0)
        assert info.source_id() == f"src-{name}-pred"
        for i in range(1, n + 1, 50):             # chunks, as a device driver pushes them
            outlet.push_chunk(x[i:i + 50], sent_ts[i:i + 50])
            time.sleep(0.005)
        pred, pred_ts = collect(inlet, n)
    finally:
        stats = bridge.stop()
    st = bridge.streams[f"src-{name}"]
    assert stats.received == stats.forwarded == n + 1 and not stats.bad and not stats.refused
    # every prediction after the inlet connected, in order, stamped with its sample's corrected time
    assert len(pred_ts) == n
    assert st.offset_s is not None and abs(st.offset_s) < 5e-3          # one host: LSL's offset is ~0
    np.testing.assert_allclose(pred_ts, sent_ts[1:] + st.offset_s, rtol=0, atol=1e-4)
    assert np.all(np.diff(pred_ts) > 0)
    # forecast mode: the prediction stamped with sample t is for sample t + 1
    err = np.mean((pred[:-1] - x[2:]) ** 2, axis=1)
    early, late = err[:100].mean(), err[-300:].mean()
    persistence = np.mean((x[1:-1] - x[2:]) ** 2)
    assert late < 0.3 * early, (early, late)
    assert late < persistence, (late, persistence)


def test_a_nan_sample_is_counted_and_never_reaches_the_engine(engine, monkeypatch):
    name = unique("nan")
    # on one host LSL's clock offset is ~0: pretend the sender's clock is 0.25 s behind ours, so
    # that the timestamps show the offset added (and no other)
    real = pylsl.StreamInlet.time_correction
    monkeypatch.setattr(pylsl.StreamInlet, "time_correction", lambda self, timeout=1.0: real(self, timeout) + 0.25)
    outlet = make_outlet(name)
    bridge = LslBridge(LslSettings(name=name, wait_s=10), engine["router"]).start()
    try:
        assert bridge.ready.wait(15)
        rows = np.array([[0.1 * i, -0.1 * i] for i in range(11)], np.float32)
        rows[5, 1] = np.nan
        outlet.push_sample(rows[0])
        inlet, _ = pred_inlet(name)
        ts = pylsl.local_clock() + 0.01 * np.arange(1, 11)
        outlet.push_chunk(rows[1:], ts)
        _, pred_ts = collect(inlet, 9, timeout=30)
        assert wait_until(lambda: bridge.stats.answered == 10)
    finally:
        stats = bridge.stop()
    assert stats.received == 11 and stats.forwarded == stats.answered == stats.published == 10
    assert dict(stats.bad) == {"not finite": 1} and not stats.refused
    offset = bridge.streams[f"src-{name}"].offset_s
    assert 0.245 < offset < 0.255
    np.testing.assert_allclose(pred_ts, np.delete(ts, 4) + offset, rtol=0, atol=1e-4)   # rows[5] has ts[4]
    # the engine itself saw exactly 10 samples of this stream: it takes number 10 next
    with SensorClient(engine["router"], stream=f"src-{name}", timeout_s=30) as c:
        c.send([0.0, 0.0], seq=10)
        reply = c.recv(raise_errors=False)
    assert reply["type"] == "prediction", reply


def test_a_string_stream_is_refused_clearly():
    name = unique("text")
    outlet = make_outlet(name, fmt=pylsl.cf_string, channels=1)   # noqa: F841 - kept alive while resolving
    bridge = LslBridge(LslSettings(name=name, wait_s=10), "ipc:///tmp/st-no-engine-here")
    start = time.monotonic()
    with pytest.raises(LslBridgeError, match=rf"'{name}'.*carries strings; .*numeric channels only"):
        bridge.run(threading.Event())
    assert time.monotonic() - start < 5           # refused at once, not after the whole wait
    assert bridge.stats.bad["non-numeric stream"] == 1 and bridge.stats.forwarded == 0


def test_a_stream_id_the_engine_would_refuse_is_refused_here():
    name = unique("longid")
    outlet = make_outlet(name)   # noqa: F841 - kept alive while resolving
    bridge = LslBridge(LslSettings(name=name, stream_id="{name}" + "x" * 130, wait_s=10), "ipc:///tmp/st-no-engine-here")
    with pytest.raises(LslBridgeError, match=r"not 1\.\.128 printable characters; choose another with stream_id"):
        bridge.run(threading.Event())
    assert bridge.stats.bad["bad stream id"] == 1


def test_no_matching_stream_names_what_was_searched_for():
    name = unique("absent")
    bridge = LslBridge(LslSettings(name=name, type="EEG", wait_s=0.3), "ipc:///tmp/st-no-engine-here")
    with pytest.raises(LslBridgeError, match=rf"no LSL stream matching name='{name}' and type='EEG' within 0.3 s"):
        bridge.run(threading.Event())


def test_without_an_engine_samples_are_forwarded_and_stop_still_ends_the_bridge():
    name = unique("noengine")
    outlet = make_outlet(name)
    bridge = LslBridge(LslSettings(name=name, wait_s=10), "ipc:///tmp/st-no-engine-here").start()
    assert bridge.ready.wait(15)
    for i in range(20):
        outlet.push_sample([0.1 * i, 0.0])
    assert wait_until(lambda: bridge.stats.forwarded == 20, 15)
    time.sleep(ENGINE_SILENT_S + 0.2)             # past the wait on the engine: the bus sets the pace
    start = time.monotonic()
    stats = bridge.stop()
    assert time.monotonic() - start < 3 and not bridge._thread.is_alive()
    assert stats.received == stats.forwarded == 20 and stats.answered == stats.published == 0


def test_an_invalid_predicate_is_named():
    bridge = LslBridge(LslSettings(predicate="name=='x' and (", wait_s=1), "ipc:///tmp/st-no-engine-here")
    with pytest.raises(LslBridgeError, match=r"not a valid LSL \(XPath 1.0\) predicate: \(name=='x' and \(\)"):
        bridge.run(threading.Event())


def test_a_stream_appearing_later_is_picked_up(engine):
    prefix = unique("late")
    first = make_outlet(prefix + "-a")
    settings = LslSettings(predicate=f"starts-with(name, '{prefix}')", rescan_s=0.2, wait_s=10)
    bridge = LslBridge(settings, engine["router"]).start()
    try:
        assert bridge.ready.wait(15)
        second = make_outlet(prefix + "-b")
        assert wait_until(lambda: f"src-{prefix}-b" in bridge.streams, 15)
        assert bridge.streams[f"src-{prefix}-b"].opened.wait(15)
        for i in range(5):
            first.push_sample([0.1 * i, 0.0])
            second.push_sample([0.0, 0.1 * i])
            time.sleep(0.01)
        assert wait_until(lambda: bridge.stats.published >= 10, 30)
    finally:
        stats = bridge.stop()
    assert sorted(bridge.streams) == [f"src-{prefix}-a", f"src-{prefix}-b"]   # never its own -pred outlets
    assert {sid: st.outlet_name for sid, st in bridge.streams.items()} == {
        f"src-{prefix}-a": f"{prefix}-a-pred", f"src-{prefix}-b": f"{prefix}-b-pred"}
    assert stats.received == stats.forwarded == stats.answered == stats.published == 10


def test_settings_need_a_selector_and_known_keys(tmp_path):
    with pytest.raises(LslBridgeError, match="--name, --type or --predicate"):
        LslSettings().validate()
    with pytest.raises(LslBridgeError, match="stream_id"):
        LslSettings(name="a", stream_id="{nope}").validate()
    cfg = tmp_path / "serve.toml"
    cfg.write_text('[sockets]\nrouter = "tcp://*:6001"\n[bridge.lsl]\nname = "eeg"\nwait_s = 3\n')
    args = type("A", (), {"config": str(cfg), "endpoint": None, "name": None, "type": "EEG", "predicate": None,
                          "stream_id": None, "wait_s": None, "rescan_s": 0.0})()
    s, endpoint = settings_from(args)
    assert (s.name, s.type, s.wait_s, s.rescan_s, endpoint) == ("eeg", "EEG", 3.0, 0.0, "tcp://127.0.0.1:6001")
    cfg.write_text('[bridge.lsl]\nnam = "eeg"\n')
    with pytest.raises(ConfigError, match="bridge.lsl.nam"):
        settings_from(args)


def test_cli_bridge_stops_on_sigterm_and_writes_its_stats(engine, tmp_path):
    name = unique("cli")
    outlet = make_outlet(name)
    cfg = tmp_path / "bridge.toml"
    cfg.write_text(f'[sockets]\nrouter = "{engine["router"]}"\n[bridge.lsl]\nname = "{name}"\nwait_s = 60.0\n')
    stats_path = tmp_path / "stats.json"
    proc = subprocess.Popen([sys.executable, "-m", "streamtrace", "bridge", "lsl", "--config", str(cfg),
                             "--stream-id", "cli-{name}", "--stats-json", str(stats_path)],
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        found, end = [], time.monotonic() + 90
        while not found and time.monotonic() < end:   # until the bridge is up and has answered
            outlet.push_sample([0.0, 1.0])
            found = pylsl.resolve_byprop("name", name + "-pred", 1, 0.2)
        inlet, _ = pred_inlet(name)
        # answers to the probes still in flight (on a loaded machine some come after the inlet
        # opened): taken until the outlet has been quiet for a second
        while len(inlet.pull_chunk(timeout=1.0, max_samples=1024, min_samples=1, as_numpy=True)[1]):
            pass
        outlet.push_chunk([[0.1 * i, 1.0] for i in range(1, 20)])
        _, pred_ts = collect(inlet, 19, timeout=30)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert len(pred_ts) == 19
    stats = json.loads(stats_path.read_text())
    k = stats["received"]
    assert k >= 20 and stats["forwarded"] == stats["answered"] == stats["published"] == k
    assert stats["streams"][f"cli-{name}"]["prediction_outlet"] == f"{name}-pred"
    assert f"lsl bridge: {k} samples received, {k} forwarded, {k} answered, {k} predictions published" in err


# ---- rate and units from the outlet's stream info ([stream] of the serve config) -------------------
def unit_outlet(name: str, units, srate: float = 100.0):
    """An outlet declaring its channels' units the way LSL / XDF metadata does."""
    info = pylsl.StreamInfo(name, "EEG", len(units), srate, pylsl.cf_float32, f"src-{name}")
    chans = info.desc().append_child("channels")
    for i, unit in enumerate(units):
        ch = chans.append_child("channel")
        ch.append_child_value("label", f"C{i}")
        ch.append_child_value("unit", unit)
    return pylsl.StreamOutlet(info)


def test_samples_in_the_outlets_units_are_forwarded_in_the_declared_units():
    from streamtrace.engine.config import StreamConfig
    name = unique("uv")
    outlet = unit_outlet(name, ["microvolts", "microvolts"])
    sock, endpoint, received = fake_engine()
    declared = StreamConfig(rate=100.0, units=["mV", "V"])
    bridge = LslBridge(LslSettings(name=name, wait_s=10), endpoint, declared=declared).start()
    try:
        assert bridge.ready.wait(15)
        rows = np.array([[2500.0, 1e6], [-1250.0, 5e5], [0.0, -2e6]], np.float32)   # microvolts
        outlet.push_chunk(rows)
        got = received(3)
    finally:
        bridge.stop()
        sock.close()
    # by hand: 2500 uV = 2.5 mV; 1e6 uV = 1 V
    np.testing.assert_array_equal(got, [[2.5, 1.0], [-1.25, 0.5], [0.0, -2.0]])
    st = bridge.streams[f"src-{name}"].summary()
    assert (st["rate_hz"], st["units"], st["forwarded_units"]) == (100.0, ["microvolts"] * 2, ["mV", "V"])


def test_without_a_declaration_the_outlets_rate_and_units_are_reported_and_values_kept():
    name = unique("keep")
    outlet = unit_outlet(name, ["mV", ""], srate=250.0)
    sock, endpoint, received = fake_engine()
    bridge = LslBridge(LslSettings(name=name, wait_s=10), endpoint).start()
    try:
        assert bridge.ready.wait(15)
        outlet.push_sample([1.5, -3.0])
        got = received(1)
    finally:
        bridge.stop()
        sock.close()
    np.testing.assert_array_equal(got, [[1.5, -3.0]])
    st = bridge.streams[f"src-{name}"].summary()
    assert (st["rate_hz"], st["units"], st["forwarded_units"]) == (250.0, ["mV", ""], ["mV", ""])


@pytest.mark.parametrize("units,srate,declared,words", [
    (["mV", "mV"], 500.0, (100.0, []), "samples at 500 Hz; the config's stream.rate is 100 Hz"),
    (["mV", "A"], 100.0, (100.0, ["mV", "V"]), "channel 1: 'A' is a current, 'V' is a voltage"),
    (["mV", "mV", "mV"], 100.0, (0.0, ["mV", "mV"]), "has 3 channels; stream.units declares 2"),
])
def test_a_stream_whose_rate_or_units_cannot_match_the_config_is_refused(units, srate, declared, words):
    from streamtrace.engine.config import StreamConfig
    name = unique("mismatch")
    outlet = unit_outlet(name, units, srate)   # noqa: F841 - kept alive while resolving
    bridge = LslBridge(LslSettings(name=name, wait_s=10), "ipc:///tmp/st-no-engine-here",
                       declared=StreamConfig(rate=declared[0], units=declared[1]))
    with pytest.raises(LslBridgeError, match=re.escape(words)):
        bridge.run(threading.Event())
    assert bridge.stats.bad["units"] == 1 and bridge.stats.forwarded == 0


def test_the_prediction_outlet_declares_the_forwarded_units(engine):
    from streamtrace.engine.config import StreamConfig
    name = unique("predunits")
    outlet = unit_outlet(name, ["microvolts", "microvolts"])
    bridge = LslBridge(LslSettings(name=name, wait_s=10), engine["router"],
                       declared=StreamConfig(rate=100.0, units=["mV", "mV"])).start()
    try:
        assert bridge.ready.wait(15)
        outlet.push_sample([100.0, 200.0])
        _, info = pred_inlet(name)
        full = pylsl.StreamInlet(info)
        desc = full.info(10).desc()
    finally:
        bridge.stop()
    ch, seen = desc.child("channels").child("channel"), []
    while not ch.empty():
        seen.append((ch.child_value("label"), ch.child_value("unit")))
        ch = ch.next_sibling()
    assert seen == [("C0", "mV"), ("C1", "mV")]


def test_the_cli_reads_stream_from_the_config_and_refuses_a_bad_one(tmp_path):
    cfg = tmp_path / "bridge.toml"
    cfg.write_text('[stream]\nrate = "2 s"\n[bridge.lsl]\nname = "eeg"\n')
    r = subprocess.run([sys.executable, "-m", "streamtrace", "bridge", "lsl", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip() == "bridge lsl: stream.rate: '2 s' is a duration; a frequency is needed (e.g. '250 Hz')"
