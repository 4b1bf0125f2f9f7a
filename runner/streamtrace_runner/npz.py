"""Reading ``.npz`` archives (``numpy.savez``: one ``.npy`` member per array, stored, not
compressed) without ``zipfile``: the runner's folder (state.npz, state_map.npz) and its
checkpoints are such archives, and ``zipfile`` with what it imports (shutil, bz2, lzma) is
about 1 MB of a process that holds 40 (measured: docs/devices.md). Anything else (compressed
or ZIP64 members, Fortran order, an object dtype, damaged bytes) is left to ``numpy.load``:
``read`` answers None and the caller reads the file that way (the same arrays, or its errors)."""
from __future__ import annotations

import io
import struct
import zlib

import numpy as np

__all__ = ["read"]

_END = struct.Struct("<4s4H2LH")            # end of central directory
_ENTRY = struct.Struct("<4s6H3L5H2L")       # central directory entry
_LOCAL = struct.Struct("<4s5H3L2H")         # local file header
_ZIP64 = 0xFFFFFFFF


def read(source) -> dict | None:
    """{member name without ``.npy``: array} of the ``.npz`` at ``source`` (a path or a binary
    file object), each array writable and in memory of its own; None where the archive is not
    a plain stored one this reader knows (read it with ``numpy.load``).

    >>> buf = io.BytesIO(); np.savez(buf, a=np.arange(3.0), b=np.eye(2, dtype=np.int32))
    >>> got = read(io.BytesIO(buf.getvalue()))
    >>> got["a"].tolist(), got["b"].dtype.name, read(io.BytesIO(b"not an archive"))
    ([0.0, 1.0, 2.0], 'int32', None)
    """
    try:
        if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__"):
            with open(source, "rb") as f:
                return _members(f)
        return _members(source)
    except (OSError, ValueError, KeyError, struct.error, TypeError, SyntaxError):
        return None


def _members(f) -> dict | None:
    f.seek(0, io.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - 65536 - _END.size))
    tail = f.read()
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < _END.size:
        return None
    _, disk, _, count, total, cd_size, cd_offset, _ = _END.unpack_from(tail, at)
    if disk or count != total or count == 0xFFFF or cd_offset == _ZIP64:
        return None
    f.seek(cd_offset)
    cd = f.read(cd_size)
    out, pos = {}, 0
    for _ in range(count):
        (sig, _, _, flags, method, _, _, crc, csize, usize, n, e, c, _, _, _, offset) = _ENTRY.unpack_from(cd, pos)
        name = cd[pos + _ENTRY.size:pos + _ENTRY.size + n].decode("utf-8")
        pos += _ENTRY.size + n + e + c
        if sig != b"PK\x01\x02" or method != 0 or flags & 1 or _ZIP64 in (csize, usize, offset) or csize != usize \
                or offset + _LOCAL.size + csize > size:     # (damaged sizes: never a buffer past the file)
            return None
        array = _member(f, offset, csize, crc, size)
        if array is None:
            return None
        out[name[:-4] if name.endswith(".npy") else name] = array
    return out


def _member(f, offset: int, size: int, crc: int, file_size: int):
    f.seek(offset)
    sig, *_, n, e = _LOCAL.unpack(f.read(_LOCAL.size))
    if sig != b"PK\x03\x04" or offset + _LOCAL.size + n + e + size > file_size:
        return None
    f.seek(offset + _LOCAL.size + n + e)
    raw = bytearray(size)           # the array's own memory (writable; malloc's alignment)
    if f.readinto(raw) != size or zlib.crc32(raw) != crc:
        return None
    head = io.BytesIO(raw)
    version = np.lib.format.read_magic(head)
    read_header = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    if version not in read_header:
        return None
    shape, fortran, dtype = read_header[version](head)
    if fortran or dtype.hasobject or head.tell() % dtype.alignment:
        return None
    count = int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(raw, dtype, count, head.tell()).reshape(shape)
