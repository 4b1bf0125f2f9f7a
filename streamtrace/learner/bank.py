"""Per-stream models as a bank of one-slot states, every one stepped by the same program.

A learner with a model per slot (``Slots(n, shared=False)``) keeps its n slots in one state
and steps them with programs over all slots or a few; to make those programs round alike they
step pairs of slots in a loop, and XLA:CPU runs such loop bodies and gathers through its thread
pool at several times a one-slot step's cost (docs/decisions/slot-banks.md). Here each slot's
state is buffers of the layout of one one-slot learner (``one``), held here (``states``), and a
slot steps alone through that learner's compiled step program, its buffers passed in and the
new ones kept (nothing is swapped into the learner): every step of every stream is the same
program on the same shapes (the same bits however streams interleave), a lone stream costs
one slot, and no state is gathered or written back.

Weights no step changes (a frozen reservoir beside a learned cell, ``learner.fixed``) are the
last of the buffers (packing.py ``fixed_from``), which the step programs neither donate nor
return: the bank holds them once, every slot's state tuple ending in the same arrays, and a
slot costs only the rest (``slot_bytes``). A state written in (``write_slot``,
``load_state_dict``) whose fixed weights differ from that copy is refused, nothing changed: a
model per stream starts from the same weights, and frozen ones stay so.

Seen from outside the bank is an n-slot learner: ``state_dict`` / ``signature`` (the same
names, shapes and checkpoints as ``Slots(n, shared=False)``), ``params``, ``stats``,
``read_slot`` / ``write_slot`` / ``reset_slot`` and ``label`` take a slot. One difference: a
slot counts its own steps only (an n-slot learner counts every call over all its slots).
"""
from __future__ import annotations

import jax
import numpy as np
from streamtrace_runner.bank import grown_signature      # jax-free, shared with the runner's bank

from .packing import path_name
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
        f = self._f = one.layout.fixed_from
        self._fixed_names = one.layout.alone_names[f - len(one.layout.dtypes):]
        self._initial = [np.asarray(b) for b in one.buffers]     # a fresh slot, on the host
        for b in self._initial[f:]:          # handed out by read_slot: nobody writes them
            b.setflags(write=False)
        self.shared = tuple(jax.device_put(b) for b in self._initial[f:])    # one copy, all slots
        self.states = [self._fresh() for _ in range(n)]     # each slot's buffers, owned here
        self._views = None

    def _fresh(self) -> tuple:
        return tuple(jax.device_put(b) for b in self._initial[:self._f]) + self.shared

    def _sharing(self, buffers) -> tuple:
        """``buffers`` with the bank's copy of the fixed weights in place of theirs; a
        ValueError (naming the weights) if theirs differ from it, bit for bit."""
        f = self._f
        for name, b, mine, host in zip(self._fixed_names, buffers[f:], self.shared, self._initial[f:]):
            if b is not mine and np.asarray(b).tobytes() != host.tobytes():
                raise ValueError(f"fixed weights '{name}' differ from the copy all slots of this bank share "
                                 "(frozen weights are the same for every stream and never change)")
        return tuple(buffers[:f]) + self.shared

    def slot_bytes(self) -> int:
        """Bytes of one slot's own state (its buffers but the shared fixed weights)."""
        return sum(b.nbytes for b in self.states[0][:self._f])

    def shared_bytes(self) -> int:
        """Bytes of the fixed weights, held once for all slots."""
        return sum(b.nbytes for b in self.shared)

    def _check(self, slot: int) -> int:
        if not 0 <= slot < self.n:
            raise IndexError(f"slot {slot} out of range 0..{self.n - 1}")
        return slot

    # ---- steps (the engine's path: inputs already of the right shapes, no validation) ----
    def views(self):
        """The step's input arrays (x, y, active, learn), each with a slot axis of 1: filled
        in place, they serve ``run`` and ``run_predict`` without a copy."""
        if self._views is None:
            self._views = self.programs.step().inputs.views
        return self._views

    def run(self, slot: int, x=None, y=None, learn: bool = True) -> StepResult:
        """One step of ``slot`` on what ``views()`` holds, or (x given) on x, y (None: none)
        and ``learn``, written into the views first (the engine's path: one call a step)."""
        P, views = self.programs, self._views or self.views()
        if x is not None:
            _fill(views, x, y, learn)
        self.states[slot], vec = P.run(self.states[self._check(slot)], *views)
        return P.decode(vec)

    def run_predict(self, slot: int, x=None, y=None, learn: bool = True) -> StepResult:
        """``run``'s prediction and loss without the step (its state untouched; applied False)."""
        P, views = self.programs, self._views or self.views()
        if x is not None:
            _fill(views, x, y, learn)
        return P.decode(P.run_predict(self.states[self._check(slot)], None, *views))

    # ---- a slot's state ---------------------------------------------------------------
    def reset_slot(self, slot: int):
        """Fresh state (weights, optimizer, hidden state, traces) for ``slot``."""
        self.states[self._check(slot)] = self._fresh()

    def read_slot(self, slot: int) -> dict:
        """The slot's state (``OnlineLearner.read_slot``); its fixed weights are the bank's
        read-only host copy, not a copy per read (a parked stream keeps only its own state)."""
        part = self.one.read_slot_of(self.states[self._check(slot)], 0)
        fixed = dict(zip(self._fixed_names, self._initial[self._f:]))
        leaves, tree = jax.tree_util.tree_flatten_with_path(part)
        return jax.tree_util.tree_unflatten(tree, [fixed[path_name(kp)][0] if path_name(kp) in fixed else v
                                                   for kp, v in leaves])

    def write_slot(self, slot: int, part: dict):
        """Refused (ValueError, nothing changed) if ``part``'s fixed weights are not the bank's."""
        self.states[slot] = self._sharing(self.one.write_slot_of(self.states[self._check(slot)], 0, part))

    def label(self, y, age: int = 0, slot: int | None = None):
        if slot is None:
            raise ValueError("label() of a slot bank needs the slot")
        one, slot = self.one, self._check(slot)
        self.states[slot], *got = one.label_of(self.states[slot], y, age=age, slot=0)
        return one.label_result(*got, age)

    # ---- the whole bank, as an n-slot learner --------------------------------------------
    def _stacked(self, fn) -> dict:
        """``fn(buffers)`` ({name: array with a slot axis of 1}) of every slot, concatenated."""
        per = [fn(b) for b in self.states]
        return {k: np.concatenate([p[k] for p in per]) for k in per[0]}

    def state_dict(self) -> dict:
        """``{name: array}`` with the slots stacked first: ``Slots(n, shared=False)``'s names
        and shapes, so checkpoints are the same files."""
        return self._stacked(self.one.state_dict_of)

    def load_state_dict(self, named: dict):
        """Refused (nothing changes) unless every array has the n slots first and fits one slot,
        and every slot's fixed weights are the bank's."""
        for name, v in named.items():
            if np.ndim(v) < 1 or np.shape(v)[0] != self.n:
                raise ValueError(f"state '{name}' has shape {np.shape(v)}, expected {self.n} slots first")
        self.states = [self._sharing(self.one.buffers_of({k: np.asarray(v)[s:s + 1] for k, v in named.items()}))
                       for s in range(self.n)]

    def signature(self) -> dict:
        """``Slots(n, shared=False)``'s: the one-slot learner's with n slots first."""
        return grown_signature(self.one.signature(), self.n)

    @property
    def params(self) -> dict:
        """Current weights, ``{name: array}``, slot axis first."""
        return self._stacked(self.one.params_of)

    def predictor_state(self) -> dict:
        """``OnlineLearner.predictor_state`` of every slot, slot axis first."""
        return self._stacked(self.one.predictor_state_of)

    def stats(self) -> dict:
        """Counters summed over slots ("step": the most any slot took), per-slot prequential
        loss and rolling metrics, and the seasons in use where the learner reports them."""
        per = [self.one.stats_of(b) for b in self.states]
        out = {k: sum(p[k] for p in per) for k, v in per[0].items() if isinstance(v, int)}
        out["step"] = max(p["step"] for p in per)
        out["prequential_loss"] = np.concatenate([p["prequential_loss"] for p in per])
        out["metrics"] = {k: np.concatenate([p["metrics"][k] for p in per]) for k in per[0]["metrics"]}
        if "seasons" in per[0]:
            out["seasons"] = np.concatenate([p["seasons"] for p in per])
        return out


def _fill(views, x, y, learn):
    """One step's inputs into the views (x, y, active, learn) of a one-slot step."""
    views[0][0] = x
    views[1][0] = 0 if y is None else y
    views[2][0] = True
    views[3][0] = learn
