"""D-RTRL: parameter-dimension eligibility traces (exact when the recurrence is element-wise).

    eps_t[..., i, o, :] = D_t[..., o] @ eps_{t-1}[..., i, o, :] + x_t[..., i] * F_t[..., o, :]
    dW[i, o]            = sum over batch and s of g_t[..., o, s] * eps_t[..., i, o, s]

A bias is a weight whose input is 1; an element-wise weight has no input axis.
"""
from __future__ import annotations

import jax.numpy as jnp

from .algorithm import ETraceVjpAlgorithm
from .kernel import sum_s

__all__ = ["D_RTRL"]


def decay_diag(D, e):
    """Apply each neuron's S x S Jacobian to its trace: (..., O, S, S) x (..., [I,] O, S)."""
    if e.ndim == D.ndim:  # (..., I, O, S): one trace per input unit
        D = D[..., None, :, :, :]
    S = D.shape[-1]
    if S == 1:
        return D[..., 0] * e
    return jnp.stack([sum_s([D[..., s, t] * e[..., t] for t in range(S)]) for s in range(S)], axis=-1)


# slot counts up to this are summed as an unrolled chain of adds (see ``contract``)
UNROLL_SLOTS = 128


def contract(g, e):
    """Sum over batch axes and s of g (..., O, S) * e (..., [I,] O, S) -> ([I,] O).

    One batch axis of up to ``UNROLL_SLOTS`` (the learner's slots) is summed as a chain of
    adds over its entries: XLA fuses that, products included, into one pass over the traces,
    while a reduction over the slot axis first writes every slot's product and then sums it
    in blocks: more than twice as slow at 64 slots (measured, GRU-64 and GRU-256)."""
    n_batch = g.ndim - 2
    if e.ndim > g.ndim:
        g = g[..., None, :, :]
    S = e.shape[-1]

    def prod(gb, eb):   # the S axis as explicit adds: see kernel.sum_s
        return gb[..., 0] * eb[..., 0] if S == 1 else sum_s([gb[..., s] * eb[..., s] for s in range(S)])
    if n_batch == 0:
        return prod(g, e)
    if n_batch == 1 and e.shape[0] <= UNROLL_SLOTS:
        return sum_s([prod(g[b], e[b]) for b in range(e.shape[0])])
    return jnp.sum(prod(g, e), axis=tuple(range(n_batch)))


class D_RTRL(ETraceVjpAlgorithm):
    name = "d-rtrl"
    batched_grads = True

    def _trace_shapes(self, r):
        g = self.graph.groups[r.group]
        lead, O, S = r.y_shape[:-1], r.y_shape[-1], g.size
        w = lead + ((r.x_shape[-1], O, S) if r.kind == "matmul" else (O, S))
        return w, lead + (O, S)

    def base_traces(self):
        dtype = next(iter(self.graph.init_hidden().values())).dtype
        tr = {}
        for r in self.graph.traced_relations:
            w_shape, b_shape = self._trace_shapes(r)
            tr[f"eps.{r.weight}"] = jnp.zeros(w_shape, dtype)
            if r.bias:
                tr[f"eps.{r.bias}"] = jnp.zeros(b_shape, dtype)
        return tr

    def update_traces(self, traces, xs, D, F):
        new = {}
        for r, x, f in zip(self.graph.traced_relations, xs, F):
            d = D[r.group]
            x_term = x[..., :, None, None] * f[..., None, :, :] if r.kind == "matmul" else x[..., None] * f
            new[f"eps.{r.weight}"] = decay_diag(d, traces[f"eps.{r.weight}"]) + x_term
            if r.bias:
                new[f"eps.{r.bias}"] = decay_diag(d, traces[f"eps.{r.bias}"]) + f
        return new

    def weight_grads(self, traces, g):
        grads = {}
        for r in self.graph.traced_relations:
            gg = g[r.group]
            grads[r.weight] = contract(gg, traces[f"eps.{r.weight}"])
            if r.bias:
                grads[r.bias] = contract(gg, traces[f"eps.{r.bias}"])
        return grads
