"""Issue 8, engine items: one message never stops the engine, multi-part messages are bounded
in total, f8 values beyond float32 are not finite, every message is accounted for, nil
optional fields mean absent, and an idle-evicted stream resumes from its parked state."""
import os
import shutil
import tempfile
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from streamtrace import wire
from streamtrace.transport import SensorClient, Subscriber
from streamtrace.engine.launch import start_engine, stop, write_config
from streamtrace.engine import load_config
from streamtrace.engine.core import EngineCore
from streamtrace.engine.receive import recv_message

N_IN, N_OUT = 3, 2
HUGE_SHAPES = [[0, 2**62], [2**64 - 1, 0], [0, 2**62, 2**62], [2**62, 0, 1]]


def core_for(mode="supervised", clock=lambda: 0.0, **engine):
    n_out = N_IN if mode == "forecast" else N_OUT
    cfg = load_config(None, {"model": {"stack": "gru", "n_in": N_IN, "n_hidden": 4, "n_out": n_out},
                             "learning": {"mode": mode, "lr": 1e-2},
                             "engine": {"slots": 2, **engine}, "publish": {"weights_every": 0}})
    return EngineCore(cfg, clock=clock)


def good(stream, seq, rng, y=True, **fields):
    msg = {"type": "data", "stream": stream, "seq": seq,
           "x": wire.pack_array(rng.normal(size=N_IN).astype(np.float32))}
    if y:
        msg["y"] = wire.pack_array(rng.normal(size=N_OUT).astype(np.float32))
    msg.update(fields)
    return wire.encode(msg)


def replies(outs):
    return [wire.decode(raw) for kind, _, raw in outs if kind == "reply"]


def only_error(outs) -> dict:
    r = replies(outs)
    assert len(r) == 1 and r[0]["type"] == "error", r
    return r[0]


def snapshot(core):
    return core.learner.state_dict(), {n: (s.slot, s.next_seq, len(s.pending)) for n, s in core.streams.items()}


def assert_unchanged(core, before):
    state, streams = snapshot(core)
    assert streams == before[1]
    assert all(np.array_equal(state[k], before[0][k]) for k in before[0])


def balanced(core, queued=None):
    c = core.metrics.counters
    queued = sum(len(s.pending) for s in core.streams.values()) if queued is None else queued
    return c["received"] == c["answered"] + c["errors"] + queued


# ---- item 1: zero-and-huge shapes, and any failure on one message ------------------------------
def test_zero_and_huge_shapes_are_refused_and_change_nothing():
    core, rng = core_for(), np.random.default_rng(0)
    assert core.ingest(good("s", 0, rng), b"o") == []
    core.tick()
    for field in ("x", "y"):
        for shape in HUGE_SHAPES:
            before = snapshot(core)
            raw = wire.encode({"type": "data", "stream": "s", "seq": 1,
                               "x": wire.pack_array(np.zeros(N_IN, np.float32)),
                               "y": wire.pack_array(np.zeros(N_OUT, np.float32)),
                               field: {"dtype": "<f4", "shape": shape, "data": b""}})
            err = only_error(core.ingest(raw, b"o"))
            assert err["code"] == "bad_shape" and (err["stream"], err["seq"], err["expected"]) == ("s", 1, 1)
            assert_unchanged(core, before)
    assert core.ingest(good("s", 1, rng), b"o") == []      # seq 1 was not used up
    assert replies(core.tick())[0]["type"] == "prediction"
    assert balanced(core)


def test_a_failure_inside_the_engine_is_an_internal_error_reply(monkeypatch):
    core, rng = core_for(), np.random.default_rng(1)
    assert core.ingest(good("s", 0, rng), b"o") == []
    core.tick()
    before = snapshot(core)
    real = wire.decode_data

    def broken(msg, *a, **k):
        if msg.get("stream") == "boom":
            raise RuntimeError("simulated defect")
        return real(msg, *a, **k)
    monkeypatch.setattr(wire, "decode_data", broken)
    for _ in range(3):
        outs = core.ingest(good("boom", 0, rng), b"b")
        assert only_error(outs)["code"] == "internal"
        assert [k for k, dest, _ in outs if k == "pub" and dest == b"error"]
    assert core.metrics.errors_by_code["internal"] == 3
    assert_unchanged(core, before)
    assert balanced(core)
    assert core.ingest(good("s", 1, rng), b"o") == []
    assert replies(core.tick())[0]["seq"] == 1


# ---- item 5: f8 beyond float32 ---------------------------------------------------------------
def test_f8_beyond_float32_is_not_finite_and_uses_no_seq():
    core, rng = core_for(), np.random.default_rng(2)
    assert core.ingest(good("s", 0, rng), b"o") == []
    core.tick()
    seq = 1
    for field in ("x", "y"):
        for value in (1e300, -1e300, 3.5e38, float(np.finfo(np.float32).max)):
            before = snapshot(core)
            a = np.zeros(N_IN if field == "x" else N_OUT, "<f8")
            a[1] = value
            raw = wire.encode({"type": "data", "stream": "s", "seq": seq, "x": wire.pack_array(np.zeros(N_IN, "<f8")),
                               "y": wire.pack_array(np.zeros(N_OUT, "<f8")), field: wire.pack_array(a)})
            outs = core.ingest(raw, b"o")
            if value == float(np.finfo(np.float32).max):      # the largest float32 is still a number
                assert outs == []
                assert replies(core.tick())[0]["seq"] == seq
                seq += 1
                continue
            err = only_error(outs)
            assert err["code"] == "not_finite" and err["expected"] == seq
            assert_unchanged(core, before)
            assert core.ingest(good("s", seq, rng), b"o") == []     # its seq was not used up
            core.tick()
            seq += 1


# ---- item 6: nil optional fields, get_weights over PULL, accounting ---------------------------------
def test_nil_optional_fields_mean_absent():
    """ts, mode and y as nil give exactly what leaving them out gives (y absent in supervised
    mode: predicted, not learned); a nil x is a missing x."""
    rng = np.random.default_rng(3)
    xs = rng.normal(size=(6, N_IN)).astype(np.float32)
    ys = rng.normal(size=(6, N_OUT)).astype(np.float32)
    cores, preds = [core_for(), core_for()], [[], []]
    for t in range(6):
        base = {"type": "data", "stream": "s", "seq": t, "x": wire.pack_array(xs[t])}
        with_y = {**base, "y": wire.pack_array(ys[t])}
        plain = with_y if t % 2 == 0 else base
        nil = {**plain, "ts": None, "mode": None} if t % 2 == 0 else {**base, "y": None, "ts": None, "mode": None}
        for i, m in enumerate((plain, nil)):
            assert cores[i].ingest(wire.encode(m), b"o") == []
            preds[i].append(replies(cores[i].tick())[0])
    for a, b in zip(*preds):
        assert a["pred"] == b["pred"] and a["loss"] == b["loss"]
    assert preds[1][1]["loss"] is None and preds[1][0]["loss"] is not None
    a, b = cores[0].learner.state_dict(), cores[1].learner.state_dict()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    err = only_error(cores[0].ingest(wire.encode({"type": "data", "stream": "s", "seq": 6, "x": None}), b"o"))
    assert err["code"] == "missing_field"


def test_get_weights_over_pull_is_refused_and_counted():
    core = core_for()
    outs = core.ingest(wire.encode({"type": "get_weights"}), None)
    assert [(k, d) for k, d, _ in outs] == [("pub", b"error")]
    err = wire.decode(outs[0][2])
    assert err["code"] == "bad_type" and "ROUTER" in err["message"]
    snap = replies(core.ingest(wire.encode({"type": "get_weights"}), b"r"))
    assert snap[0]["type"] == "weights" and snap[0]["kind"] == "snapshot"
    c = core.metrics.counters
    assert (c["received"], c["answered"], c["errors"]) == (2, 1, 1)


def _mixed_message(rng, core, streams):
    """A random message: good data, get_weights over either socket, or one of many bad kinds."""
    r = rng.random()
    name = streams[rng.integers(len(streams))]
    st = core.streams.get(name)
    seq = st.next_seq if st is not None and st.next_seq is not None else 0
    origin = None if rng.random() < 0.3 else b"o"
    if r < 0.35:
        return good(name, seq, rng, y=rng.random() < 0.8), origin
    if r < 0.42:
        return wire.encode({"type": "get_weights"}), origin
    bad = [
        lambda: rng.bytes(int(rng.integers(0, 40))),
        lambda: good(name, seq, rng, x={"dtype": "<f4", "shape": HUGE_SHAPES[rng.integers(4)], "data": b""}),
        lambda: good(name, seq, rng, x=wire.pack_array(np.full(N_IN, 1e300))),
        lambda: good(name, seq + 5, rng),                      # gap
        lambda: good(name, max(seq - 1, 0), rng) if seq else b"\xc1",   # repeat (or not msgpack)
        lambda: good(f"other{rng.integers(9)}", 0, rng),       # no_slot once both slots are taken
        lambda: good(name, seq, rng, ts="now"),
        lambda: wire.encode({"type": "weights"}),
        lambda: msgpack.packb({"v": 2, "type": "data"}),
        lambda: b"\x81" + rng.bytes(10),
    ]
    return bad[rng.integers(len(bad))](), origin


def test_every_message_is_accounted_for_over_a_mixed_fuzz_batch():
    core, rng = core_for(max_pending=3, micro_batch=2), np.random.default_rng(4)
    streams = ["a", "b"]
    for s in streams:
        core.ingest(good(s, 0, rng), b"o")
    n_msgs = 2
    for i in range(600):
        raw, origin = _mixed_message(rng, core, streams)
        core.ingest(raw, origin)
        n_msgs += 1
        assert balanced(core), (i, core.metrics.counters)
        if rng.random() < 0.2:
            core.tick()
            assert balanced(core)
    while core.has_pending():
        core.tick()
    c = core.metrics.counters
    assert c["received"] == n_msgs == c["answered"] + c["errors"]
    assert sum(core.metrics.errors_by_code.values()) == c["errors"]
    assert {"bad_shape", "not_finite", "gap", "no_slot", "bad_type", "overloaded"} <= set(core.metrics.errors_by_code)


# ---- item 7: parking ------------------------------------------------------------------------------
def _forecast_xs(n, seed):
    return np.sin(0.3 * np.arange(n)[:, None] + np.arange(N_IN) + seed).astype(np.float32)


def _send(core, name, seq, x):
    outs = core.ingest(wire.data_message(name, seq, x), b"o")
    assert outs == [], replies(outs)
    r = replies(core.tick())
    assert len(r) == 1 and r[0]["type"] == "prediction" and (r[0]["stream"], r[0]["seq"]) == (name, seq)
    return r[0]


def test_an_evicted_stream_resumes_exactly_where_it_left_off():
    """Stream A is evicted while idle (its slot goes to C), later returns into the other slot
    (evicting B): its predictions equal those of a stream that was never interrupted, fed the
    same data (a reference engine with A alone). Per-stream weights, so Adam state and step
    counters must come back too."""
    now = [0.0]
    core = core_for("forecast", clock=lambda: now[0], idle_timeout_s=10.0, park_s=100.0)
    ref = core_for("forecast")
    xa, other = _forecast_xs(12, 0), _forecast_xs(12, 5)
    got, want = [], [_send(ref, "A", t, xa[t]) for t in range(12)]
    for t in range(5):
        got.append(_send(core, "A", t, xa[t]))
        _send(core, "B", t, other[t])
    slot_a = core.streams["A"].slot
    now[0] = 5.0
    _send(core, "B", 5, other[5])
    now[0] = 12.0                      # A idle 12 s: evicted and parked for newcomer C
    _send(core, "C", 0, other[0])
    assert "A" not in core.streams and core.streams["C"].slot == slot_a
    assert core.metrics.counters["parked"] == 1
    now[0] = 20.0
    before = snapshot(core)
    for wrong in (0, 4, 6):            # the parked stream keeps its seq
        err = only_error(core.ingest(wire.data_message("A", wrong, xa[5]), b"o"))
        assert err["code"] in ("repeat", "gap") and err["expected"] == 5
    assert_unchanged(core, before)
    for t in range(5, 12):             # B idle 15 s gives A its slot, the other one
        got.append(_send(core, "A", t, xa[t]))
    assert core.streams["A"].slot != slot_a and core.metrics.counters["unparked"] == 1
    for a, b in zip(got, want):
        assert a["pred"] == b["pred"] and a["loss"] == b["loss"], a["seq"]
    assert all(g["loss"] is not None for g in got[1:])


def test_idle_streams_free_their_slots_and_forget_their_stats():
    """A stream idle past engine.idle_timeout_s gives its slot to a newcomer (whose slot is
    reset), and its per-stream loss leaves the stats."""
    now = [0.0]
    cfg = load_config(None, {"model": {"stack": "gru", "n_hidden": 4}, "learning": {"mode": "forecast"},
                             "engine": {"slots": 1, "idle_timeout_s": 10.0}, "publish": {"weights_every": 0}})
    core = EngineCore(cfg, clock=lambda: now[0])
    for i in range(3):
        assert core.ingest(wire.data_message("old", i, np.float32([0.5 * i])), b"o") == []
        core.tick()
    assert "old" in core.metrics.stream_loss
    refused = core.ingest(wire.data_message("new", 0, np.float32([1.0])), b"o")
    assert [wire.decode(raw)["code"] for kind, _, raw in refused if kind == "reply"] == ["no_slot"]
    now[0] = 11.0
    assert core.ingest(wire.data_message("new", 0, np.float32([1.0])), b"o") == []
    assert set(core.streams) == {"new"} and "old" not in core.metrics.stream_loss
    h = core.learner.state_dict()["hidden.cell.h"]
    assert np.all(h == 0), "the newcomer's slot starts from a fresh hidden state"


def test_after_park_expiry_a_stream_starts_fresh_and_its_seq_restarts():
    now = [0.0]
    core = core_for("forecast", clock=lambda: now[0], idle_timeout_s=10.0, park_s=30.0, slots=1)
    fresh = core_for("forecast", slots=1)
    xs = _forecast_xs(8, 1)
    for t in range(4):
        _send(core, "A", t, xs[t])
    now[0] = 11.0
    _send(core, "B", 0, xs[0])         # A parked
    now[0] = 11.0 + 31.0               # B idle (parked); A's parking expired
    first = _send(core, "A", 0, xs[5])
    assert first["pred"] == _send(fresh, "A", 0, xs[5])["pred"]
    assert core.streams["A"].next_seq == 1


def test_parking_keeps_a_bounded_number_of_streams_and_can_be_off():
    now = [0.0]
    core = core_for("forecast", clock=lambda: now[0], idle_timeout_s=1.0, max_parked=2, slots=1)
    xs = _forecast_xs(2, 2)
    for i in range(5):
        now[0] = 2.0 * i
        _send(core, f"s{i}", 0, xs[0])
    assert len(core.parking) == 2 and core.metrics.counters["park_dropped"] == 2
    now[0] = 100.0
    err = only_error(core.ingest(wire.data_message("s3", 0, xs[1]), b"o"))
    assert err["code"] == "repeat"      # s3 is parked: its seq goes on from 1
    _send(core, "s0", 0, xs[1])        # s0 was dropped: it starts over
    off = core_for("forecast", clock=lambda: now[0], idle_timeout_s=1.0, park_s=0.0, slots=1)
    now[0] = 0.0
    _send(off, "a", 0, xs[0])
    now[0] = 2.0
    _send(off, "b", 0, xs[0])
    now[0] = 4.0
    _send(off, "a", 0, xs[1])          # parking off: a returning stream starts fresh
    assert len(off.parking) == 0


@pytest.mark.parametrize("shared", [False, True], ids=["per-slot", "shared"])
def test_learner_slot_read_and_write_move_exactly_one_slot(shared):
    """write_slot(1, read_slot(0)) makes slot 1's per-slot leaves equal slot 0's (all leaves
    with per-slot weights; hidden, traces, pending input, transform statistics, readout, screen
    statistics, rollback counts, loss and rolling metrics with shared weights) and
    changes nothing else; checked on state_dict, not on the slot functions themselves."""
    from streamtrace.recipe.build import build_learner
    cfg = load_config(None, {"model": {"stack": "gru", "n_in": N_IN, "n_hidden": 4, "n_out": N_IN}, "learning": {"mode": "forecast"}})
    L = build_learner(cfg, slots=3, shared_weights=shared)
    rng = np.random.default_rng(7)
    for _ in range(3):
        L.step(rng.normal(size=(3, N_IN)).astype(np.float32))
    before = L.state_dict()
    L.write_slot(1, L.read_slot(0))
    after = L.state_dict()
    per_slot = [k for k in before if not shared or k.split(".")[0] in ("hidden", "traces", "pending", "signal", "readout",
                                                                        "screen", "rollback")
                or k in ("stats.preq_sum", "stats.preq_n") or k.startswith("stats.roll.")]
    assert any(k.startswith("traces.") for k in per_slot) and any(k.startswith("hidden.") for k in per_slot)
    for k in before:
        if k in per_slot:
            assert np.array_equal(after[k][1], before[k][0]), k
            assert np.array_equal(np.delete(after[k], 1, 0), np.delete(before[k], 1, 0)), k
        else:
            assert np.array_equal(after[k], before[k]), k
    assert any(not np.array_equal(before[k][1], before[k][0]) for k in per_slot)
    with pytest.raises(ValueError, match="slot layout"):
        L.write_slot(0, {"hidden": {}})
    with pytest.raises(IndexError):
        L.read_slot(3)


# ---- item 2: framing, in-process over inproc ----------------------------------------------------
@pytest.fixture
def router_pair():
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    router.bind("inproc://r")
    dealer.connect("inproc://r")
    pull.bind("inproc://p")
    push.connect("inproc://p")
    yield router, dealer, pull, push
    for s in (router, dealer, pull, push):
        s.close(0)
    ctx.term()


def _recv(sock, routed, limit=1000):
    assert sock.poll(2000)
    return recv_message(sock, routed=routed, max_bytes=limit)


@pytest.mark.parametrize("frames, payload, code", [
    ([b"msg"], b"msg", None), ([b"", b"msg"], b"msg", None), ([b"x", b"msg"], None, "bad_frames"),
    ([b"", b"msg", b"more"], None, "bad_frames"), ([b""] * 5, None, "bad_frames"),
    ([b"", b"a" * 1001], None, "too_large"), ([b"a" * 600, b"a" * 600], None, "too_large"),
    ([b"", b"a" * 1000], b"a" * 1000, None)])
def test_recv_message_bounds_frames_and_total_size(router_pair, frames, payload, code):
    router, dealer, pull, push = router_pair
    dealer.send_multipart(frames)
    m = _recv(router, True)
    assert m.identity and m.payload == payload and (m.error and m.error[0]) == code
    push.send_multipart(frames[-1:] if payload is not None and len(frames) == 1 else frames)
    m = _recv(pull, False)
    assert (m.error is None) == (len(frames) == 1 and payload is not None)
    dealer.send(b"next")               # the stream of messages stays in step
    assert _recv(router, True).payload == b"next"
    push.send(b"next")
    assert _recv(pull, False).payload == b"next"


# ---- through the ZeroMQ server (one engine process) -------------------------------------------------
def _rss_bytes(pid) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _settled_rss(pid, timeout_s: float = 60.0) -> int:
    """The process's RSS once two reads 1 s apart differ by under 5 MB (its warm-up done)."""
    last, end = _rss_bytes(pid), time.monotonic() + timeout_s
    while time.monotonic() < end:
        time.sleep(1.0)
        now = _rss_bytes(pid)
        if abs(now - last) < 5e6:
            return now
        last = now
    return last


@pytest.fixture(scope="module")
def engine():
    work = Path(tempfile.mkdtemp(prefix="st-h8-", dir="/tmp"))
    ep = {"router": f"ipc://{work}/r", "pull": f"ipc://{work}/p", "pub": f"ipc://{work}/b"}
    sections = {"model": {"stack": "gru", "n_in": N_IN, "n_hidden": 4, "n_out": N_OUT},
                "learning": {"mode": "supervised"}, "engine": {"slots": 2, "micro_batch": 1},
                "sockets": ep, "publish": {"weights_every": 0, "stats_every_s": 0.5}}
    proc = start_engine(write_config(work / "engine.toml", sections))
    try:
        yield proc, ep
    finally:
        stop(proc)
        shutil.rmtree(work, ignore_errors=True)


def test_server_survives_zero_and_huge_shapes(engine):
    proc, ep = engine
    rng = np.random.default_rng(5)
    with SensorClient(ep["router"], stream="shapes", timeout_s=30) as c:
        for shape in HUGE_SHAPES:
            c.send_raw(good("shapes", 0, rng, x={"dtype": "<f8", "shape": shape, "data": b""}))
            r = c.recv(raise_errors=False)
            assert (r["type"], r["code"]) == ("error", "bad_shape")
        assert proc.poll() is None
        assert c.step(rng.normal(size=N_IN), rng.normal(size=N_OUT))["seq"] == 0


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="RSS read from /proc")
def test_server_refuses_multipart_floods_without_keeping_the_memory(engine):
    proc, ep = engine
    rng = np.random.default_rng(6)
    big = b"\x01" * (2 << 20)          # each frame within ZeroMQ's per-frame limit
    with SensorClient(ep["router"], stream="flood", timeout_s=60) as c:
        c.step(rng.normal(size=N_IN), rng.normal(size=N_OUT))
        c.sock.send_multipart([b""] + [big] * 5 + [good("flood", c.seq, rng)], copy=False)
        assert c.recv(raise_errors=False)["type"] == "error"
        base = _settled_rss(proc.pid)          # after the engine's warm-up (it compiles on a thread)
        for _ in range(2):
            c.sock.send_multipart([b""] + [big] * 100 + [good("flood", c.seq, rng)], copy=False)
            r = c.recv(raise_errors=False)
            assert r["type"] == "error" and r["code"] in ("too_large", "bad_frames"), r
            growth = _rss_bytes(proc.pid) - base
            # a kept flood is 200 MB each (the old receive: +208 MB, then +409 MB); the bound
            # leaves room for the allocator and the engine's own warm-up between messages
            assert growth < 150e6, f"engine RSS grew by {growth / 1e6:.0f} MB"
        # a normal message afterwards is answered, at the seq the refused one did not use
        assert c.step(rng.normal(size=N_IN), rng.normal(size=N_OUT))["seq"] == 1
    # over PULL: a multi-part message and a get_weights are refused on the PUB error topic
    sub = Subscriber(ep["pub"], (b"error", b"stats"))
    ctx = zmq.Context.instance()
    push = ctx.socket(zmq.PUSH)
    push.connect(ep["pull"])
    try:
        stats = None
        while stats is None:                 # subscribed once the stats come through
            got = sub.recv(timeout_s=10)
            assert got is not None
            stats = got[1] if got[0] == b"stats" else None
        push.send_multipart([good("pushed", 0, rng), b"second"])
        push.send(wire.encode({"type": "get_weights"}))
        codes = []
        while len(codes) < 2:
            got = sub.recv(timeout_s=10)
            assert got is not None
            if got[0] == b"error":
                codes.append(got[1]["code"])
        assert sorted(codes) == ["bad_frames", "bad_type"]
        # every message accounted for, seen from outside (stats taken after the refusals above)
        while "bad_type" not in stats["errors_by_code"] or stats["received"] != stats["answered"] + stats["errors"]:
            got = sub.recv(timeout_s=5)
            assert got is not None
            stats = got[1] if got[0] == b"stats" else stats
        by_code = stats["errors_by_code"]
        assert by_code.get("bad_frames", 0) + by_code.get("too_large", 0) == 4
    finally:
        push.close(0)
        sub.close()
    assert proc.poll() is None
