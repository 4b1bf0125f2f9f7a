"""ES-D-RTRL / pp-prop: input- and output-dimension traces, O(B (I + O S)) memory per weight.

    xbar_t = a xbar_{t-1} + x_t
    fbar_t = a (D_t @ fbar_{t-1}) + (1 - a) F_t
    dW     = xbar_t^T @ (sum_s g_t[..., s] * fbar_t[..., s])

``a`` in [0, 1) is the decay; ``rank=r`` gives a = (r - 1) / (r + 1). A bias uses x = 1.
Element-wise weights keep their exact D-RTRL trace (already O(O S) in size).
"""
from __future__ import annotations

import jax.numpy as jnp

from .d_rtrl import D_RTRL, decay_diag
from .kernel import sum_s

__all__ = ["ES_D_RTRL", "pp_prop"]


class ES_D_RTRL(D_RTRL):
    name = "es-d-rtrl"

    def __init__(self, model, *example_args, decay: float | None = None, rank: float | None = None, **kw):
        if (decay is None) == (rank is None):
            raise ValueError("give exactly one of decay= (in [0, 1)) or rank= (>= 1)")
        if rank is not None:
            if rank < 1:
                raise ValueError(f"rank must be >= 1; got {rank}")
            decay = (rank - 1.0) / (rank + 1.0)
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay must be in [0, 1); got {decay}")
        self.decay = float(decay)
        super().__init__(model, *example_args, **kw)

    def base_traces(self):
        dtype = next(iter(self.graph.init_hidden().values())).dtype
        tr = {}
        for r in self.graph.traced_relations:
            if r.kind != "matmul":
                w_shape, b_shape = self._trace_shapes(r)
                tr[f"eps.{r.weight}"] = jnp.zeros(w_shape, dtype)
                continue
            lead, O, S = r.y_shape[:-1], r.y_shape[-1], self.graph.groups[r.group].size
            tr[f"xbar.{r.weight}"] = jnp.zeros(lead + (r.x_shape[-1],), dtype)
            tr[f"fbar.{r.weight}"] = jnp.zeros(lead + (O, S), dtype)
            if r.bias:
                tr[f"xbar.{r.bias}"] = jnp.zeros(lead, dtype)
        return tr

    def update_traces(self, traces, xs, D, F):
        a = self.decay
        new = {}
        for r, x, f in zip(self.graph.traced_relations, xs, F):
            d = D[r.group]
            if r.kind != "matmul":
                new[f"eps.{r.weight}"] = decay_diag(d, traces[f"eps.{r.weight}"]) + x[..., None] * f
                continue
            new[f"xbar.{r.weight}"] = a * traces[f"xbar.{r.weight}"] + x
            new[f"fbar.{r.weight}"] = a * decay_diag(d, traces[f"fbar.{r.weight}"]) + (1.0 - a) * f
            if r.bias:
                new[f"xbar.{r.bias}"] = a * traces[f"xbar.{r.bias}"] + 1.0
        return new

    def weight_grads(self, traces, g):
        grads = {}
        for r in self.graph.traced_relations:
            gg = g[r.group]
            if r.kind != "matmul":
                grads[r.weight] = jnp.einsum("...os,...os->o", gg, traces[f"eps.{r.weight}"])
                continue
            fbar = traces[f"fbar.{r.weight}"]
            out_signal = (gg * fbar)[..., 0] if fbar.shape[-1] == 1 else \
                sum_s([gg[..., s] * fbar[..., s] for s in range(fbar.shape[-1])])   # (..., O)
            grads[r.weight] = jnp.einsum("...i,...o->io", traces[f"xbar.{r.weight}"], out_signal)
            if r.bias:
                grads[r.bias] = jnp.einsum("...,...o->o", traces[f"xbar.{r.bias}"], out_signal)
        return grads


pp_prop = ES_D_RTRL
