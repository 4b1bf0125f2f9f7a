"""A weights message written slot by slot into the one buffer that is sent.

A ``weights`` message carries its arrays with the slots first, the rows of the slots that serve
a stream (``serve``'s format, docs/wire.md). Stacking those slots into arrays and then packing
them holds the message's size several times over (the arrays, their bytes, msgpack's buffer, its
result): for 16 busy default learners, whose fixed reservoir weights are 0.32 MB a slot, 5 MB each
time. Here the message's msgpack bytes are laid out first (every array's size is known from one
slot), then each slot's arrays are read from the device, one slot at a time, and copied to their
places: the message is held once, and one slot's host copy beside it. The bytes are those
``msgpack.packb`` makes of the same message.

``digests`` reads the same arrays slot by slot for what ``weights.digest`` gives of the stacked
array (shape, dtype, crc32 of its bytes, the crc carried from slot to slot).
"""
from __future__ import annotations

import itertools
import struct
import zlib

import msgpack
import numpy as np

from .wire import VERSION

__all__ = ["digests", "encode_weights"]


def _slot_arrays(bank, keys: set, slots):
    """(row, {key: little-endian C-contiguous array of slot ``slots[row]`` (leading axis 1)}) in order."""
    for row, s in enumerate(slots):
        got = bank.slot_state(s, keys)
        yield row, {k: np.ascontiguousarray(np.asarray(v).astype(np.asarray(v).dtype.newbyteorder("<"), copy=False))
                  for k, v in got.items()}


def digests(bank, names: dict, slots) -> dict:
    """{message name: (shape, dtype str, crc32)} of each array the bank holds under checkpoint
    name ``names[message name]``, rows of ``slots`` (a sequence of slot numbers) first, read slot
    by slot.

    Parameters: ``bank`` has ``slot_state(slot, keys)``; ``names`` {message name: checkpoint
    name}; ``slots`` the slots whose rows the arrays hold, in order.

    >>> class Bank:                       # three slots of one array
    ...     def slot_state(self, s, keys): return {"w": np.full((1, 3), float(s))}
    >>> from streamtrace_runner.weights import digest
    >>> digests(Bank(), {"params.w": "w"}, [0, 2])["params.w"] == digest(np.array([[0.] * 3, [2.] * 3]))
    True
    """
    n = len(slots)
    crc, shape, dtype = {}, {}, {}
    for _, arrays in _slot_arrays(bank, set(names.values()), slots):
        for k, a in arrays.items():
            crc[k] = zlib.crc32(a.reshape(-1).view(np.uint8), crc.get(k, 0))
            shape[k], dtype[k] = (n, *a.shape[1:]), a.dtype.str
    if not n:                             # no rows: the shapes and dtypes from a fresh slot
        for k, a in next(_slot_arrays(bank, set(names.values()), [0]))[1].items():
            crc[k], shape[k], dtype[k] = 0, (0, *a.shape[1:]), a.dtype.str
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


def _layout(msg: dict, sections: dict, bank, slots):
    """The message's pieces in order (bytes, or (key, slot bytes) where an array's data goes)
    and the first slot's arrays (read for every array's dtype and shape)."""
    keys = {k for names in sections.values() for k in names.values()}
    _, one = next(_slot_arrays(bank, keys, list(slots[:1]) or [0]))
    n = len(slots)
    pieces = [_map_header(len(msg) + 1), _pack("v"), _pack(VERSION)]
    for field, value in msg.items():
        pieces.append(_pack(field))
        if field not in sections:
            pieces.append(_pack(value))
            continue
        pieces.append(_map_header(len(sections[field])))
        for name, key in sections[field].items():
            a = one[key]
            row = a.nbytes // max(a.shape[0], 1)
            pieces += [_pack(name), _map_header(3), _pack("dtype"), _pack(a.dtype.str), _pack("shape"),
                       _pack([n, *a.shape[1:]]), _pack("data"), _bin_header(n * row), (key, row)]
    return pieces, one


def encode_weights(msg: dict, sections: dict, bank, slots) -> bytearray:
    """``wire.encode`` of ``msg`` whose fields named in ``sections`` ({field: {message name:
    checkpoint name}}) are maps of the bank's arrays, the rows of ``slots`` first
    (``wire.pack_array``'s form).

    Parameters: ``msg`` the message's fields in order (those in ``sections`` as placeholders);
    ``sections`` as above; ``bank`` has ``slot_state(slot, keys)``; ``slots`` the slot numbers
    whose rows the arrays hold, in order.

    >>> class Bank:
    ...     def slot_state(self, s, keys): return {"w": np.full((1, 2), float(s))}
    >>> from streamtrace_runner import wire
    >>> raw = encode_weights({"type": "weights", "params": None, "version": 3}, {"params": {"w": "w"}}, Bank(), [1, 3])
    >>> m = wire.decode(bytes(raw)); wire.unpack_array(m["params"]["w"]).tolist(), m["version"]
    ([[1.0, 1.0], [3.0, 3.0]], 3)
    """
    pieces, first = _layout(msg, sections, bank, slots)
    n = len(slots)
    out = bytearray(sum(len(p) if isinstance(p, bytes) else n * p[1] for p in pieces))
    at, where = 0, {}
    for p in pieces:
        if isinstance(p, bytes):
            out[at:at + len(p)] = p
            at += len(p)
        else:
            where.setdefault(p[0], []).append(at)
            at += n * p[1]
    view = memoryview(out)
    rest = ((row + 1, arrays) for row, arrays in _slot_arrays(bank, set(where), slots[1:]))
    for row, arrays in itertools.chain([(0, first)] if n else [], rest):    # one slot's copy at a time
        for k in where:
            raw = arrays[k].reshape(-1).view(np.uint8)
            for start in where[k]:
                view[start + row * raw.size:start + (row + 1) * raw.size] = raw
    return out
