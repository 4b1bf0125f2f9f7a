"""The wire protocol: msgpack maps with a version field; arrays as dtype + shape + raw
little-endian bytes. Never pickle. ``decode_*`` raise ``WireError`` with a stable ``code``
and a message naming what is wrong; nothing is trusted before it is checked.

Messages (all maps carry ``"v": 1`` and ``"type"``):

    data        sensor -> engine   stream, seq, ts, x, [y], [mode: "learn" | "predict"]
    label       sensor -> engine   stream, seq, y: the target of an earlier data message (learning.label_delay)
    label_ack   engine -> sensor   stream, seq, loss, applied (request/reply only)
    prediction  engine -> sensor   stream, seq, pred, loss (or nil), step, version, ts, t_engine;
                                   published on PUB also [signal]: the sample's y, else its x
    error       engine -> sensor   code, message, [stream], [seq], [expected]: the stream's next seq
    get_weights sensor -> engine   (request/reply only) -> a "weights" snapshot
    weights     engine -> PUB      version, kind ("snapshot" | "update"), base, params {name: array}
    stats       engine -> PUB      a map of numbers (see README)

An array is the map {"dtype": "<f4", "shape": [2, 3], "data": <bytes>}.

Errors are in the user's units, whatever the model sees inside (standardised, residual): a
prediction's ``loss`` is the loss (MSE) of the prediction this stream got for the target just
learned from (forecast: the previous prediction against this x), and so are ``stats``'
``stream_loss`` and the rolling metrics; nil while the slot does not learn (warm-up).
"""
from __future__ import annotations

import math

import msgpack
import numpy as np

__all__ = ["VERSION", "MAX_MESSAGE_BYTES", "WireError", "encode", "decode", "pack_array", "unpack_array",
           "data_message", "decode_data", "label_message", "decode_label", "PredictionEncoder", "ALLOWED_DTYPES"]

VERSION = 1
MAX_MESSAGE_BYTES = 1 << 20          # default size limit for any one message
MAX_STREAM_ID = 128
ALLOWED_DTYPES = ("<f4", "<f8", "<f2", "<i4", "<i8", "<i2", "|i1", "|u1", "<u2", "<u4")
DATA_FIELDS = {"v", "type", "stream", "seq", "ts", "x", "y", "mode"}
OPTIONAL_FIELDS = {"ts", "y", "mode"}   # nil means absent
LABEL_FIELDS = {"v", "type", "stream", "seq", "y"}
MESSAGE_MODES = ("learn", "predict")   # per data message (the learner's modes: learner.step.MODES)
ARRAY_FIELDS = {"dtype", "shape", "data"}
SMALL = 16      # up to this many elements a Python loop checks finiteness faster than numpy


class WireError(ValueError):
    """A message that cannot be accepted; ``code`` is a short stable identifier."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def pack_array(a) -> dict:
    a = np.asarray(a)
    le = a.astype(a.dtype.newbyteorder("<"), copy=False) if a.dtype.byteorder == ">" else a
    return {"dtype": le.dtype.str, "shape": list(le.shape), "data": np.ascontiguousarray(le).tobytes()}


def unpack_array(obj, field: str = "array", max_elements: int = 1 << 20) -> np.ndarray:
    if not isinstance(obj, dict) or obj.keys() != ARRAY_FIELDS:
        raise WireError("bad_array", f"'{field}' must be a map with exactly dtype, shape and data")
    dtype, shape, data = obj["dtype"], obj["shape"], obj["data"]
    if not isinstance(dtype, str) or dtype not in ALLOWED_DTYPES:
        raise WireError("bad_dtype", f"'{field}' has dtype {dtype!r}; allowed: {', '.join(ALLOWED_DTYPES)}")
    if not isinstance(shape, (list, tuple)) or len(shape) > 8 or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d for d in shape):
        raise WireError("bad_shape", f"'{field}' shape must be a list of at most 8 non-negative integers")
    n = math.prod(shape)
    if n > max_elements:
        raise WireError("too_large", f"'{field}' has {n} elements; the limit is {max_elements}")
    # each dimension bounded on its own too: a zero next to a huge one has no elements but
    # still overflows numpy's shape arithmetic
    if any(d > max_elements for d in shape):
        raise WireError("bad_shape", f"'{field}' has a dimension above {max_elements}: {list(shape)}")
    if not isinstance(data, (bytes, bytearray)):
        raise WireError("bad_array", f"'{field}' data must be raw bytes")
    dt = np.dtype(dtype)
    if len(data) != n * dt.itemsize:
        raise WireError("bad_array", f"'{field}' has {len(data)} bytes of data; shape {list(shape)} of "
                                     f"{dtype} needs {n * dt.itemsize}")
    try:
        return np.frombuffer(data, dt).reshape(shape)
    except ValueError as e:  # numpy's own shape limits, whatever slips past the checks above
        raise WireError("bad_shape", f"'{field}' shape {list(shape)} is not a valid array shape ({e})") from None


def encode(msg: dict) -> bytes:
    return msgpack.packb({"v": VERSION, **msg}, use_bin_type=True)


def decode(raw: bytes, max_bytes: int = MAX_MESSAGE_BYTES) -> dict:
    """Bytes -> a map with a valid version and type. Raises WireError."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise WireError("bad_frame", "message must be bytes")
    if len(raw) > max_bytes:
        raise WireError("too_large", f"message is {len(raw)} bytes; the limit is {max_bytes}")
    try:
        msg = msgpack.unpackb(raw, raw=False, strict_map_key=True,
                              max_str_len=max_bytes, max_bin_len=max_bytes, max_array_len=1 << 16,
                              max_map_len=1 << 12, max_ext_len=0)
    except Exception as e:  # msgpack raises several types for malformed input
        raise WireError("not_msgpack", f"message is not valid msgpack ({type(e).__name__})") from None
    if not isinstance(msg, dict):
        raise WireError("bad_message", "message must be a msgpack map")
    v = msg.get("v")
    if type(v) is not int or v != VERSION:  # not True, not 1.0
        raise WireError("bad_version", f"unsupported protocol version {msg.get('v')!r}; this engine speaks v{VERSION}")
    if not isinstance(msg.get("type"), str):
        raise WireError("bad_message", "message has no 'type'")
    return msg


def data_message(stream: str, seq: int, x, y=None, *, ts: float | None = None, mode: str | None = None) -> bytes:
    msg = {"type": "data", "stream": stream, "seq": int(seq), "x": pack_array(x)}
    if ts is not None:
        msg["ts"] = float(ts)
    if y is not None:
        msg["y"] = pack_array(y)
    if mode is not None:
        msg["mode"] = mode
    return encode(msg)


def decode_data(msg: dict, x_shape: tuple, y_shape: tuple, x_dtype=None, y_dtype=None) -> dict:
    """Check a decoded 'data' map against the model's shapes; returns a clean dict with
    float arrays (of x_dtype / y_dtype when given: a value that overflows the model's dtype is
    refused as not finite). Optional fields that are nil count as absent. Raises WireError
    naming the first problem."""
    if None in msg.values():
        msg = {k: v for k, v in msg.items() if v is not None or k not in OPTIONAL_FIELDS}
    if not DATA_FIELDS.issuperset(msg):
        unknown = set(msg) - DATA_FIELDS
        raise WireError("unknown_field", f"unknown field(s) {sorted(map(str, unknown))}; allowed: {sorted(DATA_FIELDS)}")
    stream, seq = _stream_seq(msg)
    ts = msg.get("ts", 0.0)
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not math.isfinite(ts):
        raise WireError("bad_ts", "'ts' must be a finite number")
    mode = msg.get("mode", "learn")
    if mode not in MESSAGE_MODES:
        raise WireError("bad_mode", f"'mode' must be one of {MESSAGE_MODES}; got {mode!r}")
    if msg.get("x") is None:
        raise WireError("missing_field", "data message has no 'x'")
    x = _checked(unpack_array(msg["x"], "x"), "x", x_shape, x_dtype)
    y = None
    if "y" in msg:
        y = _checked(unpack_array(msg["y"], "y"), "y", y_shape, y_dtype)
    return {"stream": stream, "seq": seq, "ts": float(ts), "x": x, "y": y, "mode": mode}


def _stream_seq(msg: dict) -> tuple:
    stream = msg.get("stream")
    if not isinstance(stream, str) or not 0 < len(stream) <= MAX_STREAM_ID or not stream.isprintable():
        raise WireError("bad_stream", f"'stream' must be a printable string of 1..{MAX_STREAM_ID} characters")
    seq = msg.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq < 1 << 62:
        raise WireError("bad_seq", "'seq' must be a non-negative integer")
    return stream, seq


def label_message(stream: str, seq: int, y) -> bytes:
    return encode({"type": "label", "stream": stream, "seq": int(seq), "y": pack_array(y)})


def decode_label(msg: dict, y_shape: tuple, y_dtype=None) -> dict:
    """Check a decoded 'label' map (the target of the data message ``seq`` of ``stream``);
    returns {stream, seq, y}. Raises WireError naming the first problem."""
    if not LABEL_FIELDS.issuperset(msg):
        unknown = set(msg) - LABEL_FIELDS
        raise WireError("unknown_field", f"unknown field(s) {sorted(map(str, unknown))}; allowed: {sorted(LABEL_FIELDS)}")
    stream, seq = _stream_seq(msg)
    if msg.get("y") is None:
        raise WireError("missing_field", "label message has no 'y'")
    return {"stream": stream, "seq": seq, "y": _checked(unpack_array(msg["y"], "y"), "y", y_shape, y_dtype)}


def _checked(a: np.ndarray, field: str, shape: tuple, dtype=None) -> np.ndarray:
    if tuple(a.shape) != tuple(shape):
        raise WireError("bad_shape", f"'{field}' has shape {list(a.shape)}; the model expects {list(shape)}")
    if a.dtype.kind not in "fiu":
        raise WireError("bad_dtype", f"'{field}' must be numeric")
    if dtype is None:
        dtype = np.float64 if a.dtype == np.float64 else np.float32
    if a.dtype != dtype:
        with np.errstate(over="ignore", invalid="ignore"):
            a = a.astype(dtype)      # checked after the cast: 1e300 as float32 is inf
    # (already the model's dtype: the read-only view of the message's bytes is kept; callers copy it)
    if not (all(map(math.isfinite, a.ravel().tolist())) if a.size <= SMALL else np.isfinite(a).all()):
        raise WireError("not_finite", f"'{field}' contains NaN or Inf, or a value beyond the range of {np.dtype(dtype)}")
    return a


class PredictionEncoder:
    """The engine's "prediction" replies, with one msgpack Packer reused and the prediction's
    dtype and shape packed once (again only if they change): the same bytes as ``encode``."""

    def __init__(self):
        self._packer = msgpack.Packer(use_bin_type=True)
        self._key, self._array = None, None

    def __call__(self, stream: str, seq: int, pred: np.ndarray, loss: float | None, step: int, version: int,
                 ts: float, signal: np.ndarray | None = None, events: dict | None = None) -> bytes:
        if (pred.dtype, pred.shape) != self._key:
            self._key = (pred.dtype, pred.shape)
            self._array = {k: v for k, v in pack_array(pred).items() if k != "data"}
        data = pred.tobytes() if pred.dtype.byteorder != ">" else pack_array(pred)["data"]
        msg = {"v": VERSION, "type": "prediction", "stream": stream, "seq": seq,
               "pred": {**self._array, "data": data}, "loss": loss, "step": step, "version": version, "ts": ts}
        if signal is not None:       # published copies only (publish.signal): what a dashboard plots
            msg["signal"] = pack_array(signal)
        if events:                   # only when something happened: "outlier", "rolled_back" (true)
            msg.update(events)
        return self._packer.pack(msg)
