"""Per-stream models as a bank of one-slot states, every one stepped by the same program.

A learner with a model per slot (``Slots(n, shared=False)``) keeps its n slots in one state
and steps them with programs over all slots or a few; to make those programs round alike they
step pairs of slots in a loop, and XLA:CPU runs such loop bodies and gathers through its thread
pool at several times a one-slot step's cost (docs/decisions/slot-banks.md). Here each slot's
state is the buffers of one one-slot learner (``one``), and a slot steps alone through that
learner's one compiled step program: every step of every stream is the same program on the
same shapes (the same bits however streams interleave), a lone stream costs one slot, and no
state is gathered or written back.

Seen from outside the bank is an n-slot learner: ``state_dict`` / ``signature`` (the same
names, shapes and checkpoints as ``Slots(n, shared=False)``), ``params``, ``stats``,
``read_slot`` / ``write_slot`` / ``reset_slot`` and ``label`` take a slot. One difference: a
slot counts its own steps only (an n-slot learner counts every call over all its slots).
"""
from __future__ import annotations

import jax
import numpy as np

from .result import StepResult

__all__ = ["SlotBank"]


class SlotBank:
    """``n`` per-stream models; ``make(slots)`` builds the learner (``Slots(slots,
    shared=False)``) the bank keeps one of, with one slot."""

    def __init__(self, make, n: int):
        if n < 1:
            raise ValueError(f"a slot bank needs n >= 1 slots; got {n}")
        self.one = one = make(1)
        if not one.per_slot:
            raise ValueError("a slot bank holds a model per slot (Slots(n, shared=False))")
        self.n = self.slots = n
        self.per_slot, self.pairs = True, False
        self.x_shape, self.out_shape, self.x_dtype, self.y_dtype = one.x_shape, one.out_shape, one.x_dtype, one.y_dtype
        self.label_delay = one.label_delay
        self.programs = one.programs      # compiled once, for every slot (and the engine's warm-up)
        self._initial = [np.asarray(b) for b in one.buffers]     # a fresh slot, on the host
        self.states = [self._fresh() for _ in range(n)]

    def _fresh(self) -> tuple:
        return tuple(jax.device_put(b) for b in self._initial)

    def _check(self, slot: int) -> int:
        if not 0 <= slot < self.n:
            raise IndexError(f"slot {slot} out of range 0..{self.n - 1}")
        return slot

    # ---- steps (the engine's path: inputs already of the right shapes, no validation) ----
    def views(self):
        """The step's input arrays (x, y, active, learn), each with a slot axis of 1: filled
        in place, they serve ``run`` and ``run_predict`` without a copy."""
        return self.programs.step().inputs.views

    def run(self, slot: int) -> StepResult:
        """One step of ``slot`` on what ``views()`` holds."""
        P = self.programs
        return P.decode(self._on(slot, lambda: P.run(*self.views())))

    def run_predict(self, slot: int) -> StepResult:
        """``run``'s prediction and loss without the step (its state untouched; applied False)."""
        P = self.programs
        return P.decode(self._on(slot, lambda: P.run_predict(None, *self.views())))

    # ---- a slot's state ---------------------------------------------------------------
    def _on(self, slot: int, fn):
        """``fn()`` with the one-slot learner holding ``slot``'s state; what it leaves there
        is the slot's state after (also when ``fn`` raises)."""
        one = self.one
        one.buffers = self.states[self._check(slot)]
        try:
            return fn()
        finally:
            self.states[slot] = one.buffers

    def reset_slot(self, slot: int):
        """Fresh state (weights, optimizer, hidden state, traces) for ``slot``."""
        self.states[self._check(slot)] = self._fresh()

    def read_slot(self, slot: int) -> dict:
        return self._on(slot, lambda: self.one.read_slot(0))

    def write_slot(self, slot: int, part: dict):
        self._on(slot, lambda: self.one.write_slot(0, part))

    def label(self, y, age: int = 0, slot: int | None = None):
        if slot is None:
            raise ValueError("label() of a slot bank needs the slot")
        return self._on(slot, lambda: self.one.label(y, age=age, slot=0))

    # ---- the whole bank, as an n-slot learner --------------------------------------------
    def _each(self, fn) -> list:
        return [self._on(s, fn) for s in range(self.n)]

    def _stacked(self, fn) -> dict:
        """``fn()`` ({name: array with a slot axis of 1}) of every slot, concatenated."""
        per = self._each(fn)
        return {k: np.concatenate([p[k] for p in per]) for k in per[0]}

    def state_dict(self) -> dict:
        """``{name: array}`` with the slots stacked first: ``Slots(n, shared=False)``'s names
        and shapes, so checkpoints are the same files."""
        return self._stacked(self.one.state_dict)

    def load_state_dict(self, named: dict):
        """Refused (nothing changes) unless every array has the n slots first and fits one slot."""
        split = []
        for name, v in named.items():
            if np.ndim(v) < 1 or np.shape(v)[0] != self.n:
                raise ValueError(f"state '{name}' has shape {np.shape(v)}, expected {self.n} slots first")
        one, old = self.one, self.one.buffers
        try:
            for s in range(self.n):
                one.load_state_dict({k: np.asarray(v)[s:s + 1] for k, v in named.items()})
                split.append(one.buffers)
        finally:
            one.buffers = old
        self.states = split

    def signature(self) -> dict:
        """``Slots(n, shared=False)``'s: the one-slot learner's with n slots first."""
        sig = self.one.signature()
        grow = lambda entries: [[name, [self.n] + list(shape[1:]), dt] for name, shape, dt in entries]
        return {**sig, "slots": self.n, "state": grow(sig["state"]), "state_dict": grow(sig["state_dict"])}

    @property
    def params(self) -> dict:
        """Current weights, ``{name: array}``, slot axis first."""
        return self._stacked(lambda: self.one.params)

    def stats(self) -> dict:
        """Counters summed over slots ("step": the most any slot took), per-slot prequential
        loss and rolling metrics."""
        per = self._each(self.one.stats)
        out = {k: sum(p[k] for p in per) for k, v in per[0].items() if isinstance(v, int)}
        out["step"] = max(p["step"] for p in per)
        out["prequential_loss"] = np.concatenate([p["prequential_loss"] for p in per])
        out["metrics"] = {k: np.concatenate([p["metrics"][k] for p in per]) for k in per[0]["metrics"]}
        return out
