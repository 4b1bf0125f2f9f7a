"""Reading and writing a few slots' state straight from the packed buffers.

A call over m of N slots needs those slots' rows of every per-slot leaf. Leaf by leaf that
was a gather and a scatter per leaf, then a pad and a concatenate of the whole packed
buffer. Here each packed buffer is read with one gather and written with one scatter, at
positions from the static layout and the run-time slot indices (one small kernel);
standalone leaves (weights, moments, traces) are one gather / scatter each, as before.
GRU-64 D-RTRL, 16 slots, two-slot call: kernels outside the step's loop 74 -> 46 (a model
per slot) and 59 -> 33 (shared weights). The step sees the same arrays as before, so its
arithmetic (and its answers, bit for bit) is unchanged: the loop still carries the state
leaf by leaf (carried packed, XLA fused the step differently and answers moved by an ulp).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .packing import Layout

__all__ = ["SlotRows"]


class SlotRows:
    """Where the per-slot leaves (``names``, slot axis first, N slots) lie in ``layout``."""

    def __init__(self, layout: Layout, names, n: int):
        self.layout, self.n = layout, n
        names = set(names)
        self.slotted = {}    # packed buffer -> [(_Slot, per-slot size)] of its per-slot leaves
        self.shared = {}     # packed buffer -> [_Slot] of its other leaves
        for s in layout.slots:
            if s.name in names:
                self.slotted.setdefault(s.buffer, []).append((s, s.size // n))
            else:
                self.shared.setdefault(s.buffer, []).append(s)
        self.alone = [name in names for name in layout.alone_names]   # standalone and per-slot

    def _index(self, b, idx):
        """Flat positions of the slots ``idx`` (m,) in packed buffer b, leaf by leaf, each
        leaf's block (m, per-slot size) in slot order: start + idx[slot] * size + offset,
        the static parts as constants, so the positions are one small kernel."""
        m = idx.shape[0]
        base, which, scale = [], [], []
        for s, per in self.slotted[b]:
            base.append(np.tile(self.layout.offset(s) + np.arange(per), m))
            which.append(np.repeat(np.arange(m), per))
            scale.append(np.full(m * per, per))
        base, which, scale = (np.concatenate(v).astype(np.int32) for v in (base, which, scale))
        return base + idx[which] * scale

    def gather(self, buffers, idx) -> dict:
        """{leaf name: (m, ...) array} for every per-slot leaf, packed or standalone."""
        m, out = idx.shape[0], {}
        for b, leaves in self.slotted.items():
            flat = buffers[b].reshape(-1)[self._index(b, idx)]
            at = 0
            for s, per in leaves:
                out[s.name] = flat[at:at + m * per].reshape((m,) + s.shape[1:])
                at += m * per
        n_packed = len(self.layout.dtypes)
        for k, name in enumerate(self.layout.alone_names):
            if self.alone[k]:
                out[name] = buffers[n_packed + k][idx]
        return out

    def scatter(self, buffers, idx, named: dict) -> tuple:
        """``buffers`` with the slots ``idx`` of every per-slot leaf set from ``named``
        (m, ...) and every other leaf replaced by ``named[name]`` whole."""
        n_packed, out = len(self.layout.dtypes), list(buffers)
        for b in range(n_packed):
            pos, val = [], []
            if b in self.slotted:
                pos.append(self._index(b, idx))
                val += [jnp.ravel(named[s.name]) for s, _ in self.slotted[b]]
            for s in self.shared.get(b, []):
                pos.append(self.layout.offset(s) + np.arange(s.size, dtype=np.int32))
                val.append(jnp.ravel(named[s.name]))
            if pos:
                flat = buffers[b].reshape(-1)
                dt = flat.dtype
                flat = flat.at[jnp.concatenate(pos)].set(jnp.concatenate([v.astype(dt) for v in val]))
                out[b] = flat.reshape(buffers[b].shape)
        for k, name in enumerate(self.layout.alone_names):
            j = n_packed + k
            out[j] = buffers[j].at[idx].set(named[name]) if self.alone[k] else named[name].astype(buffers[j].dtype)
        return tuple(out)

    def add_to_column(self, buffers, name: str, col: int, values) -> tuple:
        """Add ``values`` (N,) to column ``col`` of the per-slot leaf ``name`` (N, C)."""
        out = list(buffers)
        for b, leaves in self.slotted.items():
            for s, per in leaves:
                if s.name == name:
                    flat = out[b].reshape(-1)
                    pos = self.layout.offset(s) + jnp.arange(self.n) * per + col
                    out[b] = flat.at[pos].add(values.astype(flat.dtype)).reshape(out[b].shape)
                    return tuple(out)
        k = self.layout.alone_names.index(name)
        j = len(self.layout.dtypes) + k
        out[j] = out[j].at[:, col].add(values.astype(out[j].dtype))
        return tuple(out)
