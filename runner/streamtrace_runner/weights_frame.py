"""A weights message written slot by slot into the one buffer that is sent.

A ``weights`` message carries every array with the slots first (``serve``'s format, docs/wire.md).
Stacking a bank's slots into arrays and then packing them holds the message's size several times
over (the arrays, their bytes, msgpack's buffer, its result): for 16 default learners, whose
fixed reservoir weights are 0.32 MB a slot, 5 MB each time. Here the message's msgpack bytes are
laid out first (every array's size is known from one slot), then each slot's arrays are read from
the device, one slot at a time, and copied to their places: the message is held once, and one
slot's host copy beside it. The bytes are those ``msgpack.packb`` makes of the same message.

``digests`` reads the same arrays slot by slot for what ``weights.digest`` gives of the stacked
array (shape, dtype, crc32 of its bytes, the crc carried from slot to slot).
"""
from __future__ import annotations

import struct
import zlib

import msgpack
import numpy as np

from .wire import VERSION

__all__ = ["digests", "encode_weights"]


def _slot_arrays(bank, keys: set):
    """(slot, {key: little-endian C-contiguous array of that slot (leading axis 1)}) in order."""
    for s in range(bank.n):
        got = bank.slot_state(s, keys)
        yield s, {k: np.ascontiguousarray(np.asarray(v).astype(np.asarray(v).dtype.newbyteorder("<"), copy=False))
                  for k, v in got.items()}


def digests(bank, names: dict) -> dict:
    """{message name: (shape, dtype str, crc32)} of each array the bank holds under checkpoint
    name ``names[message name]``, with the slots first, read slot by slot.

    >>> class Bank:                       # two slots of one array
    ...     n = 2
    ...     def slot_state(self, s, keys): return {"w": np.full((1, 3), float(s))}
    >>> from streamtrace_runner.weights import digest
    >>> digests(Bank(), {"params.w": "w"})["params.w"] == digest(np.array([[0.] * 3, [1.] * 3]))
    True
    """
    crc, shape, dtype = {}, {}, {}
    for s, arrays in _slot_arrays(bank, set(names.values())):
        for k, a in arrays.items():
            crc[k] = zlib.crc32(a.reshape(-1).view(np.uint8), crc.get(k, 0))
            shape[k], dtype[k] = (bank.n, *a.shape[1:]), a.dtype.str
    return {n: (shape[k], dtype[k], crc[k]) for n, k in names.items()}


def _map_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x80 | n])
    return b"\xde" + struct.pack(">H", n) if n < 1 << 16 else b"\xdf" + struct.pack(">I", n)


def _bin_header(n: int) -> bytes:
    if n < 1 << 8:
        return b"\xc4" + bytes([n])
    return b"\xc5" + struct.pack(">H", n) if n < 1 << 16 else b"\xc6" + struct.pack(">I", n)


def _pack(v) -> bytes:
    return msgpack.packb(v, use_bin_type=True)


def _layout(msg: dict, sections: dict, bank):
    """The message's pieces in order (bytes, or (key, slot bytes) where an array's data goes)
    and each key's slot byte count."""
    keys = {k for names in sections.values() for k in names.values()}
    _, one = next(_slot_arrays(bank, keys))          # slot 0's arrays: every array's dtype and shape
    pieces = [_map_header(len(msg) + 1), _pack("v"), _pack(VERSION)]
    for field, value in msg.items():
        pieces.append(_pack(field))
        if field not in sections:
            pieces.append(_pack(value))
            continue
        pieces.append(_map_header(len(sections[field])))
        for name, key in sections[field].items():
            a = one[key]
            nbytes = a.nbytes * bank.n // max(a.shape[0], 1)
            pieces += [_pack(name), _map_header(3), _pack("dtype"), _pack(a.dtype.str), _pack("shape"),
                       _pack([bank.n, *a.shape[1:]]), _pack("data"), _bin_header(nbytes), (key, nbytes // bank.n)]
    return pieces


def encode_weights(msg: dict, sections: dict, bank) -> bytearray:
    """``wire.encode`` of ``msg`` whose fields named in ``sections`` ({field: {message name:
    checkpoint name}}) are maps of the bank's arrays, slots first (``wire.pack_array``'s form).

    >>> class Bank:
    ...     n = 2
    ...     def slot_state(self, s, keys): return {"w": np.full((1, 2), float(s))}
    >>> from streamtrace_runner import wire
    >>> raw = encode_weights({"type": "weights", "params": None, "version": 3}, {"params": {"w": "w"}}, Bank())
    >>> m = wire.decode(bytes(raw)); wire.unpack_array(m["params"]["w"]).tolist(), m["version"]
    ([[0.0, 0.0], [1.0, 1.0]], 3)
    """
    pieces = _layout(msg, sections, bank)
    out = bytearray(sum(len(p) if isinstance(p, bytes) else bank.n * p[1] for p in pieces))
    at, where = 0, {}
    for p in pieces:
        if isinstance(p, bytes):
            out[at:at + len(p)] = p
            at += len(p)
        else:
            where.setdefault(p[0], []).append(at)
            at += bank.n * p[1]
    view = memoryview(out)
    for s, arrays in _slot_arrays(bank, set(where)):
        for k, a in arrays.items():
            raw = a.reshape(-1).view(np.uint8)
            for start in where[k]:
                view[start + s * raw.size:start + (s + 1) * raw.size] = raw
    return out
