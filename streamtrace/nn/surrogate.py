"""Spike function with a surrogate gradient."""
from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["spike"]


@jax.custom_jvp
def spike(v):
    """Heaviside step of ``v`` (1.0 where v > 0) with a fast-sigmoid surrogate derivative."""
    return (v > 0).astype(v.dtype)


@spike.defjvp
def _spike_jvp(primals, tangents):
    (v,), (dv,) = primals, tangents
    # SuperSpike / fast-sigmoid derivative, scale 4: bounded and smooth around threshold.
    surrogate = 1.0 / (1.0 + 4.0 * jnp.abs(v)) ** 2
    return spike(v), surrogate * dv
