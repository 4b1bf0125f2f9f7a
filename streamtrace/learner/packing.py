"""Named state <-> a few flat buffers.

Every array leaf crossing a jitted call costs about a microsecond on a small CPU, so the
learner's state (dozens of named arrays) crosses as one 1-D buffer per dtype. Names, shapes
and offsets are static (a ``Layout``); unpacking inside the compiled step is slicing, which
XLA fuses away.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Layout", "path_name"]


def path_name(keypath) -> str:
    parts = []
    for k in keypath:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            parts.append(str(k))
    return ".".join(parts)


@dataclass(frozen=True)
class _Slot:
    name: str
    buffer: int
    offset: int
    shape: tuple
    dtype: np.dtype

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))


class Layout:
    """Static description of a pytree of arrays as flat per-dtype buffers."""

    def __init__(self, tree):
        leaves, self.treedef = jax.tree_util.tree_flatten_with_path(tree)
        self.dtypes: list[np.dtype] = []
        sizes: list[int] = []
        self.slots: list[_Slot] = []
        for kp, leaf in leaves:
            dt = np.dtype(jnp.asarray(leaf).dtype)
            if dt not in self.dtypes:
                self.dtypes.append(dt)
                sizes.append(0)
            b = self.dtypes.index(dt)
            slot = _Slot(path_name(kp), b, sizes[b], tuple(np.shape(leaf)), dt)
            sizes[b] += slot.size
            self.slots.append(slot)
        self.sizes = tuple(sizes)
        names = [s.name for s in self.slots]
        if len(set(names)) != len(names):
            raise ValueError("state names must be unique")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.slots)

    def pack(self, tree) -> tuple:
        """Inside or outside jit: tree -> tuple of 1-D buffers."""
        leaves = self.treedef.flatten_up_to(tree)
        parts = [[] for _ in self.dtypes]
        for slot, leaf in zip(self.slots, leaves):
            parts[slot.buffer].append(jnp.ravel(jnp.asarray(leaf, slot.dtype)))
        return tuple(jnp.concatenate(p) if p else jnp.zeros((0,), dt) for p, dt in zip(parts, self.dtypes))

    def unpack(self, buffers):
        leaves = [buffers[s.buffer][s.offset:s.offset + s.size].reshape(s.shape) for s in self.slots]
        return jax.tree_util.tree_unflatten(self.treedef, leaves)

    def to_named(self, buffers) -> dict:
        """Host copy as {name: numpy array} (for checkpoints and inspection)."""
        host = [np.asarray(b) for b in buffers]
        return {s.name: host[s.buffer][s.offset:s.offset + s.size].reshape(s.shape).copy() for s in self.slots}

    def from_named(self, named: dict) -> tuple:
        host = [np.zeros(n, dt) for n, dt in zip(self.sizes, self.dtypes)]
        for s in self.slots:
            host[s.buffer][s.offset:s.offset + s.size] = np.asarray(named[s.name], s.dtype).ravel()
        return tuple(jnp.asarray(h) for h in host)

    def signature(self) -> list:
        return [[s.name, list(s.shape), s.dtype.str] for s in self.slots]
