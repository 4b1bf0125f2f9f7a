"""The numeric pieces every algorithm shares, built on a compiled graph.

* ``forward``: one step plus, for each traced op, its input x and F = dh/dy (..., S), and for
  each hidden group D = dh_t/dh_{t-1} (..., S, S) with paths through marked matmuls cut.
  D and F come from one linearisation of the step and a vmap over a few basis tangents, which
  is exact because the compiler proved those Jacobians diagonal.
* ``backward``: from the cotangents of (output, new hidden) to the learning signal
  g = dL/dh_t per group, the gradients of the non-traced parameters (by backprop through the
  step) and of the inputs.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .graph import ETraceGraph

__all__ = ["forward", "backward", "plain_step", "group_stack", "zeros_like_tree"]


def zeros_like_tree(tree):
    return jax.tree_util.tree_map(_zero_cotangent, tree)


def _zero_cotangent(x):
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, dtype=jax.dtypes.float0)


def group_stack(graph: ETraceGraph, per_hidden: dict) -> list:
    """{hidden name: (...)} -> per group (..., S), state s = group.members[s]."""
    return [jnp.stack([per_hidden[m] for m in g.members], axis=-1) for g in graph.groups]


def plain_step(graph: ETraceGraph, params, hidden, args):
    """The model's own step, every path differentiable (the BPTT view)."""
    return graph.run(params, hidden, args)


def forward(graph: ETraceGraph, params, hidden, args):
    """Returns (out, new_hidden, xs, D, F); xs/F listed per traced relation, D per group."""
    traced = graph.traced_relations
    pos = {r.index: k for k, r in enumerate(traced)}

    def core(h_prev, deltas):
        xs = [None] * len(traced)

        def hook(i, eqn, invals, bind):
            y = bind()
            k = pos.get(i)
            if k is None:
                return y
            xs[k] = invals[0]
            if traced[k].kind == "matmul":
                y = jax.lax.stop_gradient(y)  # the diagonal approximation: cut dh_prev -> x -> y
            return y + deltas[k]

        out, new_h = graph.run(params, h_prev, args, op_hook=hook)
        return new_h, (out, xs)

    deltas0 = [jnp.zeros(r.y_shape, hidden[graph.groups[r.group].members[0]].dtype) for r in traced]
    new_h, lin, (out, xs) = jax.linearize(core, hidden, deltas0, has_aux=True)

    s_max = max(g.size for g in graph.groups)
    where = {m: (g.index, s) for g in graph.groups for s, m in enumerate(g.members)}
    h_tangents, d_tangents = [], []
    for j in range(s_max):   # D: column j of every group at once
        h_tangents.append({n: jnp.full_like(v, 1.0 if where[n][1] == j else 0.0) for n, v in hidden.items()})
        d_tangents.append([jnp.zeros_like(d) for d in deltas0])
    for k in range(len(traced)):  # F: one direction per traced op
        h_tangents.append({n: jnp.zeros_like(v) for n, v in hidden.items()})
        d_tangents.append([jnp.ones_like(d) if i == k else jnp.zeros_like(d) for i, d in enumerate(deltas0)])
    stack = lambda *xs: jnp.stack(xs)
    tan = jax.vmap(lin)(jax.tree_util.tree_map(stack, *h_tangents), jax.tree_util.tree_map(stack, *d_tangents))
    cols = group_stack(graph, tan)  # per group: (T, ..., S)
    D = [jnp.stack([c[j] for j in range(g.size)], axis=-1) for g, c in zip(graph.groups, cols)]
    F = [cols[r.group][s_max + k] for k, r in enumerate(traced)]
    return out, new_h, xs, D, F


def backward(graph: ETraceGraph, params, hidden, args, new_hidden, ct_out, ct_hidden,
             diff_params: tuple, transition_params: tuple):
    """Learning signal and direct gradients.

    diff_params: parameters whose direct path to the output (with the new hidden state held
    fixed) is differentiated. transition_params: those that additionally get the one-step
    path through the transition (instant parameters such as a learnable time constant).
    Returns (g per group (..., S), dparams {name: grad}, dargs).
    """
    fixed = {n: v for n, v in params.items() if n not in diff_params}

    def G(dp, a, hn):
        out, h = graph.run({**fixed, **dp}, hidden, a, override_hidden=hn)
        return out, h

    dp0 = {n: params[n] for n in diff_params}
    (out, _), vjp_g = jax.vjp(G, dp0, args, new_hidden)
    d_out_direct, d_args, g_out = vjp_g((ct_out, zeros_like_tree(new_hidden)))
    g = {n: ct_hidden[n] + g_out[n] for n in graph.hidden_names}
    dparams = dict(d_out_direct)
    # the one-step path through the transition; what the caller does not use, XLA drops
    d_trans, d_args2, _ = vjp_g((zeros_like_tree(out), g))
    for n in transition_params:
        dparams[n] = dparams[n] + d_trans[n]
    d_args = jax.tree_util.tree_map(_add_cotangent, d_args, d_args2)
    return group_stack(graph, g), dparams, d_args


def _add_cotangent(a, b):
    return a if getattr(a, "dtype", None) == jax.dtypes.float0 else a + b
