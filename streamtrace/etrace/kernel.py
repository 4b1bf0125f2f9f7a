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

__all__ = ["forward", "backward", "plain_step", "group_stack", "zeros_like_tree", "sum_s"]


def sum_s(terms):
    """Sum a short list of arrays. The S axis of a group is tiny (1-3): summing it as an
    explicit chain of adds keeps XLA from emitting a reduction over a minor axis of size 2,
    which its CPU reduction kernels run 5x slower than the whole rest of an LSTM step."""
    acc = terms[0]
    for t in terms[1:]:
        acc = acc + t
    return acc


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
    """One step with its local Jacobians: (out, new_hidden, xs, D, F, P).

    xs, F: per traced relation. D: per group (..., S, S). P: per group with S > 1, the
    within-step chain between its states, P[..., i, j] = d h_i,t / d h_j,t (identity plus the
    element-wise paths from state j's new value to state i's, e.g. LSTM c_t -> h_t); None for
    S = 1. All with paths through traced matmuls cut.
    """
    traced = graph.traced_relations
    pos = {r.index: k for k, r in enumerate(traced)}
    # fixed weights driving a group get no trace, but the diagonal approximation cuts them too
    cut_only = {r.index for r in graph.relations if r.fixed and r.cut and r.kind == "matmul"}

    def core(h_prev, deltas, e):
        xs = [None] * len(traced)

        def hook(i, eqn, invals, bind):
            y = bind()
            k = pos.get(i)
            if k is None:
                return jax.lax.stop_gradient(y) if i in cut_only else y
            xs[k] = invals[0]
            if traced[k].kind == "matmul":
                y = jax.lax.stop_gradient(y)  # the diagonal approximation: cut dh_prev -> x -> y
            return y + deltas[k]

        out, new_h = graph.run(params, h_prev, args, op_hook=hook, hidden_hook=lambda n, v: v + e[n])
        return new_h, (out, xs)

    zeros_h = {n: jnp.zeros_like(v) for n, v in hidden.items()}
    deltas0 = [jnp.zeros(r.y_shape, hidden[graph.groups[r.group].members[0]].dtype) for r in traced]
    new_h, lin, (out, xs) = jax.linearize(core, hidden, deltas0, zeros_h, has_aux=True)

    s_max = max(g.size for g in graph.groups)
    slot = {m: s for g in graph.groups for s, m in enumerate(g.members)}
    basis = lambda j: {n: jnp.full_like(v, 1.0 if slot[n] == j else 0.0) for n, v in hidden.items()}
    no_deltas = [jnp.zeros_like(d) for d in deltas0]
    # tangent directions: D columns (state j of every group at once), F (one per op), P columns
    directions = [(basis(j), no_deltas, zeros_h) for j in range(s_max)]
    directions += [(zeros_h, [jnp.ones_like(d) if i == k else jnp.zeros_like(d) for i, d in enumerate(deltas0)],
                    zeros_h) for k in range(len(traced))]
    if s_max > 1:
        directions += [(zeros_h, no_deltas, basis(j)) for j in range(s_max)]
    # one application of the linear map per direction, not a vmap over them: a vmap stacks the
    # directions on an axis of one expression, and XLA:CPU fuses that expression, sliced, into
    # every trace update, which then runs ~4x slower (GRU-64 D-RTRL, 64 slots: 1.8x its limit)
    cols = [group_stack(graph, lin(*d)) for d in directions]  # per direction, per group: (..., S)
    D = [jnp.stack([cols[j][gi] for j in range(g.size)], axis=-1) for gi, g in enumerate(graph.groups)]
    F = [cols[s_max + k][r.group] for k, r in enumerate(traced)]
    p0 = s_max + len(traced)
    P = [jnp.stack([cols[p0 + j][gi] for j in range(g.size)], axis=-1) if g.size > 1 else None
         for gi, g in enumerate(graph.groups)]
    return out, new_h, xs, D, F, P


def partial_signal(g_total: list, P: list) -> list:
    """Remove the within-step chains between a group's states from the learning signal.

    The traces already carry them (F and D are total derivatives through the step), so the
    signal must be the partial derivative: g_partial = P^-T g_total, per neuron. The chains
    follow the order in which the step computes the states, so P = I + N with N nilpotent
    (N^S = 0) and P^-T g = sum_k (-N^T)^k g for k < S: a few element-wise products instead of
    a batched LAPACK solve per neuron (which is slow under vmap on CPU).
    """
    out = []
    for g, p in zip(g_total, P):
        if p is None:
            out.append(g)
            continue
        S = p.shape[-1]
        neg_nt = jnp.eye(S, dtype=p.dtype) - jnp.swapaxes(p, -1, -2)   # -N^T
        term, acc = g, g
        for _ in range(S - 1):
            term = jnp.stack([sum_s([neg_nt[..., i, j] * term[..., j] for j in range(S)]) for i in range(S)],
                             axis=-1)
            acc = acc + term
        out.append(acc)
    return out


def backward(graph: ETraceGraph, params, hidden, args, ct_out, ct_hidden, diff_params: tuple,
             cut_hidden: bool = False, slots: bool = False):
    """Learning signal and direct gradients, by one VJP of the step.

    The new hidden values get an additive perturbation e (zero); g = dL/de is the learning
    signal dL/dh_t, including paths inside the step (a lower layer's new state feeding an
    upper layer's, then the output). ``diff_params`` get their one-step gradient along every
    path with the previous state held fixed. With ``cut_hidden`` the new state is treated as
    an independent variable (stop-gradient + e): g and the parameter gradients then only hold
    the paths from h_t onward / not through h_t, as exact RTRL needs.
    With ``slots`` hidden, args and the cotangents carry a leading slot axis (params shared):
    the VJP is taken of the step vmapped over the slots, so the shared parameters' gradients
    come out summed over the slots as one contraction (x^T g) instead of one outer product per
    slot that is then summed.
    Returns (g per group (..., S), dparams {name: grad}, dargs).
    """
    fixed = {n: v for n, v in params.items() if n not in diff_params}

    def one(dp, h, a, e):
        if cut_hidden:
            hook = lambda n, v: jax.lax.stop_gradient(v) + e[n]
        else:
            hook = lambda n, v: v + e[n]
        return graph.run({**fixed, **dp}, h, a, hidden_hook=hook)

    run = jax.vmap(one, in_axes=(None, 0, 0, 0)) if slots else one
    dp0 = {n: params[n] for n in diff_params}
    _, vjp_g = jax.vjp(lambda dp, a, e: run(dp, hidden, a, e), dp0, args, zeros_like_tree(hidden))
    dparams, dargs, g = vjp_g((ct_out, ct_hidden))
    return group_stack(graph, g), dparams, dargs
