"""Delayed labels (supervised mode, ``Supervised(label_delay=d)``): the target of step t may
come while at most d - 1 later steps have run (``age`` 0..d-1). Each slot keeps a ring of d
entries; the entry of step t holds what the gradient of that step needs once its target is
known, and nothing else:

    grad    the step's online gradient per output value: for output value o, the gradient of
            out_t[o] w.r.t. every weight, through the step-t eligibility traces (the traces
            contracted with the learning signal's Jacobian: one VJP of the step per output
            value). A target y then gives the step's gradient as sum_o dL/dout_t[o] * grad[o].
    pred    the step-t prediction (dL/dout_t needs it and y)
    tag     the slot's step count at step t (which step the entry holds)
    state   0 empty (never written, or a step that did not learn), 1 waiting, 2 labelled

and per slot ``count``, its number of steps so far. Per slot that is

    bytes = d * (n_out * n_params * s + n_out * s + 8) + 4

with s the size of the model's float dtype (4 or 8), n_params the number of weight values
and n_out the number of output values (``ring_bytes``). The label is applied by a compiled
program of its own (``Programs.label``): the gradient goes through the learner's optimizer
at once (at arrival), with the weights as they are then. A step whose label never comes
never updates the weights.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from .step import StepFunctions, _carried_finite, _lead, _slot_sum, _slot_where

__all__ = ["LabelError", "LabelResult", "LABEL_CODES", "LabelledSteps", "PairRing", "ring_bytes", "init_ring",
           "delayed_step", "apply_label"]

# the status a label program returns, and the error code of each (0: applied)
LABEL_CODES = {1: "unknown_label", 2: "label_too_late", 3: "already_labelled", 4: "not_finite"}
_UNKNOWN, _LATE, _TWICE, _NAN = 1, 2, 3, 4
_EMPTY, _WAITING, _LABELLED = 0, 1, 2


class LabelError(ValueError):
    """A label that cannot be applied; ``code``: unknown_label, label_too_late,
    already_labelled, not_finite or bad_shape. The learner's state is unchanged."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class LabelResult:
    loss: float        # the loss of the step's prediction against the label
    applied: bool      # the gradient reached the weights (False: not finite, refused and counted)


# the message of each status a label program returns
LABEL_MESSAGES = {_UNKNOWN: "no learning step {age} steps back (none yet, or it did not learn)",
                  _LATE: "the step {age} steps back is beyond label_delay",
                  _TWICE: "the step {age} steps back was already labelled",
                  _NAN: "label contains NaN or Inf"}


def checked_label(y, age, label_delay: int, shape: tuple, dtype):
    """``y`` as an array of ``shape`` and ``dtype``, or a ``LabelError`` for a label no
    program needs to see: the wrong shape, a value not finite, an ``age`` that is not a
    count of steps back or is beyond ``label_delay``."""
    y = np.asarray(y, dtype)
    if y.shape != shape:
        raise LabelError("bad_shape", f"label has shape {y.shape}, expected {shape}")
    if not np.isfinite(y).all():
        raise LabelError("not_finite", "label contains NaN or Inf")
    if not isinstance(age, (int, np.integer)) or age < 0:
        raise LabelError("unknown_label", f"age must be an integer >= 0 (steps back); got {age!r}")
    if age >= label_delay:
        raise LabelError("label_too_late", f"the step {age} steps back is beyond label_delay = {label_delay}")
    return y


def label_outcome(status, loss, applied, slot, age: int) -> LabelResult:
    """A label program's outcome: its ``LabelResult``, or the ``LabelError`` its status means."""
    status = int(status)
    if status:
        raise LabelError(LABEL_CODES[status], LABEL_MESSAGES[status].format(age=age, slot=slot))
    return LabelResult(float(loss), bool(applied))


def ring_bytes(label_delay: int, n_out: int, n_params: int, itemsize: int) -> int:
    """Bytes of one slot's label ring (see the module's docstring)."""
    return label_delay * (n_out * n_params * itemsize + n_out * itemsize + 8) + 4


def init_ring(d: int, n_slots: int, params: dict, out_shape: tuple, out_dtype) -> dict:
    n_out = math.prod(out_shape)
    return {"grad": {k: jnp.zeros((n_slots, d, n_out) + jnp.shape(v), jnp.asarray(v).dtype)
                     for k, v in params.items()},
            "pred": jnp.zeros((n_slots, d) + tuple(out_shape), out_dtype),
            "tag": jnp.zeros((n_slots, d), jnp.int32),
            "state": jnp.zeros((n_slots, d), jnp.int32),
            "count": jnp.zeros(n_slots, jnp.int32)}


def _one_slot(algo, params, h, tr, x, keep):
    """One slot's step: (out, hidden, traces, grad) with grad[o] the gradient of out[o]."""
    def f(p):
        out, h2, tr2 = algo._step(p, h, tr, (x,), keep)
        return out, (h2, tr2)
    out, vjp, (h2, tr2) = jax.vjp(f, params, has_aux=True)
    eye = jnp.eye(out.size, dtype=out.dtype)
    grad = jax.vmap(lambda e: vjp(e.reshape(out.shape))[0])(eye)
    return out, h2, tr2, grad


def _put(ring, idx, value, use):
    """ring (N, d, ...) with value (N, ...) at [n, idx[n]] where use[n]: one gather and one
    scatter over (row, index) pairs (a scatter with batch dimensions, as ``vmap`` writes
    it, is one IREE's compiler refuses: ``streamtrace export``)."""
    rows = jnp.arange(ring.shape[0])
    idx = jnp.clip(idx, 0, ring.shape[1] - 1)   # a ring of length 1 (``PairRing``) has its entry at 0
    old = ring[rows, idx]
    return ring.at[rows, idx].set(jnp.where(_lead(use, value), value, old))


class LabelledSteps(StepFunctions):
    """The step functions of ``Supervised(label_delay=d)``: the state has a ``labels`` ring,
    and a step predicts and keeps its gradient there (``delayed_step``)."""

    def init(self, n_slots, x_shape, x_dtype, params=None, y_shape=None, y_dtype=None) -> dict:
        state = super().init(n_slots, x_shape, x_dtype, params=params, y_shape=y_shape, y_dtype=y_dtype)
        p = self.algo.init_state()[0] if params is None else params
        y_shape = tuple(y_shape) if y_shape is not None else self._y_shape
        state["labels"] = init_ring(self.cfg.label_delay, n_slots, p, y_shape, y_dtype or x_dtype)
        return state

    def step(self, state, x, target, active, learn):
        return delayed_step(self, state, x, active, learn)


class PairRing:
    """Per-slot models stepped in pairs (``Programs._in_pairs``): a pair's step gets, in place
    of its slots' rings of gradients, only the entry it writes (a ring of length 1: the step's
    ring index, clamped, is 0 there), which is then written back at the slots' ring index. The
    pair's whole ring is not copied out and back at every step. Other state: ``part``/``put``."""

    def __init__(self, state, size: int):
        self.on, self.size = "labels" in state, size        # size: the slots a pair holds (PAIR)

    def _index(self, lab):
        return jnp.mod(lab["count"], lab["tag"].shape[-1])          # (pair, 1)

    def part(self, state, j, part):
        if not self.on:
            return part(state, j)
        grad = state["labels"]["grad"]
        rest = {**state, "labels": {k: v for k, v in state["labels"].items() if k != "grad"}}
        s = part(rest, j)
        idx = self._index(s["labels"])
        pair = lambda g: jax.lax.dynamic_slice_in_dim(g, j * self.size, self.size, 0)
        entry = {k: jax.vmap(lambda r, i: jax.lax.dynamic_slice_in_dim(r, i[0], 1, 1))(pair(g), idx)
                 for k, g in grad.items()}
        return {**s, "labels": {**s["labels"], "grad": entry}}

    def put(self, state, new, j, old, put):
        if not self.on:
            return jax.tree_util.tree_map(put, state, new)
        grad, idx = state["labels"]["grad"], self._index(old["labels"])
        strip = lambda t: {**t, "labels": {k: v for k, v in t["labels"].items() if k != "grad"}}
        out = jax.tree_util.tree_map(put, strip(state), strip(new))
        rows = jnp.arange(self.size) + j * self.size

        def write(g, e):          # g (N, 1, d, ...), e (size, 1, 1, ...): at [rows, 0, idx]
            return g.at[rows, 0, idx[:, 0]].set(e[:, 0, 0])
        return {**out, "labels": {**out["labels"], "grad": {k: write(g, new["labels"]["grad"][k])
                                                             for k, g in grad.items()}}}


def delayed_step(fns, state, x, active, learn):
    """The supervised step without a target: predict, advance hidden state and traces, and
    keep the step's per-output gradient in the ring (slots that learn). Returns (state,
    prediction, loss (NaN), applied (False))."""
    ok = active & jnp.isfinite(_slot_sum(x))
    x = jnp.where(_lead(ok, x), x, 0)
    params = fns.from_block(state["params"])
    each = jax.vmap(lambda h, tr, x, k: _one_slot(fns.algo, params, h, tr, x, k))
    out, h, tr, grad = each(state["hidden"], state["traces"], x, ok.astype(jnp.float32))
    ok = ok & _carried_finite(h, tr) & jnp.isfinite(_slot_sum(out))
    lab = state["labels"]
    d = lab["tag"].shape[1]
    idx = jnp.mod(lab["count"], d)
    flag = jnp.where(learn & ok, _WAITING, _EMPTY).astype(jnp.int32)
    ring = {"grad": {k: _put(lab["grad"][k], idx, g, active) for k, g in grad.items()},
            "pred": _put(lab["pred"], idx, out.astype(lab["pred"].dtype), active),
            "tag": _put(lab["tag"], idx, lab["count"], active),
            "state": _put(lab["state"], idx, flag, active),
            "count": lab["count"] + active.astype(jnp.int32)}
    state = {**state, "hidden": _slot_where(ok, h, state["hidden"]), "traces": tr, "labels": ring}
    nan = jnp.full(ok.shape, jnp.nan, jnp.result_type(out.dtype, jnp.float32))
    state = fns._finish(state, active & ~ok, jnp.zeros_like(ok), nan)
    return state, out, nan, jnp.bool_(False)


def label_status(lab, slot, age, y):
    """(status, ring index) of a label for the step ``age`` steps before the slot's latest."""
    d = lab["tag"].shape[1]
    want = lab["count"][slot] - 1 - age
    idx = jnp.mod(want, d)
    tag, flag = lab["tag"][slot, idx], lab["state"][slot, idx]
    known = (age >= 0) & (want >= 0) & (tag == want) & (flag != _EMPTY)
    status = jnp.where(age >= d, _LATE, jnp.where(~known, _UNKNOWN, jnp.where(
        flag == _LABELLED, _TWICE, jnp.where(jnp.all(jnp.isfinite(y)), 0, _NAN))))
    return status.astype(jnp.int32), idx


# the state a label may change (the rest, the ring's gradients above all, is only read)
MOVING = ("params", "opt", "acc", "stats")


def apply_label(fns, state, slot, age, y):
    """Apply the label y of the step ``age`` steps before ``slot``'s latest (shared-weight
    form: the ring has a slot axis). Returns (state, status, loss, applied); for a status
    other than 0 the state is returned unchanged. Only ``MOVING`` and the ring's flags change."""
    lab = state["labels"]
    status, idx = label_status(lab, slot, age, y)
    pred = lab["pred"][slot, idx]
    entry = {k: g[slot, idx] for k, g in lab["grad"].items()}
    moving = {**{k: state[k] for k in MOVING if k in state}, "flags": lab["state"]}

    def apply(m):
        loss, ct = jax.value_and_grad(fns.loss_fn)(pred, y.astype(pred.dtype))
        ct = ct.ravel()
        grads = fns.to_block({k: jnp.tensordot(ct.astype(g.dtype), g, axes=1) for k, g in entry.items()})
        new, applied = fns._apply({**state, **m}, grads, jnp.bool_(True))
        stats = dict(new["stats"])
        # one-hot adds and selects, not scatters (``.at[slot]``): IREE's CPU backend refuses a
        # scatter inside a conditional (``streamtrace export``); the same values
        n = stats["preq_sum"].shape[0]
        mine = jnp.arange(n) == slot
        stats["preq_sum"] = stats["preq_sum"] + jnp.where(mine, loss.astype(jnp.float32), 0)
        stats["preq_n"] = stats["preq_n"] + mine.astype(stats["preq_n"].dtype)
        wide = lambda a: jnp.broadcast_to(a, (n,) + a.shape)
        stats["roll"] = fns.rolling.update(stats["roll"], wide(pred), wide(y.astype(pred.dtype)), mine)
        entry_at = mine[:, None] & (jnp.arange(m["flags"].shape[1]) == idx)[None, :]
        out = {**{k: new[k] for k in MOVING if k in m}, "stats": stats,
               "flags": jnp.where(entry_at, _LABELLED, m["flags"]).astype(m["flags"].dtype)}
        return out, loss.astype(pred.dtype), applied

    def refuse(m):
        return m, jnp.zeros((), pred.dtype) + jnp.nan, jnp.bool_(False)
    m, loss, applied = jax.lax.cond(status == 0, apply, refuse, moving)
    flags = m.pop("flags")
    return {**state, **m, "labels": {**lab, "state": flags}}, status, loss, applied
