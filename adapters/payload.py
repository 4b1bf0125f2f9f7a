"""One sensor sample from a message-bus payload (MQTT), checked before anything reaches the engine.

Accepted payloads, JSON or msgpack:

* a number or an array of numbers: the sample's inputs ``x``;
* a map ``{"x": [...], "y": [...], "ts": 12.5, "mode": "predict"}`` (only ``x`` is required;
  ``y`` is a supervised target, ``ts`` the sample's time in seconds);
* our wire format's array map ``{"dtype": "<f4", "shape": [3], "data": <bytes>}``
  (:func:`streamtrace.wire.pack_array`), alone or as ``x`` / ``y`` of the map above.

Anything else raises :class:`BadPayload`, whose ``reason`` is the key a bridge counts it under:
``empty``, ``too_large``, ``not_json_or_msgpack``, ``wrong_type``, ``non_finite``, ``bad_array``.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import msgpack
import numpy as np

from streamtrace import wire

__all__ = ["BadPayload", "Sample", "decode_sample", "REASONS"]

REASONS = ("empty", "too_large", "not_json_or_msgpack", "wrong_type", "non_finite", "bad_array")
MAP_FIELDS = {"x", "y", "ts", "mode"}
ARRAY_MAP = {"dtype", "shape", "data"}


class BadPayload(ValueError):
    """A payload that is not a sample; ``reason`` is one of ``REASONS``."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class Sample:
    x: np.ndarray
    y: np.ndarray | None = None
    ts: float | None = None
    mode: str | None = None


def decode_sample(raw: bytes, max_bytes: int = 1 << 16, max_values: int = 1 << 14) -> Sample:
    """``raw`` as a :class:`Sample`, or :class:`BadPayload` naming what is wrong."""
    if len(raw) == 0:
        raise BadPayload("empty", "the payload is empty")
    if len(raw) > max_bytes:
        raise BadPayload("too_large", f"the payload is {len(raw)} bytes; the limit is {max_bytes}")
    obj = _parse(bytes(raw), max_bytes)
    if isinstance(obj, dict) and set(obj) != ARRAY_MAP:
        unknown = set(map(str, obj)) - MAP_FIELDS
        if unknown:
            raise BadPayload("wrong_type", f"unknown field(s) {sorted(unknown)}; allowed: {sorted(MAP_FIELDS)}")
        if obj.get("x") is None:
            raise BadPayload("wrong_type", "a map payload needs 'x' (the sample's values)")
        x = _values(obj["x"], "x", max_values)
        y = None if obj.get("y") is None else _values(obj["y"], "y", max_values)
        ts, mode = obj.get("ts"), obj.get("mode")
        if ts is not None:
            if isinstance(ts, bool) or not isinstance(ts, (int, float)):
                raise BadPayload("wrong_type", f"'ts' must be a number of seconds; got {type(ts).__name__}")
            if not math.isfinite(ts):
                raise BadPayload("non_finite", "'ts' is NaN or Inf")
            ts = float(ts)
        if mode is not None and mode not in wire.MESSAGE_MODES:
            raise BadPayload("wrong_type", f"'mode' must be one of {wire.MESSAGE_MODES}; got {mode!r}")
        return Sample(x, y, ts, mode)
    return Sample(_values(obj, "payload", max_values))


def _parse(raw: bytes, max_bytes: int):
    # JSON first: a text payload cannot be our msgpack map (it starts with a byte >= 0x80)
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        pass
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=True, max_str_len=max_bytes, max_bin_len=max_bytes,
                               max_array_len=max_bytes, max_map_len=64, max_ext_len=0)
    except Exception:  # msgpack raises several types for malformed input
        raise BadPayload("not_json_or_msgpack", "the payload is neither JSON nor msgpack") from None


def _values(v, field: str, max_values: int) -> np.ndarray:
    if isinstance(v, dict):
        if set(v) != ARRAY_MAP:
            raise BadPayload("wrong_type", f"'{field}' must be numbers or a dtype/shape/data array map")
        try:
            a = wire.unpack_array(v, field, max_elements=max_values)
        except wire.WireError as e:
            raise BadPayload("too_large" if e.code == "too_large" else "bad_array", str(e)) from None
        if a.size == 0:
            raise BadPayload("empty", f"'{field}' has no values")
        a = a.astype(np.float64)
    else:
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = [v]
        if not isinstance(v, list):
            raise BadPayload("wrong_type", f"'{field}' must be a number or an array of numbers; got "
                                           f"{type(v).__name__}")
        if not v:
            raise BadPayload("empty", f"'{field}' has no values")
        if len(v) > max_values:
            raise BadPayload("too_large", f"'{field}' has {len(v)} values; the limit is {max_values}")
        bad = [e for e in v if isinstance(e, bool) or not isinstance(e, (int, float))]
        if bad:
            raise BadPayload("wrong_type", f"'{field}' must hold numbers only; found {type(bad[0]).__name__}")
        try:
            a = np.asarray(v, np.float64)
        except OverflowError:          # an integer beyond float range
            raise BadPayload("non_finite", f"'{field}' holds a number beyond the float range") from None
    if not np.all(np.isfinite(a)):
        raise BadPayload("non_finite", f"'{field}' contains NaN or Inf")
    return a
