"""Rollback: a step that would leave a non-finite value in the state is undone.

The step refuses a non-finite gradient, hidden state or loss slot by slot; what a value that
is finite but huge can still do is overflow somewhere else (a float32 model fed 3e38, a
transform's statistics, the experts' averages). After every step, ``gate`` checks the state
the step wrote and, if any value is not finite, puts back the state as it was before the step,
bit for bit, but for its own count of rollbacks (``rollback.count`` per slot). The step's
result says so (``rolled_back``), its loss is NaN and nothing was applied.

The check runs on the state as it crosses the compiled call: the small arrays packed into one
buffer per dtype (``packing.Layout``), one reduction and one select each. Arrays of
``Layout.standalone`` values or more (weights, optimizer moments and traces of larger models, a
readout's matrix) are left as the step wrote them: each is kept finite by its own update,
value by value (the optimizer keeps a value whose update is not finite, the traces are guarded
inside the step, an RLS readout keeps a slot's matrix whose update is not finite). Checked
per element of the state (weights and all) where it was written, the gate cost the default
learner's step up to 1.3x; on the packed buffers it is within noise (bench/glitch_cost.py).

A call steps all its slots at once, so a rollback undoes every slot's step of that call (with
per-stream models the engine steps one slot a call, so only the bad stream's step is undone).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["init", "gate", "gate_buffers"]


def init(n_slots: int) -> dict:
    """The rollback counters of ``n_slots`` slots: in total and of the last step."""
    z = jnp.zeros(n_slots, jnp.int32)
    return {"count": z, "now": z}


def _finite(buffers) -> jax.Array:
    """Whether every value of every float buffer is finite: a product with zeros (any NaN or
    infinity makes it NaN), one per buffer."""
    ok = jnp.bool_(True)
    for b in buffers:
        if jnp.issubdtype(b.dtype, jnp.inexact):
            v = jnp.ravel(b)
            ok = ok & jnp.isfinite(v @ jnp.zeros(v.shape[0], v.dtype))
    return ok


def _put(flat, at: int, value):
    """``flat`` with ``value`` written from ``at`` on (static offsets: slices laid end to end,
    which every backend compiles; IREE refused the scatter that ``.at[].set`` becomes)."""
    return jnp.concatenate([flat[:at], value, flat[at + value.shape[0]:]])


def gate_buffers(layout, before: tuple, after: tuple, active):
    """``gate`` on packed buffers (``layout.pack``'s): (buffers, undone). Where a call's state
    crosses as buffers (a one-step program), the check and the select are one pass over each
    small buffer, and the counters are written into the packed int32 buffer in place."""
    n = len(layout.dtypes)
    ok = _finite(after[:n])
    # the flag spread over each buffer: a select on one scalar flag is, for IREE (streamtrace
    # export), a choice between two buffers that the host makes, reading the flag back and
    # waiting for the device mid-step; per value it is one more elementwise select
    out = [jnp.where(jnp.broadcast_to(ok, b.shape), b, a) for a, b in zip(before[:n], after[:n])]
    slots = {s.name: s for s in layout.slots}
    count, now = slots["rollback.count"], slots["rollback.now"]
    undone = (active & ~ok).astype(jnp.int32)
    flat = out[count.buffer].reshape(-1)
    rows = out[count.buffer].shape
    c0, n0 = layout.offset(count), layout.offset(now)
    flat = _put(flat, c0, flat[c0:c0 + count.size] + undone.astype(flat.dtype))
    flat = _put(flat, n0, undone.astype(flat.dtype))
    out[count.buffer] = flat.reshape(rows)
    return tuple(out) + tuple(after[n:]), undone


def gate(layout, before: dict, after: dict, active):
    """(state, undone): ``after`` (the state a step wrote), or, where any value of the arrays
    the layout packs (the small ones) is not finite, ``before`` (the state it started from)
    with the rollback counted for the ``active`` slots (N,). ``undone`` (N,) int32: 1 for a slot
    whose step was undone. On the state tree, for steps inside a scan or loop (also of a few
    gathered slots, whose arrays are not the layout's shapes): the packed leaves are chosen by
    position."""
    alone = set(layout.alone)
    old, tree = jax.tree_util.tree_flatten(before)
    new = tree.flatten_up_to(after)
    small = [i for i in range(len(old)) if i not in alone]
    by_dtype = {}          # in the leaves' order: the same program from run to run
    for i in small:
        if jnp.issubdtype(new[i].dtype, jnp.inexact):
            by_dtype.setdefault(new[i].dtype, []).append(jnp.ravel(new[i]))
    ok = _finite([jnp.concatenate(parts) for parts in by_dtype.values()])
    keep = set(small)
    kept = [jnp.where(ok, b, a) if i in keep and b is not a else b for i, (a, b) in enumerate(zip(old, new))]
    kept = jax.tree_util.tree_unflatten(tree, kept)
    rb = before["rollback"]
    undone = (active & ~ok).astype(jnp.int32).reshape(rb["now"].shape)
    return {**kept, "rollback": {"count": rb["count"] + undone, "now": undone}}, undone.reshape(-1)
