"""Exact RTRL: the full sensitivity M_t = dh_t/dtheta, O(n_h * n_theta) memory.

    M_t = (dh_t/dh_{t-1}) M_{t-1} + dh_t/dtheta      (all paths, nothing cut)
    dL_t/dtheta = g_t . M_t + (direct path from theta to the output)

For small models only; it is the gold standard the approximations are measured against.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from .algorithm import ETraceVjpAlgorithm

__all__ = ["RTRL"]


class RTRL(ETraceVjpAlgorithm):
    name = "rtrl"

    @property
    def traced_params(self):
        return self.graph.param_names

    def _direct_params(self):
        return self.graph.param_names

    cut_hidden = True  # M_t already holds every path into h_t

    def base_traces(self):
        h, _ = ravel_pytree(self.graph.init_hidden())
        p, _ = ravel_pytree(self.graph.init_params())
        return {"M": jnp.zeros((h.size, p.size), h.dtype)}

    def learning_signal(self, g, residual):
        return g  # with the new state cut, g already is the partial derivative

    def _forward(self, params, hidden, traces, args):
        flat_h, unravel_h = ravel_pytree(hidden)
        flat_p, unravel_p = ravel_pytree(params)

        def T(fh, fp):
            out, new_h = self.graph.run(unravel_p(fp), unravel_h(fh), args)
            return ravel_pytree(new_h)[0], (out, new_h)

        (J_h, J_p), (out, new_h) = jax.jacfwd(T, argnums=(0, 1), has_aux=True)(flat_h, flat_p)
        M = J_h @ traces["M"] + J_p
        return out, new_h, self.signal.forward({**traces, "M": M}), None

    def weight_grads(self, traces, g):
        per_hidden = {m: gg[..., s] for grp, gg in zip(self.graph.groups, g)
                      for s, m in enumerate(grp.members)}
        flat_g, _ = ravel_pytree(per_hidden)
        _, unravel_p = ravel_pytree(self.graph.init_params())
        return unravel_p(flat_g @ traces["M"])
