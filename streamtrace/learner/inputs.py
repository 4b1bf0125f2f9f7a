"""A call's small inputs (x, y, the masks, a subset's slot indices) as one byte buffer.

Every numpy array passed to a compiled program is copied to the device on its own, and four
such copies are a noticeable share of a small step (measured: docs/decisions/step-details.md,
packed-buffers.md). Packed into one buffer they cross as one copy, and
the program takes them apart again by slicing and bitcasting its bytes (exact for any dtype).

``PackedInputs`` owns a reusable buffer and numpy views of it, one per input: a caller that
fills the views (the engine) passes no copy at all; ``pack`` copies other arrays in.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["PackedInputs"]

_ALIGN = 8


class PackedInputs:
    """Inputs of fixed shapes and dtypes laid out in one uint8 buffer (each at an 8-byte
    aligned offset). ``views``: writable numpy arrays over the buffer, in input order."""

    def __init__(self, examples):
        # the dtype jax gives the input (float64 -> float32 without x64), which is what
        # copying into the view converts to
        self.specs = [(tuple(np.shape(e)), np.dtype(jax.dtypes.canonicalize_dtype(np.asarray(e).dtype)))
                      for e in examples]
        self.offsets, end = [], 0
        for shape, dt in self.specs:
            self.offsets.append(end)
            end += -(-(int(np.prod(shape, dtype=np.int64)) * dt.itemsize) // _ALIGN) * _ALIGN
        self.buffer = np.zeros(max(end, _ALIGN), np.uint8)
        self.views = tuple(np.ndarray(shape, dt, self.buffer, off)
                           for (shape, dt), off in zip(self.specs, self.offsets))

    def pack(self, *arrays) -> np.ndarray:
        """The buffer holding ``arrays`` (the views themselves are not copied). Shapes must
        match exactly (a compiled program would refuse others; numpy would broadcast them)."""
        if len(arrays) != len(self.views):
            raise TypeError(f"the program takes {len(self.views)} inputs; got {len(arrays)}")
        for i, (view, a) in enumerate(zip(self.views, arrays)):
            if a is not view:
                if np.shape(a) != view.shape:
                    raise ValueError(f"input {i} has shape {np.shape(a)}, the program was compiled for {view.shape}")
                view[...] = a
        return self.buffer

    def unpack(self, io):
        """Inside jit: the uint8 buffer -> the inputs, bit for bit."""
        out = []
        for (shape, dt), off in zip(self.specs, self.offsets):
            size = int(np.prod(shape, dtype=np.int64))
            raw = io[off:off + size * dt.itemsize]
            if dt == np.bool_:
                v = raw != 0
            elif dt.itemsize == 1:
                v = jax.lax.bitcast_convert_type(raw, dt)
            else:
                v = jax.lax.bitcast_convert_type(raw.reshape(size, dt.itemsize), dt)
            out.append(jnp.reshape(v, shape))
        return out
