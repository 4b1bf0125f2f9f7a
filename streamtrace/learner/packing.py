"""Named state <-> a few packed buffers.

Every array leaf crossing a jitted call has a fixed cost on a small CPU (measured:
docs/decisions/step-details.md), so the learner's state (dozens of named arrays) crosses as
one buffer per dtype. Names, shapes and offsets are static (a ``Layout``); unpacking inside
the compiled step is slicing.

Buffers are 2-D, (rows, width), each leaf a block of whole rows, with the width chosen to
match the trailing size of the big leaves (usually the hidden size). Measured on a 2-vCPU
CPU: writing a (66, 64) trace update into a 1-D buffer costs 2.5x more than into a 2-D one,
because XLA's CPU loop emitter must recover every multi-dimensional index by division.
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
    row: int      # first row of the block
    rows: int
    shape: tuple
    dtype: np.dtype

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))


def _trailing_products(shape):
    out, p = [], 1
    for d in reversed(shape):
        p *= d
        out.append(p)
    return out


def choose_width(shapes, lo=8, hi=4096) -> int:
    """The row width that lets the most elements map to rows without index arithmetic."""
    score = {}
    for shape in shapes:
        size = int(np.prod(shape, dtype=np.int64))
        for w in set(_trailing_products(shape)):
            if lo <= w <= hi:
                score[w] = score.get(w, 0) + size
    return max(score, key=lambda w: (score[w], w)) if score else lo


def _dtype(leaf) -> np.dtype:
    """A leaf's dtype as jax stores it (x64 off: float64 -> float32), without making an array
    of it: leaves may be shapes only (``jax.eval_shape``)."""
    dt = getattr(leaf, "dtype", None)
    return np.dtype(jax.dtypes.canonicalize_dtype(dt if dt is not None else np.result_type(leaf)))


CHAIN = 16     # a packed buffer of more leaves is written leaf by leaf (Layout.pack)


def _join_rows(blocks, shape):
    """The (rows, width) buffer of ``blocks`` ((row, block) in row order, one per leaf)."""
    if len(blocks) <= CHAIN:
        return jnp.concatenate([b for _, b in blocks], axis=0)
    buf = jnp.zeros(shape, blocks[0][1].dtype)
    for row, block in blocks:
        buf = jax.lax.dynamic_update_slice(buf, block, (row, 0))
    return buf


class Layout:
    """Static description of a pytree of arrays as per-dtype (rows, width) buffers, plus the
    leaves of at least ``standalone`` elements as buffers of their own, and last the leaves
    named in ``fixed`` (weights no step changes), each a buffer of its own whatever its size:
    ``fixed_from`` is where they start in the buffers, so a caller may pass them apart.

    Packing costs a copy of every leaf per step; for big leaves (weights, moments, traces)
    that copy costs more than an extra buffer does (docs/decisions/step-details.md), and a
    buffer of its own can be updated in place when the call donates its inputs.
    """

    def __init__(self, tree, standalone: int | None = None, fixed=()):
        leaves, self.treedef = jax.tree_util.tree_flatten_with_path(tree)
        big = (lambda leaf: standalone is not None and int(np.prod(np.shape(leaf))) >= standalone)
        fixed = set(fixed)
        is_fixed = [path_name(kp) in fixed for kp, _ in leaves]
        if sum(is_fixed) != len(fixed):
            raise ValueError(f"fixed leaves {sorted(fixed)} are not all in the state")
        self.alone = [i for i, (_, leaf) in enumerate(leaves) if big(leaf) and not is_fixed[i]] + \
            [i for i in range(len(leaves)) if is_fixed[i]]
        self.alone_names = [path_name(leaves[i][0]) for i in self.alone]
        alone = set(self.alone)
        self._all_names = [path_name(kp) for kp, _ in leaves]
        self._alone_meta = [(tuple(np.shape(leaves[i][1])), _dtype(leaves[i][1]))
                            for i in self.alone]
        leaves = [lf for i, lf in enumerate(leaves) if i not in alone]
        self._packed_index = [i for i in range(len(self._all_names)) if i not in alone]
        self.dtypes: list[np.dtype] = []
        groups: list[list] = []
        for _, leaf in leaves:
            dt = _dtype(leaf)
            if dt not in self.dtypes:
                self.dtypes.append(dt)
                groups.append([])
            groups[self.dtypes.index(dt)].append(tuple(np.shape(leaf)))
        self.widths = tuple(choose_width(g) for g in groups)
        self.fixed_from = len(self.dtypes) + len(self.alone) - len(fixed)    # buffers[fixed_from:]
        rows = [0] * len(self.dtypes)
        self.slots: list[_Slot] = []
        for kp, leaf in leaves:
            dt = _dtype(leaf)
            b = self.dtypes.index(dt)
            size = int(np.prod(np.shape(leaf), dtype=np.int64))
            n_rows = max(1, -(-size // self.widths[b]))
            self.slots.append(_Slot(path_name(kp), b, rows[b], n_rows, tuple(np.shape(leaf)), dt))
            rows[b] += n_rows
        self.shapes = tuple((r, w) for r, w in zip(rows, self.widths))
        if len(set(self._all_names)) != len(self._all_names):
            raise ValueError("state names must be unique")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._all_names)

    def offset(self, slot: _Slot) -> int:
        """Where a packed leaf starts in its buffer, flattened."""
        return slot.row * self.widths[slot.buffer]

    def _split(self, leaves):
        return [leaves[i] for i in self._packed_index], [leaves[i] for i in self.alone]

    def _join(self, packed, alone):
        out = [None] * len(self._all_names)
        for i, v in zip(self._packed_index, packed):
            out[i] = v
        for i, v in zip(self.alone, alone):
            out[i] = v
        return out

    def _block(self, slot, leaf):
        w = self.widths[slot.buffer]
        flat = jnp.ravel(jnp.asarray(leaf, slot.dtype))
        pad = slot.rows * w - slot.size
        if pad:
            flat = jnp.pad(flat, (0, pad))
        return flat.reshape(slot.rows, w)

    def pack(self, tree) -> tuple:
        """Inside or outside jit: tree -> (packed (rows, width) buffers..., standalone leaves...).

        A buffer of more than ``CHAIN`` leaves is written leaf by leaf (``dynamic_update_slice``,
        each write after the one before), not concatenated at once: XLA's CPU runtime runs a
        step's kernels as a graph and hands some to a second thread whenever more than about 7
        are ready together, and a long concatenation's operands (a kernel per leaf) were often
        ready together at the step's end; a handoff costs a one-slot step more than the
        combiner's arithmetic (docs/quality.md, "The step."). A short one costs a kernel less
        per leaf as it is."""
        packed, alone = self._split(self.treedef.flatten_up_to(tree))
        parts = [[] for _ in self.dtypes]
        for slot, leaf in zip(self.slots, packed):
            parts[slot.buffer].append((slot.row, self._block(slot, leaf)))
        return tuple(_join_rows(p, shape) for p, shape in zip(parts, self.shapes)) + tuple(
            jnp.asarray(a, dt) for a, (_, dt) in zip(alone, self._alone_meta))

    def _view(self, buf, slot):
        block = buf[slot.row:slot.row + slot.rows]
        if slot.rows * buf.shape[1] == slot.size:
            return block.reshape(slot.shape)
        return block.reshape(-1)[:slot.size].reshape(slot.shape)

    def unpack(self, buffers):
        n = len(self.dtypes)
        packed = [self._view(buffers[s.buffer], s) for s in self.slots]
        return jax.tree_util.tree_unflatten(self.treedef, self._join(packed, list(buffers[n:])))

    def to_named(self, buffers, prefix: str = "") -> dict:
        """Host copy as {name: numpy array} (for checkpoints and inspection); with ``prefix``,
        only the leaves whose names start with it (and only their buffers are copied)."""
        n = len(self.dtypes)
        host = {}

        def buf(i):
            if i not in host:
                host[i] = np.asarray(buffers[i])
            return host[i]
        out = {}
        for s in self.slots:
            if s.name.startswith(prefix):
                out[s.name] = np.array(self._view(buf(s.buffer), s))
        for k, name in enumerate(self.alone_names):
            if name.startswith(prefix):
                out[name] = np.array(buf(n + k))
        return {name: out[name] for name in self._all_names if name in out}

    def from_named(self, named: dict) -> tuple:
        host = [np.zeros(shape, dt) for shape, dt in zip(self.shapes, self.dtypes)]
        for s in self.slots:
            w = self.widths[s.buffer]
            flat = np.zeros(s.rows * w, s.dtype)
            flat[:s.size] = np.asarray(named[s.name], s.dtype).ravel()
            host[s.buffer][s.row:s.row + s.rows] = flat.reshape(s.rows, w)
        alone = [np.asarray(named[n], dt).reshape(shape)
                 for n, (shape, dt) in zip(self.alone_names, self._alone_meta)]
        return tuple(jnp.asarray(h) for h in host + alone)

    def entries(self) -> list[tuple[str, tuple, np.dtype]]:
        """(name, shape, dtype) of every leaf, in tree order."""
        meta = {s.name: (s.shape, s.dtype) for s in self.slots}
        meta.update({n: m for n, m in zip(self.alone_names, self._alone_meta)})
        return [(n, *meta[n]) for n in self._all_names]

    def signature(self) -> list:
        return [[n, list(shape), dt.str] for n, shape, dt in self.entries()]
