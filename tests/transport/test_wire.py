"""The wire protocol: round trips, and every malformed input refused with a named code."""
import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs
from hypothesis.extra import numpy as hnp

from streamtrace import wire

DTYPES = ["<f4", "<f8", "<i4", "|u1"]


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(dtype=hs.sampled_from(DTYPES), shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=5)))
def test_array_round_trip(a):
    b = wire.unpack_array(msgpack.unpackb(msgpack.packb(wire.pack_array(a)), raw=False))
    assert b.dtype == a.dtype and b.shape == a.shape
    np.testing.assert_array_equal(b, a)


def test_big_endian_arrays_go_out_little_endian():
    a = np.arange(4, dtype=">f4")
    packed = wire.pack_array(a)
    assert packed["dtype"] == "<f4"
    np.testing.assert_array_equal(wire.unpack_array(packed), a)


def test_data_message_round_trip():
    raw = wire.data_message("s", 7, np.array([1.5, 2.0], np.float32), np.array([0.5]), ts=3.0, mode="predict")
    d = wire.decode_data(wire.decode(raw), (2,), (1,))
    assert (d["stream"], d["seq"], d["ts"], d["mode"]) == ("s", 7, 3.0, "predict")
    np.testing.assert_array_equal(d["x"], [1.5, 2.0])
    np.testing.assert_array_equal(d["y"], [0.5])


def good(**change):
    msg = {"type": "data", "stream": "s", "seq": 1, "x": wire.pack_array(np.zeros(2, np.float32))}
    msg.update(change)
    return {k: v for k, v in msg.items() if v is not None}


BAD = [
    ("not_msgpack", b"\xc1\xc1"),
    ("not_msgpack", wire.encode(good())[:-3]),
    ("bad_message", msgpack.packb([1, 2, 3])),
    ("bad_version", msgpack.packb({"v": 2, "type": "data"})),
    ("bad_version", msgpack.packb({"type": "data"})),
    ("bad_message", msgpack.packb({"v": 1})),
    ("too_large", b"\x00" * (wire.MAX_MESSAGE_BYTES + 1)),
    ("unknown_field", wire.encode(good(extra=1))),
    ("bad_stream", wire.encode(good(stream=""))),
    ("bad_stream", wire.encode(good(stream=5))),
    ("bad_stream", wire.encode(good(stream="x" * 500))),
    ("bad_seq", wire.encode(good(seq=-1))),
    ("bad_seq", wire.encode(good(seq="1"))),
    ("bad_seq", wire.encode(good(seq=True))),
    ("bad_ts", wire.encode(good(ts=float("nan")))),
    ("bad_mode", wire.encode(good(mode="train"))),
    ("missing_field", wire.encode(good(x=None))),
    ("bad_array", wire.encode(good(x=[0.0, 0.0]))),
    ("bad_dtype", wire.encode(good(x={"dtype": "|O", "shape": [2], "data": b"\0" * 16}))),
    ("bad_array", wire.encode(good(x={"dtype": "<f4", "shape": [3], "data": b"\0" * 8}))),
    ("bad_shape", wire.encode(good(x={"dtype": "<f4", "shape": [-1], "data": b""}))),
    ("bad_shape", wire.encode(good(x=wire.pack_array(np.zeros(3, np.float32))))),
    ("not_finite", wire.encode(good(x=wire.pack_array(np.array([np.nan, 0], np.float32))))),
    ("not_finite", wire.encode(good(y=wire.pack_array(np.array([np.inf]))))),
    ("bad_shape", wire.encode(good(y=wire.pack_array(np.zeros((1, 1)))))),
    ("too_large", wire.encode(good(x={"dtype": "<f4", "shape": [1 << 21], "data": b""}))),
]


@pytest.mark.parametrize("code,raw", BAD, ids=[f"{i}-{c}" for i, (c, _) in enumerate(BAD)])
def test_bad_messages_are_refused_with_a_code(code, raw):
    with pytest.raises(wire.WireError) as info:
        wire.decode_data(wire.decode(raw), (2,), (1,))
    assert info.value.code == code, str(info.value)
    assert str(info.value)   # a message a person can read


@settings(max_examples=300, deadline=None)
@given(hs.binary(max_size=300))
def test_random_bytes_never_escape_as_anything_but_wire_errors(raw):
    try:
        wire.decode_data(wire.decode(raw), (2,), (1,))
    except wire.WireError:
        pass
