"""Hostile input against the engine: malformed, oversize, non-finite, out-of-order and otherwise
refused messages interleaved with good ones. The engine never raises, answers every refused
message with exactly one error (to its sender and on the PUB "error" topic), answers every good
message with exactly one prediction, and ends in exactly the learner state it reaches when fed
only the good messages in the same batching pattern."""
import math
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from streamtrace import wire
from streamtrace.transport import SensorClient
from streamtrace.engine.launch import start_engine, stop, write_config
from streamtrace.engine import load_config
from streamtrace.engine.core import EngineCore

N_IN, N_HIDDEN, N_OUT = 3, 8, 2
SLOTS, MICRO_BATCH, MAX_PENDING = 4, 2, 3
MAX_BYTES = 32768
STREAMS = [f"s{i}" for i in range(SLOTS)]          # fill every slot: any other name is "no_slot"

CODES = {"bad_frame", "not_msgpack", "bad_message", "bad_version", "bad_type", "too_large",
         "unknown_field", "missing_field", "bad_stream", "bad_seq", "bad_ts", "bad_mode", "bad_array",
         "bad_dtype", "bad_shape", "not_finite", "repeat", "gap", "no_slot", "overloaded", "bad_frames"}

SECTIONS = {
    "model": {"stack": "gru", "n_in": N_IN, "n_hidden": N_HIDDEN, "n_out": N_OUT},
    "learning": {"mode": "supervised", "lr": 1e-2},
    "engine": {"slots": SLOTS, "micro_batch": MICRO_BATCH, "max_pending": MAX_PENDING,
               "max_message_bytes": MAX_BYTES},
    "publish": {"weights_every": 50},
}

P_GOOD, P_TICK = 0.13, 0.03          # per event: a good message; a tick (the server's batching)

GOOD_DTYPES = ["<f4", "<f4", "<f4", "<f8", "<f2", "<i4", "<i8", "<i2", "|i1", "|u1", "<u2", "<u4"]


def make_core():
    # a frozen clock: no stream ever goes idle, so refusals and evictions are deterministic
    return EngineCore(load_config(None, SECTIONS), clock=lambda: 0.0)


def _pack(msg) -> bytes:
    """msgpack as is (no version added): for maps that must lack or break 'v'."""
    return msgpack.packb(msg, use_bin_type=True)


def _array(rng, shape, dtype=None):
    dtype = dtype or GOOD_DTYPES[rng.integers(len(GOOD_DTYPES))]
    dt = np.dtype(dtype)
    if dt.kind == "f":
        a = rng.normal(size=shape)
    else:
        a = rng.integers(0, 4, size=shape)
    return np.asarray(a, dtype=dt)


class Fuzzer:
    """Generates good and bad messages while tracking what the engine must do with each
    (its own model of seq numbers, queues and slots: the oracle)."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.next_seq = {s: None for s in STREAMS}
        self.pending = {s: 0 for s in STREAMS}
        self.bad_kinds = [m for m in dir(self) if m.startswith("bad_")]

    # ---- good ---------------------------------------------------------------------------
    def good_fields(self, stream, seq):
        rng = self.rng
        msg = {"type": "data", "stream": stream, "seq": int(seq), "x": wire.pack_array(_array(rng, (N_IN,)))}
        r = rng.random()
        if r < 0.8:
            msg["y"] = wire.pack_array(_array(rng, (N_OUT,)))
        elif r < 0.9:
            msg["y"] = None                              # explicit nil: predicted, not learned
        if rng.random() < 0.7:
            msg["ts"] = float(rng.normal()) if rng.random() < 0.8 else int(rng.integers(0, 1 << 40))
        elif rng.random() < 0.3:
            msg["ts"] = None                             # nil optional fields mean absent
        if rng.random() < 0.3:
            msg["mode"] = "predict" if rng.random() < 0.5 else "learn"
        elif rng.random() < 0.1:
            msg["mode"] = None
        return msg

    def good(self, stream):
        seq = self.next_seq[stream]
        if seq is None:
            seq = int(self.rng.integers(0, 1000))          # the first message sets the base
        msg = self.good_fields(stream, seq)
        keys = list(msg)
        self.rng.shuffle(keys)                             # field order does not matter
        raw = wire.encode({k: msg[k] for k in keys})
        if self.rng.random() < 0.05:
            raw = bytearray(raw)
        self.next_seq[stream] = seq + 1
        self.pending[stream] += 1
        return raw, ("good", stream, seq)

    def tick(self):
        busy = [s for s in STREAMS if self.pending[s]]
        if not busy:
            return
        k = MICRO_BATCH if max(self.pending[s] for s in busy) > 1 else 1
        for s in busy:
            self.pending[s] -= min(self.pending[s], k)

    # ---- helpers for bad ones -----------------------------------------------------------
    def started(self):
        return [s for s in STREAMS if self.next_seq[s] is not None]

    def base_msg(self, **change):
        """A data message for a live stream at its expected seq, good but for the changes: were
        a defect let through, the message would be learned from and the final comparison of
        learner states would show it."""
        s = STREAMS[self.rng.integers(SLOTS)]
        msg = self.good_fields(s, self.next_seq[s] if self.next_seq[s] is not None else 0)
        msg.update(change)
        return {k: v for k, v in msg.items() if v is not _DROP}

    def text(self, n):
        return "".join(chr(c) for c in self.rng.integers(32, 0x2FF, size=n))

    def rand_obj(self, depth=0):
        rng = self.rng
        t = rng.integers(0, 9 if depth < 3 else 6)
        if t == 0:
            return None
        if t == 1:
            return bool(rng.integers(2))
        if t == 2:
            return [0, 1, -1, 2**31, -2**63, 2**64 - 1, 2**62, int(rng.integers(-1000, 1000))][rng.integers(8)]
        if t == 3:
            return [0.0, -0.0, np.nan, np.inf, -np.inf, 1e308, float(rng.normal())][rng.integers(7)]
        if t == 4:
            return self.text(int(rng.integers(0, 10)))
        if t == 5:
            return rng.bytes(int(rng.integers(0, 20)))
        if t == 6:
            return [self.rand_obj(depth + 1) for _ in range(rng.integers(0, 5))]
        keys = sorted(wire.DATA_FIELDS) + ["dtype", "shape", "data", "foo"] if t == 8 else None
        n = int(rng.integers(0, 6))
        return {(keys[rng.integers(len(keys))] if keys else self.text(3)): self.rand_obj(depth + 1)
                for _ in range(n)}

    # ---- bad: each returns (raw, expected code or None for "any known code") --------------
    def bad_random_bytes(self):
        return self.rng.bytes(int(self.rng.integers(0, 300))), None

    def bad_random_msgpack_prefix(self):   # a map header followed by noise: deeper into the parser
        head = bytes([0x80 | int(self.rng.integers(1, 16))])
        return head + self.rng.bytes(int(self.rng.integers(0, 100))), None

    def bad_oversize_bytes(self):
        return self.rng.bytes(MAX_BYTES + int(self.rng.integers(1, 3000))), "too_large"

    def bad_oversize_message(self):        # a good-looking data message with a big padding field
        msg = self.base_msg()
        msg["pad"] = b"\0" * MAX_BYTES
        return wire.encode(msg), "too_large"

    def bad_truncated(self):
        raw = wire.encode(self.base_msg())
        return raw[:int(self.rng.integers(0, len(raw)))], "not_msgpack"

    def bad_trailing_junk(self):
        return wire.encode(self.base_msg()) + self.rng.bytes(int(self.rng.integers(1, 20))), "not_msgpack"

    def bad_not_a_map(self):
        obj = self.rand_obj()
        while isinstance(obj, dict):
            obj = self.rand_obj()
        return _pack(obj), "bad_message"

    def bad_random_map(self):
        obj = self.rand_obj(depth=2)
        obj = obj if isinstance(obj, dict) else {}
        if self.rng.random() < 0.5:
            obj["v"] = 1
            if self.rng.random() < 0.5:
                obj["type"] = "data"
        if obj.get("type") == "get_weights":
            obj["type"] = "data"
        obj.pop("x", None)          # never a valid data message
        return _pack(obj), None

    def bad_version(self):
        v = [0, 2, -1, 2**64 - 1, "1", "v1", None, [1], {"v": 1}, b"\x01", 1.5, False, _DROP][self.rng.integers(13)]
        msg = {"v": v, **self.base_msg()}
        if v is _DROP:
            del msg["v"]
        return _pack(msg), "bad_version"

    def bad_non_str_key(self):
        msg = {1: 2, **{"v": 1}, **self.base_msg()} if self.rng.random() < 0.5 else {"v": 1, (1, 2): 3}
        return _pack(msg), "not_msgpack"

    def bad_ext_type(self):
        ext = msgpack.ExtType(int(self.rng.integers(0, 127)), self.rng.bytes(4))
        if self.rng.random() < 0.5:
            ext = msgpack.Timestamp(int(self.rng.integers(0, 2**31)), 0)
        return wire.encode(self.base_msg(ts=ext)), "not_msgpack"

    def bad_deep_nesting(self):
        depth = int(self.rng.integers(2000, MAX_BYTES - 10))
        return b"\x91" * depth + b"\xc0", "not_msgpack"

    def bad_huge_map(self):
        return _pack({"v": 1, **{str(i): 0 for i in range(4100)}}), "not_msgpack"

    def bad_invalid_utf8(self):
        # a msgpack str (fixstr 0xa3) whose bytes are not UTF-8, as the stream id
        raw = wire.encode(self.base_msg(stream="\x01\x02\x03"))
        return raw.replace(b"\xa3\x01\x02\x03", b"\xa3\xff\xfe\xc3"), "not_msgpack"

    def bad_type_missing(self):
        msg = self.base_msg(type=[None, 5, b"data", ["data"], {}, True, _DROP][self.rng.integers(7)])
        return wire.encode(msg), "bad_message"

    def bad_type_unknown(self):
        kind = ["Data", "DATA", "", "prediction", "error", "weights", "stats", "data ", "getweights",
                self.text(5)][self.rng.integers(10)]
        return wire.encode(self.base_msg(type=kind)), "bad_type"

    def bad_unknown_field(self):
        name = ["extra", "pred", "X", "v2", "", "streams", self.text(4)][self.rng.integers(7)]
        if name in wire.DATA_FIELDS:
            name = "extra"
        msg = self.base_msg()
        msg[name] = self.rand_obj(depth=2)
        return wire.encode(msg), "unknown_field"

    def bad_stream(self):
        s = ["", "x" * (wire.MAX_STREAM_ID + 1), "a\nb", "a\x00b", "\x7f", "\u2028", 5, -1, 1.5, None, True,
             b"s0", ["s0"], {"s": 0}, _DROP][self.rng.integers(15)]
        return wire.encode(self.base_msg(stream=s)), "bad_stream"

    def bad_seq(self):
        seq = [-1, -2**63, 1 << 62, 2**64 - 1, 1.0, 0.5, float("nan"), "1", b"1", None, True, False, [1],
               {}, _DROP][self.rng.integers(15)]
        return wire.encode(self.base_msg(seq=seq)), "bad_seq"

    def bad_ts(self):
        ts = [float("nan"), float("inf"), float("-inf"), "now", b"1", True, [1.0], {}][self.rng.integers(8)]
        return wire.encode(self.base_msg(ts=ts)), "bad_ts"

    def bad_mode(self):
        mode = ["train", "", "LEARN", 1, True, ["learn"], b"learn", {}][self.rng.integers(8)]
        return wire.encode(self.base_msg(mode=mode)), "bad_mode"

    def bad_missing_x(self):
        return wire.encode(self.base_msg(x=_DROP)), "missing_field"

    def _bad_field(self):
        return "x" if self.rng.random() < 0.5 else "y"

    def bad_array_structure(self):
        n = N_IN if (f := self._bad_field()) == "x" else N_OUT
        good = wire.pack_array(np.zeros(n, np.float32))
        arr = [
            [0.0] * n, "0,0,0", 5, None if f == "x" else [], b"\0" * 4 * n,
            {**good, "extra": 1}, {"dtype": "<f4", "shape": [n]},
            {**good, "data": list(good["data"])}, {**good, "data": "abcd" * n},
            {**good, "data": good["data"][:-1]}, {**good, "data": good["data"] + b"\0"},
        ][self.rng.integers(11)]
        if arr is None:
            arr = {}
        return wire.encode(self.base_msg(**{f: arr})), "bad_array"

    def bad_dtype(self):
        n = N_IN if (f := self._bad_field()) == "x" else N_OUT
        dtypes = [">f4", "<c8", "|b1", "|O", "<U1", "float32", "f4", "<f16", 5, None, ["<f4"], b"<f4"]
        dtype = dtypes[self.rng.integers(len(dtypes))]
        return wire.encode(self.base_msg(**{f: {"dtype": dtype, "shape": [n], "data": b"\0" * 4 * n}})), "bad_dtype"

    def bad_shape_malformed(self):
        f = self._bad_field()
        shape = [[-1], [True, True], [1.0], "3", 3, None, [1] * 9, [[3]], [2**64 - 1, -5]][self.rng.integers(9)]
        return wire.encode(self.base_msg(**{f: {"dtype": "<f4", "shape": shape, "data": b""}})), "bad_shape"

    def bad_shape_wrong_for_model(self):
        n = N_IN if (f := self._bad_field()) == "x" else N_OUT
        shape = [(n + 1,), (n - 1,), (n, 1), (1, n), (), (0,), (2, n, 1)][self.rng.integers(7)]
        return wire.encode(self.base_msg(**{f: wire.pack_array(_array(self.rng, shape))})), "bad_shape"

    def bad_too_many_elements(self):
        f = self._bad_field()
        shape = [[1 << 21], [1 << 11, 1 << 11], [2**40]][self.rng.integers(3)]
        return wire.encode(self.base_msg(**{f: {"dtype": "<f4", "shape": shape, "data": b""}})), "too_large"

    def bad_not_finite(self):
        n = N_IN if (f := self._bad_field()) == "x" else N_OUT
        a = _array(self.rng, (n,), ["<f4", "<f8", "<f2"][self.rng.integers(3)])
        a[self.rng.integers(n)] = [np.nan, np.inf, -np.inf][self.rng.integers(3)]
        return wire.encode(self.base_msg(**{f: wire.pack_array(a)})), "not_finite"

    def bad_float16_inf(self):       # +inf spelled as raw float16 bits
        return wire.encode(self.base_msg(x={"dtype": "<f2", "shape": [N_IN],
                                            "data": np.full(N_IN, 0x7C00, "<u2").tobytes()})), "not_finite"

    def bad_repeat(self):
        started = self.started()
        s = started[self.rng.integers(len(started))]
        back = [1, 1, 2, 10, self.next_seq[s]][self.rng.integers(5)]
        seq = max(0, self.next_seq[s] - back)
        return wire.encode(self.good_fields(s, seq)), "repeat"

    def bad_gap(self):
        started = self.started()
        s = started[self.rng.integers(len(started))]
        seq = self.next_seq[s] + [1, 2, 100, 1 << 40, (1 << 62) - 1 - self.next_seq[s]][self.rng.integers(5)]
        return wire.encode(self.good_fields(s, seq)), "gap"

    def bad_no_slot(self):
        name = f"new-{self.rng.integers(1000)}" if self.rng.random() < 0.7 else self.text(20).strip() or "z"
        if name in STREAMS or not name.isprintable():
            name = "intruder"
        return wire.encode(self.good_fields(name, int(self.rng.integers(0, 100)))), "no_slot"

    def bad_overloaded(self):
        full = [s for s in STREAMS if self.pending[s] >= MAX_PENDING]
        if not full:
            return None
        s = full[self.rng.integers(len(full))]
        return wire.encode(self.good_fields(s, self.next_seq[s])), "overloaded"

    def bad_not_bytes(self):
        return [None, "a string", 5, [b"\x80"], {"v": 1}][self.rng.integers(5)], "bad_frame"


class _Drop:
    def __repr__(self):
        return "<drop>"


_DROP = _Drop()     # "leave this field out"


def _replies(outs):
    return [(o[1], o[2]) for o in outs if o[0] == "reply"]


def test_fuzz_engine_core_refuses_every_bad_message_and_learns_only_from_good_ones():
    fz = Fuzzer(seed=20240611)
    core = make_core()
    initial = core.learner.state_dict()
    n_bad_target, n_good_target = 10_000, 1_500
    goods = []                  # (origin, raw, stream, seq)
    ticks_after = defaultdict(int)   # number of good messages fed so far -> ticks then
    preds = {}                  # origin -> decoded prediction
    bad_count = defaultdict(int)
    n_pub_errors = 0
    i = 0

    def do_tick():
        nonlocal n_pub_errors
        fz.tick()
        ticks_after[len(goods)] += 1
        outs = core.tick()
        n_pub_errors += sum(1 for o in outs if o[0] == "pub" and o[1] == b"error")
        for origin, raw in _replies(outs):
            msg = wire.decode(raw)
            assert msg["type"] == "prediction", msg
            assert origin not in preds, f"second prediction for {origin!r}"
            preds[origin] = msg

    # every slot gets its stream first: from then on any other stream name is refused (no_slot)
    for s in STREAMS:
        origin = b"m%d" % i
        i += 1
        raw, (_, stream, seq) = fz.good(s)
        assert core.ingest(raw, origin=origin) == []
        goods.append((origin, raw, stream, seq))
    while len(goods) < n_good_target or sum(bad_count.values()) < n_bad_target:
        origin = b"m%d" % i
        i += 1
        if fz.rng.random() < P_GOOD:
            free = [s for s in STREAMS if fz.pending[s] < MAX_PENDING]
            if not free:
                do_tick()
                free = [s for s in STREAMS if fz.pending[s] < MAX_PENDING]
            raw, (_, stream, seq) = fz.good(free[fz.rng.integers(len(free))])
            outs = core.ingest(raw, origin=origin)
            assert outs == [], (stream, seq, outs)
            goods.append((origin, raw, stream, seq))
        else:
            got = None
            while got is None:
                name = fz.bad_kinds[fz.rng.integers(len(fz.bad_kinds))]
                got = getattr(fz, name)()
            raw, code = got
            outs = core.ingest(raw, origin=origin)
            replies = _replies(outs)
            assert len(replies) == 1 and replies[0][0] == origin, (name, raw, outs)
            err = wire.decode(replies[0][1])
            assert err["type"] == "error" and isinstance(err["message"], str) and err["message"], err
            assert err["code"] in CODES, (name, err)
            if code is not None:
                assert err["code"] == code, (name, raw, err)
            assert [o for o in outs if o[0] == "pub"] == [("pub", b"error", replies[0][1])]
            bad_count[name] += 1
        if fz.rng.random() < P_TICK:
            do_tick()
    while core.has_pending():
        do_tick()

    n_bad = sum(bad_count.values())
    assert n_bad >= n_bad_target and len(goods) >= n_good_target
    assert all(bad_count[k] >= 100 for k in fz.bad_kinds), sorted(bad_count.items(), key=lambda kv: kv[1])
    # every good message: exactly one prediction, for its own stream and seq
    assert set(preds) == {g[0] for g in goods}
    for origin, _, stream, seq in goods:
        assert (preds[origin]["stream"], preds[origin]["seq"]) == (stream, seq)
    c = core.metrics.counters
    assert (c["accepted"], c["answered"], c["errors"]) == (len(goods), len(goods), n_bad)
    assert n_pub_errors == 0
    assert sum(core.metrics.errors_by_code.values()) == n_bad
    learned = sum(1 for _, raw, _, _ in goods
                  if ((m := msgpack.unpackb(bytes(raw))).get("mode") or "learn") == "learn" and m.get("y"))
    assert learned > 500

    # the same good messages alone, same batching, in a fresh engine: the very same state
    ref = make_core()
    ref_preds = {}
    for n in range(len(goods) + 1):
        if n:
            origin, raw, _, _ = goods[n - 1]
            assert ref.ingest(raw, origin=origin) == []
        for _ in range(ticks_after.get(n, 0)):
            for origin, raw in _replies(ref.tick()):
                ref_preds[origin] = wire.decode(raw)
    assert not ref.has_pending()
    assert set(ref_preds) == set(preds)
    for origin in preds:
        a, b = preds[origin], ref_preds[origin]
        assert a["pred"] == b["pred"] and a["step"] == b["step"], origin
        assert (a["loss"] is None and b["loss"] is None) or a["loss"] == b["loss"]
    got, want = core.learner.state_dict(), ref.learner.state_dict()
    assert sorted(got) == sorted(want)
    for name in want:
        assert np.array_equal(got[name], want[name]), name
    # ... and it did learn something
    assert not np.array_equal(want["params.out.W"], initial["params.out.W"])


# ---- structure-aware property test (hypothesis) ----------------------------------------------
def _hyp_array(n):
    floats = hs.lists(hs.floats(-1e3, 1e3, width=32) | hs.sampled_from([np.nan, np.inf]), min_size=n - 1,
                      max_size=n + 1)
    good = hs.builds(lambda dt, a: wire.pack_array(np.asarray(a, dtype=dt)), hs.sampled_from(["<f4", "<f8"]), floats) \
        | hs.builds(lambda a: wire.pack_array(np.asarray(a, dtype="<i4")), hs.lists(hs.integers(-9, 9), min_size=n,
                                                                                  max_size=n))
    weird = hs.fixed_dictionaries({"dtype": hs.sampled_from(["<f4", ">f4", "|O", "<f2"]) | hs.text(max_size=4),
                                   "shape": hs.lists(hs.integers(-2, 5), max_size=3) | hs.integers(-2**63, 2**64 - 1),
                                   "data": hs.binary(max_size=24) | hs.text(max_size=4)})
    return good | weird | hs.none() | hs.integers(-5, 5) | hs.binary(max_size=8)


_scalars = hs.none() | hs.booleans() | hs.integers(-2**63, 2**64 - 1) | hs.floats() | hs.text(max_size=8) \
    | hs.binary(max_size=8)
_valid_x = hs.lists(hs.floats(-1e3, 1e3, width=32), min_size=N_IN, max_size=N_IN)
_valid_y = hs.lists(hs.floats(-1e3, 1e3, width=32), min_size=N_OUT, max_size=N_OUT)
# a good message (stream h0..h2, seq relative to the stream's next one) ...
_base = hs.fixed_dictionaries(
    {"stream": hs.sampled_from(["h0", "h1", "h2"]), "seq_step": hs.sampled_from([0, 0, 0, 0, -1, 1, 7]),
     "x": _valid_x.map(lambda a: wire.pack_array(np.asarray(a, np.float32)))},
    optional={"y": _valid_y.map(lambda a: wire.pack_array(np.asarray(a, np.float64))) | hs.none(),
              "ts": hs.floats(allow_nan=False, allow_infinity=False) | hs.integers(0, 2**40),
              "mode": hs.sampled_from(["learn", "predict"])})
# ... with, half of the time, some of its fields replaced by anything
_overrides = hs.just({}) | hs.fixed_dictionaries({}, optional={
    "stream": hs.sampled_from(["h0", "h1", "", "h0\n", "x" * 129]) | _scalars,
    "seq": hs.integers(-3, 40) | _scalars, "ts": _scalars, "x": _hyp_array(N_IN), "y": _hyp_array(N_OUT),
    "mode": hs.sampled_from(["learn", "predict", "x"]) | _scalars, "junk": _scalars,
    "v": _scalars, "type": hs.sampled_from(["data", "Data", "weights"]) | _scalars})


@pytest.fixture(scope="module")
def hyp_core():
    return make_core()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=_base, overrides=_overrides, variant=hs.sampled_from(["as_is"] * 5 + ["truncate", "no_version", "pad"]))
def test_hypothesis_any_data_like_message_gets_exactly_one_answer(hyp_core, base, overrides, variant):
    core = hyp_core
    st = core.streams.get(base["stream"])
    msg = {"v": 1, "type": "data", **base,
           "seq": max(0, (st.next_seq if st and st.next_seq is not None else 0) + base["seq_step"])}
    del msg["seq_step"]
    msg.update(overrides)
    raw = _pack(msg)
    if variant == "truncate":
        raw = raw[:len(raw) // 2]
    elif variant == "no_version":
        raw = _pack({k: v for k, v in msg.items() if k != "v"})
    elif variant == "pad":
        raw = raw + b"\xc0" * max(1, MAX_BYTES + 1 - len(raw))
    surely_good = variant == "as_is" and not overrides and (st is None or base["seq_step"] == 0)
    before = core.learner.state_dict()
    outs = core.ingest(raw, origin=b"h")
    if outs:       # refused: one error to the sender and one on PUB, and nothing learned
        assert not surely_good, wire.decode(_replies(outs)[0][1])
        assert len(outs) == 2
        (_, dest, r1), (_, _, r2) = sorted(outs, key=lambda o: o[0] != "reply")
        assert dest == b"h" and r1 == r2
        err = wire.decode(r1)
        assert err["type"] == "error" and err["code"] in CODES
        after = core.learner.state_dict()
        assert all(np.array_equal(before[k], after[k]) for k in before)
        return
    # accepted: exactly one prediction for it at the next tick
    assert variant == "as_is"
    replies = _replies(core.tick())
    assert len(replies) == 1 and replies[0][0] == b"h"
    pred = wire.decode(replies[0][1])
    assert pred["type"] == "prediction" and pred["stream"] == msg["stream"] and pred["seq"] == msg["seq"]
    assert pred["loss"] is None or math.isfinite(pred["loss"])
    assert core.streams[msg["stream"]].next_seq == msg["seq"] + 1


# ---- version strictness ------------------------------------------------------------------
@pytest.mark.parametrize("v", [True, 1.0], ids=["true", "float"])
def test_version_must_be_the_integer_one(v):
    core = make_core()
    raw = _pack({"v": v, "type": "data", "stream": "s0", "seq": 0,
                 "x": wire.pack_array(np.zeros(N_IN, np.float32))})
    outs = core.ingest(raw, origin=b"o")
    assert outs, "accepted a message whose version is not the integer 1"
    assert wire.decode(_replies(outs)[0][1])["code"] == "bad_version"




# ---- through the sockets, against the engine process ---------------------------------------
def test_engine_process_survives_bad_messages_and_answers_each():
    work = Path(tempfile.mkdtemp(prefix="st-fz-"))
    sections = {**SECTIONS,
                "engine": {"slots": 2, "micro_batch": 1, "max_message_bytes": MAX_BYTES},
                "sockets": {"router": f"ipc://{work}/r", "pull": f"ipc://{work}/p", "pub": f"ipc://{work}/b"},
                "publish": {"weights_every": 0, "stats_every_s": 0.2}}
    proc = start_engine(write_config(work / "engine.toml", sections))
    fz = Fuzzer(seed=7)     # its oracle: only s0 and s1 get slots in this engine; s2, s3 are "no_slot"
    # bad messages that cannot travel (not bytes) or need a queue (overloaded) stay in-process
    kinds = [k for k in fz.bad_kinds if k not in ("bad_not_bytes", "bad_overloaded")]
    rng = np.random.default_rng(3)
    codes = defaultdict(int)
    n_bad = n_good = 0

    def good(c, s):
        nonlocal n_good
        seq = fz.next_seq[s] or 0
        c.send(rng.normal(size=N_IN).astype(np.float32), rng.normal(size=N_OUT).astype(np.float32), stream=s, seq=seq)
        r = c.recv()
        assert (r["type"], r["stream"], r["seq"]) == ("prediction", s, seq)
        assert r["loss"] is not None and math.isfinite(r["loss"])
        fz.next_seq[s] = seq + 1
        n_good += 1

    try:
        with SensorClient(f"ipc://{work}/r", timeout_s=20) as c:
            good(c, "s0")
            good(c, "s1")
            for i in range(1200):
                if i % 6 == 0:
                    good(c, ("s0", "s1")[rng.integers(2)])
                    continue
                name = kinds[rng.integers(len(kinds))]
                raw, code = getattr(fz, name)()
                c.send_raw(bytes(raw))
                r = c.recv(raise_errors=False)
                assert r["type"] == "error", (name, r)
                if code is not None:
                    assert r["code"] == code, (name, r)
                assert r["code"] in CODES
                codes[r["code"]] += 1
                n_bad += 1
                if i % 100 == 0:
                    assert proc.poll() is None
            assert n_bad >= 1000 and n_good > 150
            assert len(codes) >= 18, dict(codes)
            good(c, "s0")            # still serving
            assert proc.poll() is None
    finally:
        stop(proc)
        shutil.rmtree(work, ignore_errors=True)
    assert proc.returncode == 0
