"""End-to-end: the engine in another process (``python -m streamtrace serve``), real ZeroMQ
sockets on loopback (ipc://), the sensor clients and subscribers of ``streamtrace.adapters``.

* forecast learning over the socket: the prediction error on a sine falls by far more than
  5x; every accepted message is answered once, in order, on the DEALER and on the PUB topic
  ``pred/<stream>``; fire-and-forget (PUSH) streams get every prediction on PUB, in order;
* 64 concurrent streams from 4 client processes (supervised, one model per stream): every
  message is answered exactly once, and a stream's predictions equal a single-stream
  ``OnlineLearner`` in this process fed the same data;
* weights: a ``WeightsSubscriber`` rebuilds the engine's weights exactly, from one snapshot
  and many published updates, and they equal the final checkpoint written on SIGTERM;
* bad input over the socket gets an error reply with a code and the engine keeps serving.

Engines start in a few seconds (XLA compiles every micro-batch size up front); each test
module fixture / test reuses one engine.
"""
from paths import TESTS
import json
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest

from streamtrace import wire
from streamtrace.transport import EngineError, PushClient, SensorClient, Subscriber, WeightsSubscriber
from streamtrace.engine import load_config
from streamtrace.recipe.build import build_learner
from streamtrace.learner import read_checkpoint

from engine_helpers import (N_IN, N_OUT, loss_value, running_engine, stop_gracefully, stream_name,
                            supervised_data)

HELPERS = (TESTS / "engine_helpers.py")


def collect(sub: Subscriber, topic: bytes, n: int, timeout_s: float = 20.0, idle_s: float = 5.0) -> list[dict]:
    """The next n messages on ``topic`` (other topics on the socket are skipped); gives up after
    timeout_s, or after idle_s without a message on ``topic``."""
    out, now = [], time.monotonic()
    deadline, last = now + timeout_s, now
    while len(out) < n and time.monotonic() < min(deadline, last + idle_s):
        got = sub.recv(0.2)
        if got is not None and got[0] == topic:
            out.append(got[1])
            last = time.monotonic()
    return out


def wait_subscribed(sub: Subscriber, timeout_s: float = 10.0):
    """A 'stats' message arrived: the subscriptions made before it are live at the engine."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = sub.recv(0.5)
        if got is not None and got[0] == b"stats":
            return
    raise AssertionError("no 'stats' message on the PUB socket: the subscription never became live")


# ---- 1 and 4: one forecasting engine ---------------------------------------------------------------
FORECAST = {
    "model": {"stack": "gru", "n_in": 1, "n_hidden": 16, "n_out": 1},
    "learning": {"algorithm": "d-rtrl", "mode": "forecast", "optimizer": "adam", "lr": 2e-3},
    "engine": {"slots": 8, "micro_batch": 4},
    "publish": {"weights_every": 0, "stats_every_s": 0.1, "predictions": True},
}


@pytest.fixture(scope="module")
def forecast_engine(tmp_path_factory):
    with running_engine(tmp_path_factory.mktemp("forecast"), FORECAST) as (proc, ep, cfg_path):
        yield proc, ep
    # the fixture's engine must have survived every test that used it
    assert proc.returncode == 0, f"engine exited with {proc.returncode}"


def test_forecast_stream_learns_and_every_prediction_arrives_in_order(forecast_engine):
    proc, ep = forecast_engine
    name, steps = "fc-dealer", 2500
    sig = np.sin(0.07 * np.arange(steps + 1)).astype(np.float32)
    sub = Subscriber(ep["pub"], (b"pred/" + name.encode(), b"stats"))
    try:
        wait_subscribed(sub)
        with SensorClient(ep["router"], stream=name) as c:
            replies = [c.step(sig[t:t + 1]) for t in range(steps)]
        published = collect(sub, b"pred/" + name.encode(), steps)
    finally:
        sub.close()
    assert proc.poll() is None

    # every accepted message answered once, in order
    assert all(r["type"] == "prediction" and r["stream"] == name for r in replies)
    assert [r["seq"] for r in replies] == list(range(steps))
    assert np.all(np.diff([r["step"] for r in replies]) > 0)
    # forecast semantics: the loss of step t is the error of the prediction made at t-1 on x_t
    preds = np.array([r.pred[0] for r in replies])
    losses = np.array([loss_value(r) for r in replies])
    assert np.isnan(losses[0])
    np.testing.assert_allclose(losses[1:], (preds[:-1] - sig[1:steps]) ** 2, rtol=1e-4, atol=1e-7)
    first, last = np.nanmean(losses[1:201]), np.nanmean(losses[-200:])
    assert first > 5 * last, f"prediction error fell only {first / last:.1f}x ({first:.4g} -> {last:.4g})"
    assert np.mean((preds[-200:] - sig[steps - 199:steps + 1]) ** 2) < 0.2 * first

    # the PUB topic carries the same predictions, every seq, in order
    assert len(published) == steps, f"{len(published)} of {steps} predictions published"
    assert [m["seq"] for m in published] == list(range(steps))
    assert all(m["stream"] == name for m in published)
    np.testing.assert_array_equal(np.array([m.pred[0] for m in published]), preds)


def test_push_stream_every_prediction_published_in_order(forecast_engine):
    """Fire-and-forget in bursts of 100 (below engine.max_pending = 256): the sender waits for
    a burst's predictions on PUB before the next one."""
    proc, ep = forecast_engine
    name, steps, burst = "fc-push", 600, 100
    sig = (np.sin(0.11 * np.arange(steps)) + 0.3).astype(np.float32)
    sub = Subscriber(ep["pub"], (b"pred/" + name.encode(), b"stats"))
    push = PushClient(ep["pull"], stream=name)
    published = []
    try:
        wait_subscribed(sub)
        for start in range(0, steps, burst):
            for t in range(start, start + burst):      # the engine micro-batches what piles up
                assert push.send(sig[t:t + 1]) == t
            got = collect(sub, b"pred/" + name.encode(), burst, timeout_s=20)
            published += got
            assert len(got) == burst, f"burst at {start}: {len(got)} of {burst} predictions published"
        extra = collect(sub, b"pred/" + name.encode(), 1, timeout_s=0.5)
    finally:
        push.close()
        sub.close()
    assert proc.poll() is None
    assert [m["seq"] for m in published] == list(range(steps))
    assert all(m["type"] == "prediction" and m["stream"] == name for m in published)
    # 'step' is the engine's step count after the batched call: shared inside a micro-batch
    assert np.all(np.diff([m["step"] for m in published]) >= 0)
    assert extra == []
    losses = np.array([loss_value(m) for m in published])
    assert np.isnan(losses[0]) and np.all(np.isfinite(losses[1:]))
    np.testing.assert_allclose(losses[1:], (np.array([m.pred[0] for m in published])[:-1] - sig[1:]) ** 2,
                               rtol=1e-4, atol=1e-7)


def test_push_burst_within_hwm_is_delivered_completely(forecast_engine):
    proc, ep = forecast_engine
    name, steps = "fc-push-burst", 2000
    raws = [wire.data_message(name, t, np.array([np.sin(0.1 * t)], np.float32)) for t in range(steps)]
    sub = Subscriber(ep["pub"], (b"pred/" + name.encode(), b"stats"))
    push = PushClient(ep["pull"], stream=name)
    try:
        wait_subscribed(sub)
        for raw in raws:
            push.sock.send(raw)
        published = collect(sub, b"pred/" + name.encode(), steps, timeout_s=20, idle_s=2)
        # paced messages afterwards: the stream should still be served
        late = []
        for t in range(steps, steps + 3):
            push.sock.send(wire.data_message(name, t, np.array([0.5], np.float32)))
            late += collect(sub, b"pred/" + name.encode(), 1, timeout_s=1)
    finally:
        push.close()
        sub.close()
    assert proc.poll() is None
    assert [m["seq"] for m in published] == list(range(steps)), f"{len(published)} of {steps} published"
    assert [m["seq"] for m in late] == [steps, steps + 1, steps + 2]


def _good(stream, seq):
    return wire.data_message(stream, seq, np.array([0.25], np.float32))


def _data_map(stream, seq, **changes):
    msg = {"v": wire.VERSION, "type": "data", "stream": stream, "seq": seq,
           "x": wire.pack_array(np.array([0.25], np.float32))}
    msg.update(changes)
    return msgpack.packb(msg, use_bin_type=True)


def bad_messages(stream, seq):
    """(description, raw frame, expected error code); all refused before any state changes."""
    x = np.array([0.25], np.float32)
    return [
        ("not msgpack", b"\xc1\xc1 this is not msgpack", "not_msgpack"),
        ("empty frame", b"", "not_msgpack"),
        ("msgpack, not a map", msgpack.packb([1, 2, 3]), "bad_message"),
        ("wrong shape x", wire.data_message(stream, seq, np.zeros(3, np.float32)), "bad_shape"),
        ("2-d x", wire.data_message(stream, seq, np.zeros((1, 1), np.float32)), "bad_shape"),
        ("NaN x", wire.data_message(stream, seq, np.array([np.nan], np.float32)), "not_finite"),
        ("Inf x", wire.data_message(stream, seq, np.array([np.inf])), "not_finite"),
        ("wrong version", _data_map(stream, seq, v=2), "bad_version"),
        ("no version", msgpack.packb({"type": "data", "stream": stream, "seq": seq,
                                      "x": wire.pack_array(x)}, use_bin_type=True), "bad_version"),
        ("unknown type", _data_map(stream, seq, type="hello"), "bad_type"),
        ("unknown field", _data_map(stream, seq, extra=1), "unknown_field"),
        ("no x", msgpack.packb({"v": 1, "type": "data", "stream": stream, "seq": seq}), "missing_field"),
        ("negative seq", _data_map(stream, -1), "bad_seq"),
        ("empty stream id", _data_map("", seq), "bad_stream"),
        ("bad mode", _data_map(stream, seq, mode="train"), "bad_mode"),
        ("complex dtype", _data_map(stream, seq, x={"dtype": "<c8", "shape": [1], "data": b"\0" * 8}),
         "bad_dtype"),
        ("short data", _data_map(stream, seq, x={"dtype": "<f4", "shape": [1], "data": b"\0\0"}), "bad_array"),
        ("too large", b"\x00" * ((1 << 20) + 16), "too_large"),
    ]


def test_bad_input_gets_error_replies_and_engine_keeps_serving(forecast_engine):
    proc, ep = forecast_engine
    name = "bad-input"
    errors_sub = Subscriber(ep["pub"], (b"error", b"pred/bad-push", b"stats"))
    try:
        wait_subscribed(errors_sub)
        with SensorClient(ep["router"], stream=name) as c:
            seq = 0
            c.send_raw(_good(name, seq))
            assert c.recv()["seq"] == seq
            seq += 1
            cases = bad_messages(name, seq)
            for what, raw, code in cases:
                c.send_raw(raw)
                r = c.recv(raise_errors=False)
                assert r["type"] == "error", f"{what}: answered {r}"
                assert r["code"] == code, f"{what}: {r}"
                assert isinstance(r["message"], str) and r["message"]
                # the refused message used no sequence number: the same seq is accepted next
                c.send_raw(_good(name, seq))
                ok = c.recv(raise_errors=False)
                assert ok["type"] == "prediction" and ok["seq"] == seq, f"after {what}: {ok}"
                seq += 1
            # stream-level refusals name the stream and seq
            for bad_seq, code in ((seq - 1, "repeat"), (0, "repeat"), (seq + 5, "gap")):
                c.send_raw(_good(name, bad_seq))
                r = c.recv(raise_errors=False)
                assert (r["type"], r["code"], r["stream"], r["seq"]) == ("error", code, name, bad_seq)
            c.send_raw(_good(name, seq))
            assert c.recv()["seq"] == seq
            seq += 1

        # fire-and-forget: a refused message is reported on the PUB 'error' topic only, and the
        # stream's next good message (same seq) is answered on PUB
        push = PushClient(ep["pull"], stream="bad-push")
        try:
            push.sock.send(wire.data_message("bad-push", 0, np.array([np.nan], np.float32)))
            push.sock.send(_good("bad-push", 0))
            n_errors = len(cases) + 4
            published, push_preds, deadline = [], [], time.monotonic() + 20
            while (len(published) < n_errors or not push_preds) and time.monotonic() < deadline:
                got = errors_sub.recv(0.5)
                if got is not None and got[0] == b"error":
                    published.append(got[1])
                elif got is not None and got[0] == b"pred/bad-push":
                    push_preds.append(got[1])
        finally:
            push.close()
        # and the request/reply path still answers
        with SensorClient(ep["router"], stream=name) as c:
            c.send_raw(_good(name, seq))
            assert c.recv()["seq"] == seq
    finally:
        errors_sub.close()
    assert proc.poll() is None
    assert [(m["type"], m["stream"], m["seq"]) for m in push_preds] == [("prediction", "bad-push", 0)]
    # every refusal (request/reply and push) was also published on 'error'
    assert [m["code"] for m in published] == [code for _, _, code in cases] + ["repeat", "repeat", "gap",
                                                                               "not_finite"]
    assert all(m["type"] == "error" for m in published)


def test_sensor_client_recovers_after_a_refused_reading(forecast_engine):
    proc, ep = forecast_engine
    with SensorClient(ep["router"], stream="nan-sensor") as c:
        assert c.step(np.array([0.1], np.float32))["seq"] == 0
        with pytest.raises(EngineError) as e:
            c.step(np.array([np.nan], np.float32))         # a faulty reading is refused ...
        assert e.value.code == "not_finite"
        r = c.step(np.array([0.2], np.float32))            # ... the next good one should be answered
        assert r["type"] == "prediction"


# ---- 2: 64 concurrent streams from 4 processes -------------------------------------------------
MULTI = {
    "model": {"stack": "gru", "n_in": N_IN, "n_hidden": 12, "n_out": N_OUT, "seed": 3},
    "learning": {"algorithm": "d-rtrl", "mode": "supervised", "optimizer": "adam", "lr": 5e-3},
    "engine": {"slots": 64, "shared_weights": False, "micro_batch": 4, "max_pending": 256},
    "publish": {"weights_every": 0, "stats_every_s": 0.2, "predictions": False},
}
PROCS, PER_PROC, STEPS, WINDOW = 4, 16, 150, 6


def wait_for_batch_sizes(pub_endpoint, sizes, timeout=120.0):
    """Until the engine's stats say which step counts one call over all slots takes (an engine
    with subset calls: its loop program takes up to micro_batch at once), so that piled-up steps
    can share a call."""
    sub = Subscriber(pub_endpoint, (b"stats",))
    try:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            got = sub.recv(1.0)
            if got is not None and got[1].get("batch_sizes") == sizes:
                return
        raise AssertionError(f"the engine did not compile micro-batch sizes {sizes} within {timeout} s")
    finally:
        sub.close()


def reference_predictions(cfg, indices):
    """A single-stream learner per stream (same model config, algorithm, optimizer, lr)."""
    learner = build_learner(cfg)      # one stream, built as the engine builds each slot's model
    fresh = learner.state_dict()
    out = {}
    for i in indices:
        learner.load_state_dict(fresh)
        xs, ys = supervised_data(i, STEPS)
        out[i] = np.stack([learner.step(xs[t], ys[t]).prediction for t in range(STEPS)])
    return out


@pytest.mark.slow
def test_64_streams_from_4_processes_answered_once_and_equal_single_stream_learners(tmp_path):
    with running_engine(tmp_path, MULTI) as (proc, ep, cfg_path):
        cfg = load_config(cfg_path)
        assert (cfg.engine.slots, cfg.engine.shared_weights, cfg.learning.mode) == (64, False, "supervised")
        # a model per stream: every step is a call of the one-slot program (up to micro_batch
        # = 4 of a stream's queued steps in one tick); stats flow once the engine serves
        wait_for_batch_sizes(ep["pub"], [1])
        outs = [tmp_path / f"client-{p}.npz" for p in range(PROCS)]
        clients = [subprocess.Popen([sys.executable, str(HELPERS), "client", ep["router"], str(p), str(PER_PROC),
                                     str(STEPS), str(WINDOW), str(outs[p])],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                   for p in range(PROCS)]
        checked = [0, 21, 42, 63]
        try:
            ref = reference_predictions(cfg, checked)    # while the clients run
            logs = [cl.communicate(timeout=120)[0] for cl in clients]
        finally:
            for cl in clients:
                if cl.poll() is None:
                    cl.kill()
                    cl.wait()
        for p, cl in enumerate(clients):
            assert cl.returncode == 0, f"client {p} failed:\n{logs[p]}"
        assert proc.poll() is None

    preds, shared = {}, {}
    for p, out in enumerate(outs):
        res = np.load(out)
        errors, unexpected = json.loads(str(res["errors"])), json.loads(str(res["unexpected"]))
        assert errors == [], f"client {p}: error replies {errors[:5]}"
        assert unexpected == [], f"client {p}: replies for unknown (stream, seq) {unexpected[:5]}"
        names = [str(n) for n in res["names"]]
        assert names == [stream_name(p, j) for j in range(PER_PROC)]
        counts = res["counts"]
        assert counts.shape == (PER_PROC, STEPS)
        assert np.all(counts == 1), (f"client {p}: (stream, seq) answered {np.unique(counts)} times; "
                                     f"e.g. {[(names[j], s, counts[j, s]) for j, s in np.argwhere(counts != 1)[:5]]}")
        for j in range(PER_PROC):
            preds[p * PER_PROC + j] = res["preds"][j]
            # consecutive seqs with the same engine step count ran in one micro-batch
            shared[p * PER_PROC + j] = int(np.sum(np.diff(res["steps"][j]) == 0))
    assert len(preds) == PROCS * PER_PROC
    assert all(np.all(np.isfinite(v)) for v in preds.values())

    # pipelined streams pile up: the engine ran several steps of a stream in one tick, and the
    # replies still equal one step at a time
    assert sum(shared.values()) > 0
    for i in checked:
        assert ref[i].shape == preds[i].shape == (STEPS, N_OUT)
        assert ref[i].dtype == preds[i].dtype == np.float32
        np.testing.assert_allclose(preds[i], ref[i], rtol=1e-5, atol=1e-6,
                                   err_msg=f"stream {i}: engine replies differ from a single-stream learner")
    # per-stream models: the same learner fed another stream's data predicts differently
    assert not np.allclose(preds[checked[0]], preds[checked[1]], rtol=1e-3, atol=1e-3)
    # and the streams did learn: late error well below early error (summed over the checked streams)
    err = {i: np.mean((preds[i] - supervised_data(i, STEPS)[1]) ** 2, axis=1) for i in checked}
    assert sum(e[-30:].mean() for e in err.values()) < sum(e[:30].mean() for e in err.values())


# ---- 3: weights over PUB ------------------------------------------------------------------------
WEIGHTS = {
    "model": {"stack": "gru", "n_in": 1, "n_hidden": 8, "n_out": 1},
    "learning": {"algorithm": "d-rtrl", "mode": "forecast", "optimizer": "adam", "lr": 5e-3},
    "engine": {"slots": 2, "shared_weights": True, "micro_batch": 1},
    "publish": {"weights_every": 20, "stats_every_s": 3600.0, "predictions": False},
}


def test_weights_subscriber_rebuilds_engine_weights_exactly(tmp_path):
    steps, every = 200, WEIGHTS["publish"]["weights_every"]      # 2 streams x 200 = 20 updates
    sections = {**WEIGHTS, "checkpoint": {"dir": str(tmp_path / "ckpt"), "every": 150, "keep": 2}}
    sig = {"w-a": np.sin(0.07 * np.arange(steps)).astype(np.float32),
           "w-b": np.cos(0.05 * np.arange(steps)).astype(np.float32)}
    with running_engine(tmp_path, sections) as (proc, ep, cfg_path):
        ws = WeightsSubscriber(ep["pub"], ep["router"])
        try:
            ws.snapshot()
            v0, initial = ws.version, {n: v.copy() for n, v in ws.params.items()}
            time.sleep(0.5)              # let the SUB connection join before the first update
            with SensorClient(ep["router"], stream="w-a") as a, SensorClient(ep["router"], stream="w-b") as b:
                for t in range(steps):
                    assert a.step(sig["w-a"][t:t + 1])["seq"] == t
                    assert b.step(sig["w-b"][t:t + 1])["seq"] == t
            expected_version = v0 + 2 * steps // every
            deadline = time.monotonic() + 20
            while ws.version < expected_version and time.monotonic() < deadline:
                ws.poll(0.5)
            assert ws.version == expected_version
            assert not ws.poll(0.3), "a weights message beyond the last expected update"
            assert ws.snapshots == 1, "the subscriber lost an update and had to take a new snapshot"
            assert any(not np.array_equal(initial[n], ws.params[n]) for n in initial), "weights never moved"

            # a snapshot now: the same version (nothing moved since the last update), the same values
            with SensorClient(ep["router"], stream="w-probe") as c:
                snap = c.get_weights()
            assert (snap["type"], snap["kind"], snap["version"]) == ("weights", "snapshot", ws.version)
            assert set(snap["params"]) == set(ws.params)
            for n, v in snap["params"].items():
                assert v.dtype == ws.params[n].dtype and np.array_equal(v, ws.params[n]), n
        finally:
            ws.close()
        assert stop_gracefully(proc) == 0         # SIGTERM: drain, final checkpoint, exit 0

    ckpts = sorted((tmp_path / "ckpt").glob("ckpt-*.npz"))
    assert ckpts and ckpts[-1].name == f"ckpt-{2 * steps:012d}.npz", [p.name for p in ckpts]
    arrays, header = read_checkpoint(ckpts[-1])
    assert header["extra"]["steps"] == 2 * steps
    assert header["extra"]["version"] == ws.version
    assert {s: v["next_seq"] for s, v in header["extra"]["streams"].items()} == {"w-a": steps, "w-b": steps}
    ck = {n[len("params."):]: v for n, v in arrays.items() if n.startswith("params.")}
    assert ck and set(ck) == set(ws.params)
    for n, v in ck.items():
        assert v.shape == ws.params[n].shape and v.dtype == ws.params[n].dtype, n
        assert np.array_equal(v, ws.params[n]), f"parameter {n}: subscriber differs from the final checkpoint"
