"""Rollback: a step that would leave a non-finite value in the state is undone.

The step refuses a non-finite gradient, hidden state or loss slot by slot; what a value that
is finite but huge can still do is overflow somewhere else (a float32 model fed 3e38, a
transform's statistics, the experts' averages). ``RolledBack`` checks every small array the
step wrote and, if any holds a value that is not finite, returns the state as it was before
the step, but for its own count of rollbacks per slot. The step's result says so
(``rolled_back``), its loss is NaN and nothing was applied.

What is not read, to keep the check off the step's critical path (measured: bench/glitch_cost.py):

- arrays the step passed through untouched (a frozen reservoir's weights);
- arrays of ``BIG`` values or more (weights, optimizer moments and traces of larger models,
  a readout's matrix): each is kept finite by its own update, value by value (the optimizer
  keeps a value whose update is not finite, ``step._keep_finite`` / ``adam.guarded_step``; the
  traces are guarded inside the step; an RLS readout keeps a slot's matrix whose update is not
  finite). They are left as the step wrote them: a rollback restores the small arrays, which
  are all of a small model's state;
- the small arrays the step keeps finite itself (``GUARDED``: weights, moments, traces; the
  hidden state, counters, scores, screen statistics and an RLS readout's weights, written only
  where their new values are finite) are put back with the rest but not checked: the check
  reads the transforms' statistics, the experts' state and the pending forecast.

Its cost is the gate itself: every small array the step writes waits for the check. On the
GRU learners of the speed targets it is within noise; on the default learner (many small
parts) it is measurable (bench/glitch_cost.py, docs/benchmarks.md).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["RolledBack", "BIG"]

BIG = 2048     # values in an array from which it is left to its own guard (the packed-state cut)
# kept finite by the step itself: weights, moments and traces value by value; a slot's hidden
# state, counters, scores and screen statistics only where their new values are finite
GUARDED = ("params", "opt", "acc", "traces", "hidden", "stats", "screen", "readout")


def _finite(leaves) -> jax.Array:
    """Whether every value of every array is finite: one product with zeros per dtype (any
    NaN or infinity makes it NaN), over the arrays laid end to end."""
    by_dtype = {}
    for a in leaves:
        by_dtype.setdefault(jnp.dtype(a.dtype), []).append(jnp.ravel(a))
    ok = jnp.bool_(True)
    for dt, parts in by_dtype.items():
        v = parts[0] if len(parts) == 1 else jnp.concatenate(parts)
        ok = ok & jnp.isfinite(v @ jnp.zeros(v.shape[0], dt))
    return ok


class RolledBack:
    """A learner's step functions whose step is undone when it leaves a non-finite value in
    its small arrays (see the module). Everything but ``init`` and ``step`` is the wrapped
    functions'."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def init(self, n_slots, x_shape, x_dtype, **kw) -> dict:
        state = self.inner.init(n_slots, x_shape, x_dtype, **kw)
        z = jnp.zeros(n_slots, jnp.int32)
        return {**state, "rollback": {"count": z, "now": z}}

    def step(self, state, x, target, active, learn):
        new, out, loss, applied = self.inner.step(state, x, target, active, learn)
        names = [k for k in new if k not in GUARDED and k != "rollback"]
        checked = [b for a, b in zip(jax.tree_util.tree_leaves([state[k] for k in names]),
                                     jax.tree_util.tree_leaves([new[k] for k in names]))
                   if b is not a and b.size < BIG and jnp.issubdtype(b.dtype, jnp.inexact)]
        ok = _finite(checked) if checked else jnp.bool_(True)
        old_leaves, tree = jax.tree_util.tree_flatten(state)
        kept = [b if b is a or b.size >= BIG else jnp.where(ok, b, a)
                for a, b in zip(old_leaves, tree.flatten_up_to(new))]
        new = jax.tree_util.tree_unflatten(tree, kept)
        undone = (active & ~ok).astype(jnp.int32)
        count = state["rollback"]["count"] + undone
        return {**new, "rollback": {"count": count, "now": undone}}, out, jnp.where(ok, loss, jnp.nan), applied & ok
