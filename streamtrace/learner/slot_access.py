"""A learner's slots one at a time: start one afresh, read one out, write one back.

``SlotAccess`` is mixed into ``OnlineLearner``; it uses the learner's ``programs`` (the
compiled reset / read / write programs), ``slots``, ``n`` and ``buffers``.
"""
from __future__ import annotations

import jax
import numpy as np

__all__ = ["SlotAccess"]


class SlotAccess:
    """Per-slot state access of a learner with slots (a mixin of ``OnlineLearner``)."""
    def reset_slot(self, slot: int):
        """A stream left and another joins: start ``slot`` afresh.

        Fresh hidden state and traces for ``slot`` (and, with per-slot weights, fresh
        weights); the other slots are untouched.

        Parameters
        ----------
        slot : int
            The slot index, 0..N-1.

        Examples
        --------
        >>> import numpy as np, streamtrace as st
        >>> model = st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1)
        >>> L = st.OnlineLearner(model, np.zeros(1, np.float32), slots=2)
        >>> import jax
        >>> before = L.read_slot(0)["hidden"]
        >>> _ = L.step(np.ones((2, 1), np.float32), np.ones((2, 1), np.float32))
        >>> L.reset_slot(0)
        >>> all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(before),
        ...                                          jax.tree_util.tree_leaves(L.read_slot(0)["hidden"])))
        True
        """
        self.buffers = self.programs.reset()(self.buffers, self._slot_index(slot))

    def _slot_index(self, slot: int) -> np.int32:
        if self.slots is None:
            raise ValueError("slot access needs a learner with slots")
        if not 0 <= slot < self.n:
            raise IndexError(f"slot {slot} out of range 0..{self.n - 1}")
        return np.int32(slot)

    def read_slot(self, slot: int) -> dict:
        """One slot's state, to be put back later with ``write_slot``.

        Its hidden state, traces, pending forecast input and loss (with per-slot weights
        also its weights, optimizer state and counters), as a dict of numpy arrays: to park
        a stream that pauses, or move it to another slot.

        Parameters
        ----------
        slot : int
            The slot index, 0..N-1.

        Returns
        -------
        dict
            The slot's parts (hidden, traces, ...), each a tree of numpy arrays.

        Examples
        --------
        >>> import numpy as np, streamtrace as st
        >>> L = st.OnlineLearner(st.nn.Stack("gru", n_in=1, n_hidden=4, n_out=1), np.zeros(1, np.float32), slots=2)
        >>> sorted(L.read_slot(0))
        ['hidden', 'rollback', 'stats', 'traces']
        """
        return self.read_slot_of(self.buffers, slot)

    def read_slot_of(self, buffers, slot: int) -> dict:
        """``read_slot`` of ``buffers``."""
        return jax.device_get(self.programs.read_slot()(buffers, self._slot_index(slot)))

    def write_slot(self, slot: int, part: dict):
        """Replace ``slot``'s state with ``part`` (from ``read_slot``); other slots are untouched."""
        self.buffers = self.write_slot_of(self.buffers, slot, part)

    def write_slot_of(self, buffers, slot: int, part: dict) -> tuple:
        """``buffers`` with ``slot``'s state replaced by ``part`` (the buffers given are kept:
        nothing donated); a ValueError if ``part`` does not fit."""
        i = self._slot_index(slot)
        program = self.programs.write_slot()
        want = self.programs.slot_struct()
        if jax.tree_util.tree_structure(part) != jax.tree_util.tree_structure(want) or any(
                np.shape(a) != w.shape for a, w in zip(jax.tree_util.tree_leaves(part), jax.tree_util.tree_leaves(want))):
            raise ValueError("slot state does not match this learner's slot layout (use read_slot of the same learner)")
        part = jax.tree_util.tree_map(lambda a, w: np.asarray(a, w.dtype), part, want)
        return program(buffers, i, part)
