"""Where each checkpoint array lives in an exported step program's buffers (numpy only).

The program's state crosses as a few buffers: small leaves packed per dtype, big ones alone
(``learner/packing.py``), the weight block split by parameter in a checkpoint. The map holds,
for every checkpoint array, the flat positions of its values in one buffer, encoded as
``buffer << SHIFT | position`` in an int64 array of the checkpoint array's shape; it is made
by running the learner's own buffers -> checkpoint code on buffers of positions (write.py), so
both directions are exact copies, and it is stored as a plain ``.npz`` (no pickle). An array
whose values lie in order in one run of a buffer (most of them) is kept and stored as that run
(``[buffer, start, *shape]`` under ``"@" + name``), not as its positions: smaller in the
folder and in the runner's memory.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import npz

__all__ = ["StateMap", "SHIFT"]

SHIFT = 40      # buffers hold fewer than 2**40 values


class StateMap:
    """Checkpoint arrays <-> program buffers.

    ``positions``: {checkpoint name: int64 array of ``buffer << SHIFT | flat position``};
    ``buffers``: the buffers' (shape, dtype).

    >>> m = StateMap({"a": np.array([1, 0]), "b": np.array([1 << SHIFT])}, [((2,), "f8"), ((1,), "i4")])
    >>> bufs = m.buffers({"a": np.array([3.0, 4.0]), "b": np.array([7])})
    >>> bufs[0].tolist(), bufs[1].tolist(), m.named(bufs)["a"].tolist()
    ([4.0, 3.0], [7], [3.0, 4.0])
    """

    FILE = "state_map.npz"

    def __init__(self, positions: dict, buffers: list):
        self.shapes = [(tuple(int(d) for d in shape), np.dtype(dt)) for shape, dt in buffers]
        self._at = {k: _compact(np.asarray(v, np.int64)) for k, v in positions.items()}
        self._whole_set = None      # (made on first use, once ``load`` has placed every array)

    @property
    def names(self) -> list:
        """The checkpoint names the map places."""
        return list(self._at)

    def buffer_of(self, name: str) -> int:
        """The buffer holding the checkpoint array ``name``."""
        return self._at[name][0]

    def buffers_of(self, names) -> set | None:
        """The buffers holding the checkpoint arrays ``names`` (None: every name, every buffer)."""
        return None if names is None else {self._at[n][0] for n in names if n in self._at}

    def named(self, buffers, names=None) -> dict:
        """{checkpoint name: numpy array} of host buffers (``names``: only those, and only
        their buffers needed: the others may be None)."""
        flat = [None if b is None else np.asarray(b).reshape(-1) for b in buffers]
        out = {}
        for name, (b, at, shape) in self._at.items():
            if names is None or name in names:
                out[name] = flat[b][at].reshape(shape).copy()
        return out

    def buffers(self, named: dict, upto: int | None = None) -> list:
        """Host buffers holding the checkpoint arrays ``named`` (every name of the map), zeros
        elsewhere (the packing's padding), each of its buffer's dtype; ``upto``: only the
        first ``upto`` buffers (and only the names they hold needed). A buffer that one array
        fills is that array itself where its dtype is the buffer's (no copy: the caller's
        array, reshaped), so loading a state holds one host copy of it, not two.

        >>> m = StateMap({"w": np.arange(2) + (1 << SHIFT), "b": np.array([0])}, [((1,), "f8"), ((2,), "f8")])
        >>> w = np.array([3.0, 4.0]); host = m.buffers({"w": w, "b": np.zeros(1)})
        >>> host[1] is w or np.shares_memory(host[1], w), len(m.buffers({"b": np.zeros(1)}, upto=1))
        (True, 1)
        """
        upto = len(self.shapes) if upto is None else upto
        placed = {name: where for name, where in self._at.items() if where[0] < upto}
        missing = sorted(set(placed) - set(named))
        if missing:
            raise KeyError(f"state is missing {missing[:5]}")
        host = [None] * upto
        for name, (b, at, shape) in placed.items():
            if b in self._whole():
                host[b] = self._as_whole(name, named[name], b, shape)
        for b, (shape, dt) in enumerate(self.shapes[:upto]):
            if host[b] is None:
                host[b] = np.zeros(shape, dt)
        flat = [h.reshape(-1) for h in host]
        for name, (b, at, shape) in placed.items():
            if b in self._whole():
                continue
            value = np.asarray(named[name])
            if value.shape != shape:
                raise ValueError(f"state '{name}' has shape {value.shape}, expected {shape}")
            flat[b][at] = value.reshape(-1) if isinstance(at, slice) else value
        return host

    def _whole(self) -> set:
        """The buffers one checkpoint array fills, in order (a run from 0 to the buffer's end)."""
        if self._whole_set is None:
            held = {}
            for name, (b, at, shape) in self._at.items():
                held.setdefault(b, []).append(at)
            self._whole_set = {b for b, ats in held.items() if len(ats) == 1 and isinstance(ats[0], slice)
                               and ats[0].start == 0 and ats[0].stop == int(np.prod(self.shapes[b][0]))}
        return self._whole_set

    def _as_whole(self, name: str, value, b: int, shape: tuple) -> np.ndarray:
        value = np.asarray(value)
        if value.shape != shape:
            raise ValueError(f"state '{name}' has shape {value.shape}, expected {shape}")
        return np.ascontiguousarray(value, self.shapes[b][1]).reshape(self.shapes[b][0])

    def save(self, folder) -> Path:
        path = Path(folder) / self.FILE
        stored = {}
        for name, (b, at, shape) in self._at.items():
            if isinstance(at, slice):
                stored["@" + name] = np.array([b, at.start, *shape], np.int64)
            else:
                stored[name] = at + (b << SHIFT)
        np.savez(path, **stored)
        return path

    @classmethod
    def load(cls, folder, buffers: list) -> "StateMap":
        m = cls({}, buffers)
        path = Path(folder) / cls.FILE
        stored = npz.read(path)
        if stored is None:
            with np.load(path, allow_pickle=False) as z:
                stored = {key: z[key] for key in z.files}
        for key, v in stored.items():
            if key.startswith("@"):
                b, start, *shape = (int(i) for i in v)
                m._at[key[1:]] = b, slice(start, start + int(np.prod(shape, dtype=np.int64))), tuple(shape)
            else:
                m._at[key] = _compact(v)
        return m


def _compact(pos: np.ndarray) -> tuple:
    """(buffer, index, shape) of an array of ``buffer << SHIFT | position``: a slice where the
    positions are one run in order, else the positions themselves."""
    if pos.size == 0:
        return 0, slice(0, 0), pos.shape
    b = int(pos.flat[0] >> SHIFT)
    at = pos & ((1 << SHIFT) - 1)
    start = int(at.flat[0])
    flat = at.reshape(-1)
    if flat[-1] - start == flat.size - 1 and np.array_equal(flat, np.arange(start, start + flat.size)):
        return b, slice(start, start + flat.size), pos.shape
    return b, at, pos.shape
