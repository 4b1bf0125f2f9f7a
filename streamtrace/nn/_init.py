"""Parameter and state initialisation shared by the layers."""
from __future__ import annotations

import brainstate
import jax
import jax.numpy as jnp


def key_or_new(key):
    # brainstate's key stream is the ecosystem's convention; pass `key` for reproducible weights.
    return brainstate.random.split_key() if key is None else key


def uniform(key, shape, fan_in, dtype=None):
    bound = 1.0 / jnp.sqrt(fan_in)
    dtype = dtype or jnp.result_type(float)
    return jax.random.uniform(key, shape, dtype, -bound, bound)


def zeros_state(size, batch_size, dtype=None):
    shape = (size,) if batch_size is None else (batch_size, size)
    return brainstate.HiddenState(jnp.zeros(shape, dtype or jnp.result_type(float)))
