"""Where each checkpoint array lives in an exported step program's buffers (numpy only).

The program's state crosses as a few buffers: small leaves packed per dtype, big ones alone
(``learner/packing.py``), the weight block split by parameter in a checkpoint. The map holds,
for every checkpoint array, the flat positions of its values in one buffer, encoded as
``buffer << SHIFT | position`` in an int64 array of the checkpoint array's shape; it is made
by running the learner's own buffers -> checkpoint code on buffers of positions (write.py), so
both directions are exact copies, and it is stored as a plain ``.npz`` (no pickle).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

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
        self.positions = {k: np.asarray(v, np.int64) for k, v in positions.items()}
        self.shapes = [(tuple(int(d) for d in shape), np.dtype(dt)) for shape, dt in buffers]

    def _where(self, name):
        pos = self.positions[name]
        if pos.size == 0:
            return 0, pos
        return int(pos.flat[0] >> SHIFT), pos & ((1 << SHIFT) - 1)

    def named(self, buffers, names=None) -> dict:
        """{checkpoint name: numpy array} of host buffers (``names``: only those)."""
        flat = [np.asarray(b).reshape(-1) for b in buffers]
        out = {}
        for name, pos in self.positions.items():
            if names is not None and name not in names:
                continue
            b, at = self._where(name)
            out[name] = flat[b][at].copy() if pos.size else np.zeros(pos.shape, flat[b].dtype)
        return out

    def buffers(self, named: dict) -> list:
        """Host buffers holding the checkpoint arrays ``named`` (every name of the map), zeros
        elsewhere (the packing's padding), each of its buffer's dtype."""
        missing = sorted(set(self.positions) - set(named))
        if missing:
            raise KeyError(f"state is missing {missing[:5]}")
        host = [np.zeros(shape, dt) for shape, dt in self.shapes]
        flat = [h.reshape(-1) for h in host]
        for name, pos in self.positions.items():
            value = np.asarray(named[name])
            if value.shape != pos.shape:
                raise ValueError(f"state '{name}' has shape {value.shape}, expected {pos.shape}")
            b, at = self._where(name)
            flat[b][at] = value
        return host

    def save(self, folder) -> Path:
        path = Path(folder) / self.FILE
        np.savez(path, **self.positions)
        return path

    @classmethod
    def load(cls, folder, buffers: list) -> "StateMap":
        with np.load(Path(folder) / cls.FILE, allow_pickle=False) as z:
            return cls({k: z[k] for k in z.files}, buffers)
