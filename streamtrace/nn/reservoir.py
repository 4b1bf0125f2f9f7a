"""An echo-state reservoir: a leaky tanh network whose output is its state (the features a
readout such as ``streamtrace.learner.rls`` reads), with the knobs reservoirpy users know.

    u_t = tanh(x_t W_in + b + h_{t-1} W),   h_t = (1 - leak) h_{t-1} + leak u_t

Both weights act through marked ops, so the same module serves as a fixed reservoir
(``optimizer=st.frozen()``) or as a recurrent network whose weights learn through eligibility
traces (the hybrid): D-RTRL keeps the leak exactly and cuts the dense W path.
"""
from __future__ import annotations

import brainstate
import jax.numpy as jnp
import numpy as np

from . import ops
from ._init import zeros_state

__all__ = ["Reservoir"]


class Reservoir(brainstate.nn.Module):
    """``n_units`` leaky tanh units; ``update(x)`` returns the new state (n_units,).

    spectral_radius: of W (sparse normal, ``density`` of non-zeros), scaled after drawing;
    input_scaling / bias_scaling: W_in and b drawn uniform in +-scaling; seed: numpy seed.
    """
    kind = "reservoir"     # as a Stack names its kind (config: model.stack)


    def __init__(self, n_in: int, n_units: int, *, leak: float = 1.0, spectral_radius: float = 0.9,
                 input_scaling: float = 0.3, bias_scaling: float = 0.5, density: float = 0.1, seed: int = 0):
        super().__init__()
        for name, v in (("n_in", n_in), ("n_units", n_units)):
            if not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"{name} must be a positive integer; got {v!r}")
        if not 0.0 < leak <= 1.0:
            raise ValueError(f"leak must be in (0, 1]; got {leak}")
        if not 0.0 < density <= 1.0:
            raise ValueError(f"density must be in (0, 1]; got {density}")
        if spectral_radius < 0 or input_scaling < 0 or bias_scaling < 0:
            raise ValueError("spectral_radius, input_scaling and bias_scaling must be >= 0")
        rng = np.random.default_rng(seed)
        w = rng.standard_normal((n_units, n_units)) * (rng.random((n_units, n_units)) < density)
        radius = np.max(np.abs(np.linalg.eigvals(w))) if n_units > 1 else abs(w[0, 0])
        if radius > 0:
            w *= spectral_radius / radius
        dtype = jnp.result_type(float)
        self.n_units, self.leak = n_units, float(leak)
        self.W_in = brainstate.ParamState(jnp.asarray(rng.uniform(-1, 1, (n_in, n_units)) * input_scaling, dtype))
        self.b = brainstate.ParamState(jnp.asarray(rng.uniform(-1, 1, n_units) * bias_scaling, dtype))
        self.W = brainstate.ParamState(jnp.asarray(w, dtype))

    def init_state(self, batch_size=None, **kwargs):
        self.h = zeros_state(self.n_units, batch_size)

    def update(self, x):
        h = self.h.value
        u = jnp.tanh(ops.matmul(x, self.W_in.value, self.b.value) + ops.matmul(h, self.W.value))
        self.h.value = h + self.leak * (u - h) if self.leak != 1.0 else u
        return self.h.value
